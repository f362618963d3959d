"""The scheduler's HTTP port: the cluster's Prometheus metrics, a JSON snapshot, a dashboard.

``paramserver scheduler --http-port P`` (``LocalCluster(http_port=P)``, ``paramserver
train --dashboard [P]``; 0: any free port) serves, on 127.0.0.1 unless ``--http-host``
says otherwise:

    /metrics      the cluster's aggregate (``metrics.py``), fetched from the servers when
                  scraped
    /api/state    the same numbers as JSON, with a history of rates: what the dashboard
                  and ``paramserver top`` draw
    /             the dashboard (``dashboard/``: one page, its script and no dependency)

The observer reaches the cluster as a driver client of its own scheduler (the address it
listens at), made once the ring has formed; until then the snapshot says ``starting``.
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from paramserver.config import load_config
from paramserver.errors import ConfigError, ConnectError
from paramserver.observe.metrics import Family, WireCollector, aggregate, total
from paramserver.wire.security import authorized, http_token, load_keys

logger = logging.getLogger(__name__)

HISTORY = 600  # rate points kept (one a snapshot, at most two a second: 5 minutes or more)
STRAGGLER = 0.5  # a worker below this share of the median examples/s is marked a straggler
ASSETS = {"/": ("index.html", "text/html; charset=utf-8"), "/app.js": ("app.js", "text/javascript"),
          "/style.css": ("style.css", "text/css")}


@dataclass
class Snapshot:
    """What the cluster reported at ``at``: metric families, servers, ring, workers."""

    at: float
    families: list[Family] = field(default_factory=list)
    servers: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    ring: dict[str, Any] = field(default_factory=dict)
    job: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    staleness: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    state: str = "starting"

    def scheduler_samples(self) -> list[tuple[str, str, str, float]]:
        job = self.job
        return [("paramserver_servers", "gauge", "servers on the ring", len(self.servers)),
                ("paramserver_workers", "gauge", "workers registered", len(self.workers)),
                ("paramserver_failovers", "counter", "servers that died and were failed over",
                 len(job.get("failovers") or [])),
                ("paramserver_data_losses", "counter", "servers that died holding vnodes with no backup",
                 len(job.get("losses") or [])),
                ("paramserver_ring_moves", "counter", "ring changes (joins, leaves, failovers) so far",
                 self.ring.get("moves", 0)),
                ("paramserver_migrating", "gauge", "1 while vnodes are being copied", int(self.ring.get("migrating",
                                                                                                       False))),
                ("paramserver_shards_done", "gauge", "the job's shards done this epoch", job.get("shards_done", 0)),
                ("paramserver_shards_queued", "gauge", "the job's shards not yet handed out",
                 job.get("shards_queued", 0)),
                ("paramserver_examples", "counter", "examples the job trained (shards done and in progress)",
                 self.totals.get("examples", 0.0)),
                ("paramserver_examples_per_second", "gauge", "the job's examples a second, lately",
                 self.totals.get("examples_per_s", 0.0))]

    def wire(self) -> list[Family]:
        """The servers' families summed, the scheduler's, and each worker's examples/s."""
        out = list(self.families)
        for name, kind, doc, value in self.scheduler_samples():
            out.append([name, kind, doc, [[name + ("_total" if kind == "counter" else ""), {}, float(value)]]])
        name = "paramserver_worker_examples_per_second"
        out.append([name, "gauge", "each worker's examples a second, lately",
                    [[name, {"worker": str(w["id"])}, float(w.get("examples_per_s", 0.0))] for w in self.workers]])
        return out + progressive_families(self.job.get("progressive"))

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "state": self.state, "servers": self.servers, "workers": self.workers,
                "ring": self.ring, "job": self.job, "events": self.events, "staleness": self.staleness,
                "totals": self.totals}


def progressive_families(pv: dict[str, Any] | None) -> list[Family]:
    """Progressive validation (each example scored before the model trained on it) as
    gauges by window: the last examples, the last seconds, the whole run; and the trend."""
    if not pv:
        return []
    windows = (("examples", pv["window_examples"]), ("seconds", pv["window_seconds"]), ("all", pv["all"]))
    out: list[Family] = []
    for metric, doc in (("logloss", "log loss"), ("auc", "AUC")):
        name = f"paramserver_progressive_{metric}"
        out.append([name, "gauge", f"the {doc} of examples scored before training on them, by window",
                    [[name, {"window": w}, float(v[metric])] for w, v in windows if v[metric] is not None]])
        name = f"paramserver_progressive_{metric}_trend"
        trend = pv["trend"][metric]
        out.append([name, "gauge", f"the last seconds' progressive {doc} minus the window's before",
                    [[name, {}, float(trend)]] if trend is not None else []])
    return out


STALENESS_BINS = ((0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, None))


def bucketed(seen: dict[int, int]) -> list[dict[str, Any]]:
    """Pulls by staleness, in bins that double (0, 1, 2-3, 4-7, ... 64+)."""
    out = []
    for lo, hi in STALENESS_BINS:
        label = str(lo) if lo == hi else f"{lo}+" if hi is None else f"{lo}-{hi}"
        out.append({"label": label, "count": sum(v for k, v in seen.items() if k >= lo and (hi is None or k <= hi))})
    return out


class Observer:
    """The HTTP side of a scheduler (see the module)."""

    def __init__(self, scheduler: str, host: str = "127.0.0.1", port: int | None = 0, secret_file: str = ""):
        self.scheduler, self.secret_file = scheduler, secret_file
        self.token = http_token(load_keys(secret_file)) if secret_file else ""
        self._client: Any = None
        self._lock = threading.Lock()
        self.history: deque[dict[str, float]] = deque(maxlen=HISTORY)
        self._last: Snapshot | None = None
        self.registry = CollectorRegistry()
        self.registry.register(WireCollector(lambda: self.snapshot().wire()))
        observer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                observer.handle(self)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                logger.debug("http: " + format, *args)

        self.httpd: ThreadingHTTPServer | None = None
        self.url = ""
        if port is None:  # the snapshots only (a scheduler's --metrics-port without --http-port)
            return
        try:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError(f"--http-port {port}: cannot listen on {host}:{port} ({exc.strerror}); pick a free "
                              "port, or 0 for any") from None
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}/"
        threading.Thread(target=self.httpd.serve_forever, name="paramserver-http", daemon=True).start()
        logger.info("dashboard at %s, metrics at %smetrics", self.url, self.url)

    def close(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        if self._client is not None:
            self._client.close()

    # ---- HTTP ------------------------------------------------------------------------
    def handle(self, request: BaseHTTPRequestHandler) -> None:
        path, _, query = request.path.partition("?")
        if path not in ASSETS and not authorized(query, request.headers, self.token):  # the page holds no data
            request.send_error(401, "this cluster has a secret: pass ?token=T or Authorization: Bearer T "
                                    "(paramserver.wire.security.http_token of the cluster's key file)")
            return
        try:
            if path == "/metrics":
                body, kind = generate_latest(self.registry), CONTENT_TYPE_LATEST
            elif path == "/api/state":
                snap = self.snapshot()
                body, kind = json.dumps({**snap.to_json(), "history": list(self.history)}).encode(), \
                    "application/json"
            elif path in ASSETS:
                name, kind = ASSETS[path]
                body = resources.files("paramserver.dashboard").joinpath(name).read_bytes()
            else:
                request.send_error(404, f"no page {path}: try /, /metrics or /api/state")
                return
        except Exception as exc:  # the cluster went away mid-scrape: say so, keep serving
            logger.debug("http %s failed", path, exc_info=True)
            request.send_error(503, f"the cluster did not answer: {type(exc).__name__}: {exc}")
            return
        request.send_response(200)
        request.send_header("Content-Type", kind)
        request.send_header("Content-Length", str(len(body)))
        request.send_header("Cache-Control", "no-store")
        request.end_headers()
        request.wfile.write(body)

    # ---- the cluster's state -----------------------------------------------------------
    def client(self) -> Any:
        """A driver client of this scheduler (made once its ring has formed: the scheduler
        answers a driver's registration then)."""
        if self._client is None:
            from paramserver.client.client import Client

            self._client = Client(role="driver", config=load_config(scheduler=self.scheduler, connect_timeout_s=2.0,
                                                                    secret_file=self.secret_file or None))
        return self._client

    def snapshot(self) -> Snapshot:
        with self._lock:  # one scrape at a time: rates need an order
            snap = self._fetch()
            self._rates(snap)
            self._last = snap
            return snap

    def _fetch(self) -> Snapshot:
        snap = Snapshot(at=time.time())
        try:
            client = self.client()
        except ConnectError:  # no ring yet: the cluster is starting
            return snap
        info = client.admin.cluster_info()
        if "ring" not in info:
            return snap
        snap.state = "running"
        stats = client.stats.server_stats(samples=True)
        snap.job = client.job.status() or {}
        snap.families = aggregate([(int(s["node_id"]), s.get("samples") or []) for s in stats])
        owners = client.admin.ring.owners  # cluster_info applied the ring it carries
        per_server = {int(s): int((owners == int(s)).sum()) for s in info["ring_servers"]}
        snap.ring = {"version": info["ring_version"], "servers": [int(s) for s in info["ring_servers"]],
                     "vnodes": per_server, "owners": owners.tolist(), "migrating": info.get("migrating", False),
                     "queued_changes": info.get("queued_changes", 0), "moves": info.get("ring_moves", 0)}
        snap.events = info.get("events", [])
        addresses = info.get("servers", {})
        for s in sorted(stats, key=lambda s: int(s["node_id"])):
            sid = int(s["node_id"])
            fams = s.get("samples") or []
            tables = s.get("tables", {})
            snap.servers.append({
                "id": sid, "address": addresses.get(str(sid), ""),
                "keys": sum(t["keys"] for t in tables.values()), "bytes": sum(t["bytes"] for t in tables.values()),
                "vnodes": per_server.get(sid, 0), "rss_bytes": s.get("rss_bytes", 0),
                "push_keys": total(fams, "paramserver_push_keys_total"),
                "pull_keys": total(fams, "paramserver_pull_keys_total"),
                "requests": total(fams, "paramserver_push_requests_total")
                + total(fams, "paramserver_pull_requests_total")})
        seen: dict[int, int] = {}
        for s in stats:
            for k, v in (s.get("consistency") or {}).get("staleness_histogram", {}).items():
                seen[int(k)] = seen.get(int(k), 0) + int(v)
        snap.staleness = bucketed(seen)
        ranks = info.get("workers", {})
        per_worker = snap.job.get("per_worker", {})
        for wid in sorted(set(ranks) | set(per_worker), key=int):
            w = per_worker.get(wid, {})
            snap.workers.append({"id": int(wid), "rank": ranks.get(wid), "examples": w.get("examples", 0),
                                 "shards_done": w.get("shards_done", 0), "alive": wid in ranks})
        live = snap.job.get("live", {})
        snap.totals = {"push_keys": total(snap.families, "paramserver_push_keys_total"),
                       "pull_keys": total(snap.families, "paramserver_pull_keys_total"),
                       "examples": float(live.get("examples", 0.0)),
                       "wire_bytes_in": float(live.get("wire_bytes_in", 0.0)),
                       "wire_bytes_out": float(live.get("wire_bytes_out", 0.0))}
        if snap.job:
            snap.job["shards_queued"] = max(0, int(snap.job.get("shards", 0)) - int(snap.job.get("shards_done", 0))
                                            - int(snap.job.get("running", 0)))
        return snap

    def _rates(self, snap: Snapshot) -> None:
        """Rates since the last snapshot: the cluster's, each server's and each worker's."""
        last = self._last
        dt = snap.at - last.at if last is not None else 0.0
        if last is None or dt <= 0 or last.state != "running":
            for w in snap.workers:
                w["examples_per_s"] = 0.0
            for s in snap.servers:
                s["keys_per_s"] = 0.0
            snap.totals["examples_per_s"] = 0.0
            return
        before = {s["id"]: s for s in last.servers}
        for s in snap.servers:
            b = before.get(s["id"])
            s["keys_per_s"] = max(0.0, (s["push_keys"] + s["pull_keys"] - (b["push_keys"] + b["pull_keys"])) / dt) \
                if b else 0.0
        mean = statistics.fmean([s["keys_per_s"] for s in snap.servers]) if snap.servers else 0.0
        for s in snap.servers:
            s["hot"] = mean > 0 and s["keys_per_s"] > 1.5 * mean
        wbefore = {w["id"]: w for w in last.workers}
        for w in snap.workers:
            b = wbefore.get(w["id"])
            w["examples_per_s"] = max(0.0, (w["examples"] - b["examples"]) / dt) if b else 0.0
        active = [w["examples_per_s"] for w in snap.workers if w["alive"] and w["examples_per_s"] > 0]
        median = statistics.median(active) if active else 0.0
        for w in snap.workers:
            w["straggler"] = bool(w["alive"] and median > 0 and len(active) > 1 and w["examples_per_s"]
                                  < STRAGGLER * median)
        t = snap.totals
        t["examples_per_s"] = max(0.0, (t["examples"] - last.totals.get("examples", 0.0)) / dt)
        t["push_keys_per_s"] = max(0.0, (t["push_keys"] - last.totals.get("push_keys", 0.0)) / dt)
        t["pull_keys_per_s"] = max(0.0, (t["pull_keys"] - last.totals.get("pull_keys", 0.0)) / dt)
        self.history.append({"at": snap.at, "examples_per_s": t["examples_per_s"],
                             "push_keys_per_s": t["push_keys_per_s"], "pull_keys_per_s": t["pull_keys_per_s"]})
