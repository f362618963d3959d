"""Prometheus metrics: a server's counters, and the scheduler's view of the whole cluster.

A server counts in plain numbers on its hot path (``ServerMetrics``, a few additions a
request, no import of prometheus-client unless metrics are served): request counters per
table, bytes per table and op, a latency histogram per op, and, read when asked, its
keys, bytes and vnodes, its memory, parked pulls and the staleness of the pulls it
answered.  A request is counted once it has been handled and before its reply is sent, so
a client that has its reply sees the counters moved.

The families travel as plain data (``wire()``: ``[name, type, help, [[sample, labels,
value], ...]]``) in each server's ``STATS`` reply, and become prometheus-client metric
families where they are exposed:
- ``--metrics-port P`` (``PARAMSERVER_METRICS_PORT``; 0: any free port) serves a node's
  own on ``http://HOST:P/metrics``;
- the scheduler's HTTP port (``--http-port``, ``observe.py``) serves the cluster's
  aggregate at ``/metrics``: every server's counters and histograms summed
  (``paramserver_push_keys_total{table}`` is the keys pushed to the cluster), its gauges
  labelled with the ``server``, and the scheduler's own (failovers, ring moves, workers,
  shards, examples/s).  It asks the servers when scraped, so it is as fresh as they are.

Names follow Prometheus' conventions: ``_total`` counters, ``_seconds`` and ``_bytes`` units.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
STALENESS_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64)
OPS = {"push": "pushes", "pull": "pulls", "step": "steps"}  # an op, and what its requests are called

Family = list[Any]  # [name, type, help, [[sample name, labels, value], ...]]


class ServerMetrics:
    """A server's request counters and latency; ``state()`` gives what is read when asked
    (``tables``: keys/bytes/vnodes a table, ``rss_bytes``, ``consistency``)."""

    def __init__(self, state: Callable[[], dict[str, Any]]):
        self.state = state
        self.counts: dict[tuple[str, str], list[float]] = {}  # (op, table) -> [keys, requests, bytes]
        self.latency: dict[str, list[float]] = {}  # op -> counts a bucket (+Inf last), then the sum

    def request(self, op: str, table: str, keys: int, nbytes: int, seconds: float) -> None:
        """Count one handled push, pull or step (``op``) of ``keys`` keys."""
        c = self.counts.get((op, table))
        if c is None:
            c = self.counts[(op, table)] = [0.0, 0.0, 0.0]
        c[0] += keys
        c[1] += 1
        c[2] += nbytes
        self.observe(op, seconds)

    def observe(self, op: str, seconds: float) -> None:
        """A request of ``op`` took ``seconds`` to handle."""
        h = self.latency.get(op)
        if h is None:
            h = self.latency[op] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        h[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        h[-1] += seconds

    def wire(self, state: dict[str, Any] | None = None) -> list[Family]:
        """Every family, as plain data (see the module); ``state``: ``state()`` if read already."""
        out: list[Family] = []
        for op, plural in OPS.items():
            for i, what in ((0, "keys"), (1, "requests")):
                name = f"paramserver_{op}_{what}"
                out.append([name, "counter", f"{what} of {plural} clients sent (a replica's copy not counted)",
                            [[f"{name}_total", {"table": t}, c[i]] for (o, t), c in self.counts.items() if o == op]])
        out.append(["paramserver_request_bytes", "counter", "request bytes received, by table and op",
                    [["paramserver_request_bytes_total", {"table": t, "op": o}, c[2]]
                     for (o, t), c in self.counts.items()]])
        name = "paramserver_request_seconds"
        samples: list[list[Any]] = []
        for op, h in self.latency.items():
            total = 0.0
            for le, n in zip([*map(str, LATENCY_BUCKETS), "+Inf"], h[:-1]):
                total += n
                samples.append([f"{name}_bucket", {"op": op, "le": le}, total])
            samples += [[f"{name}_count", {"op": op}, total], [f"{name}_sum", {"op": op}, h[-1]]]
        out.append([name, "histogram", "time a server took to handle a request, by op", samples])
        return out + state_families(self.state() if state is None else state)


def _lifecycle_families(tables: dict[str, Any]) -> list[Family]:
    """Per table with a lifecycle: keys admitted, updates refused, keys evicted (counters)."""
    out: list[Family] = []
    lives = {t: v["lifecycle"] for t, v in tables.items() if "lifecycle" in v}
    for what, doc in (("admitted", "keys stored at their admission"),
                      ("refused", "key updates not applied: the key was not admitted (yet)"),
                      ("evicted", "keys evicted (as primary, or as its copy)")):
        name = f"paramserver_lifecycle_{what}"
        out.append([name, "counter", f"per table: {doc}",
                    [[f"{name}_total", {"table": t}, float(v[what])] for t, v in lives.items()]])
    return out


def _tier_families(tables: dict[str, Any]) -> list[Family]:
    """Per table over a memory budget (``store/tiers.py``): bytes in each tier, keys on
    disk, rows moved each way, the time reading them back took (``rate()`` of the counters:
    promotions and demotions a second, ``cold_seconds / cold_reads``: a cold read's latency)."""
    tiers = {t: v["tiers"] for t, v in tables.items() if "tiers" in v}
    out: list[Family] = []
    for what, kind, doc in (("budget_bytes", "gauge", "the memory budget of the table's rows here"),
                            ("hot_bytes", "gauge", "bytes of the table's rows in memory"),
                            ("cold_bytes", "gauge", "bytes of the table's rows on local disk"),
                            ("cold_keys", "gauge", "keys whose rows are on local disk"),
                            ("peak_hot_bytes", "gauge", "the most bytes of the table's rows in memory, as settles "
                                                        "found them"),
                            ("requested", "counter", "keys requests asked for"),
                            ("promoted", "counter", "rows read back from disk into memory"),
                            ("demoted", "counter", "rows moved from memory to disk"),
                            ("cold_reads", "counter", "requests some of whose rows were read back from disk"),
                            ("cold_seconds", "counter", "seconds spent reading rows back from disk"),
                            ("prefetched", "counter", "keys named ahead (prefetch) that were not in memory"),
                            ("prefetch_pages", "counter", "pages of the cold rows read ahead for them")):
        name = f"paramserver_tier_{what}"
        sample = f"{name}_total" if kind == "counter" else name
        out.append([name, kind, f"per table with a memory budget: {doc}",
                    [[sample, {"table": t}, float(v.get(what, 0))] for t, v in tiers.items()]])
    return out


def state_families(s: dict[str, Any]) -> list[Family]:
    """A server's gauges and consistency figures."""
    out: list[Family] = []
    for what, doc in (("keys", "keys stored (primary and backup copies)"),
                      ("bytes", "bytes of values and optimiser state stored"), ("vnodes", "vnodes held")):
        name = f"paramserver_table_{what}"
        out.append([name, "gauge", f"per table: {doc}",
                    [[name, {"table": t}, float(v[what])] for t, v in s["tables"].items()]])
    name = "paramserver_table_bytes_per_key"
    out.append([name, "gauge", "per table: bytes stored a key (keys, rows, life rows, admission counts)",
                [[name, {"table": t}, float(v["bytes"]) / v["keys"] if v["keys"] else 0.0]
                 for t, v in s["tables"].items()]])
    out.append(["paramserver_resident_memory_bytes", "gauge", "resident memory of the process",
                [["paramserver_resident_memory_bytes", {}, float(s["rss_bytes"])]]])
    out += _lifecycle_families(s["tables"])
    out += _tier_families(s["tables"])
    c = s["consistency"]
    out.append(["paramserver_parked_pulls", "counter", "pulls held back by the staleness bound",
                [["paramserver_parked_pulls_total", {}, float(c["parked_pulls"])]]])
    out.append(["paramserver_parked_pulls_waiting", "gauge", "pulls held back now",
                [["paramserver_parked_pulls_waiting", {}, float(c["waiting"])]]])
    seen = {int(k): v for k, v in c["staleness_histogram"].items()}
    name = "paramserver_pull_staleness_clocks"
    samples = [[f"{name}_bucket", {"le": str(float(le))}, float(sum(v for k, v in seen.items() if k <= le))]
               for le in STALENESS_BUCKETS]
    samples += [[f"{name}_bucket", {"le": "+Inf"}, float(sum(seen.values()))],
                [f"{name}_count", {}, float(sum(seen.values()))],
                [f"{name}_sum", {}, float(sum(k * v for k, v in seen.items()))]]
    out.append([name, "histogram", "clocks a pull's reader was ahead of the slowest worker", samples])
    return out + _server_filter_families(s.get("filters") or {})


def _server_filter_families(f: dict[str, Any]) -> list[Family]:
    """The keycache filter's store, and the bytes of pull replies before and after the
    table's reply filters (``paramserver.filters``)."""
    cache = f.get("key_cache", {})
    out: list[Family] = [
        ["paramserver_key_cache_lookups", "counter", "key lists named by signature: found (hit) or resent (miss)",
         [["paramserver_key_cache_lookups_total", {"result": r}, float(cache.get(k, 0))]
          for r, k in (("hit", "hits"), ("miss", "misses"))]],
        ["paramserver_key_cache_bytes", "gauge", "bytes of key lists kept for the keycache filter",
         [["paramserver_key_cache_bytes", {}, float(cache.get("bytes", 0))]]]]
    return out + filter_byte_families(
        [(k.rsplit("/", 1)[0], "reply", k.rsplit("/", 1)[1], v["bytes_in"], v["bytes_out"])
         for k, v in f.get("reply_bytes", {}).items()])


def filter_byte_families(rows: list[tuple[str, str, str, int, int]]) -> list[Family]:
    """``paramserver_filter_bytes_{in,out}_total{table,direction,filter}`` and the bytes
    each filter saved, from (table, direction, filter, bytes in, bytes out) rows."""
    out: list[Family] = []
    for what, doc, sign in (("in", "bytes of a message's parts before the filter", (1, 0)),
                            ("out", "bytes of a message's parts after the filter", (0, 1)),
                            ("saved", "bytes the filter took off (in - out)", (1, -1))):
        name = f"paramserver_filter_bytes_{what}"
        out.append([name, "counter", doc, [[f"{name}_total", {"table": t, "direction": d, "filter": f},
                                            float(sign[0] * b + sign[1] * a)] for t, d, f, b, a in rows]])
    return out


def cache_families(caches: dict[str, dict[str, Any]], keys: dict[str, int]) -> list[Family]:
    """A worker's keys sent by op (each a server's key-operation) and its row caches
    (``client/row_cache.py``): reads by result, gradients gathered and rows pushed, sums
    held now, and how many versions behind each read from the cache was."""
    out: list[Family] = [["paramserver_client_keys", "counter", "keys sent in pulls and pushes, by op",
                          [["paramserver_client_keys_total", {"op": op}, float(n)] for op, n in keys.items()]]]
    if not caches:
        return out
    reads = [["paramserver_row_cache_reads_total", {"table": t, "result": r}, float(c[k])]
             for t, c in caches.items() for r, k in (("hit", "hits"), ("miss", "misses"), ("stale", "stale"))]
    sums = [["paramserver_row_cache_rows_total", {"table": t, "what": w}, float(c[k])]
            for t, c in caches.items()
            for w, k in (("gathered", "grads_gathered"), ("pushed", "sums_pushed"), ("read_back", "rows_read_back"))]
    doc = "reads of a cached table: from the cache (hit), asked of a server (miss), found too old (stale)"
    out += [["paramserver_row_cache_reads", "counter", doc, reads],
            ["paramserver_row_cache_rows", "counter",
             "gradients gathered in the cache, rows pushed from it, rows its merges read back", sums],
            ["paramserver_row_cache_sums_held", "gauge", "rows whose summed gradients are not pushed yet",
             [["paramserver_row_cache_sums_held", {"table": t}, float(c["sums_held"])] for t, c in caches.items()]]]
    name = "paramserver_row_cache_lag_versions"
    samples: list[Any] = []
    for t, c in caches.items():
        hist = c["lag_histogram"]
        samples += [[f"{name}_bucket", {"table": t, "le": str(float(le))}, float(sum(hist[: le + 1]))]
                    for le in STALENESS_BUCKETS if le < len(hist)]
        samples += [[f"{name}_bucket", {"table": t, "le": "+Inf"}, float(sum(hist))],
                    [f"{name}_count", {"table": t}, float(sum(hist))],
                    [f"{name}_sum", {"table": t}, float(sum(i * v for i, v in enumerate(hist)))]]
    out.append([name, "histogram", "server versions a read from the row cache was behind", samples])
    return out


def client_families(client: Any) -> list[Family]:
    """A worker's (a client's) own: calls by op, retries, bytes, and the examples it reported."""
    counts = dict(client.stats.counts)
    calls = [["paramserver_client_calls_total", {"op": op}, float(n)] for op, n in counts.items() if op != "retries"]
    out: list[Family] = [["paramserver_client_calls", "counter", "pulls, pushes and other calls made", calls],
                         ["paramserver_client_retries", "counter", "pieces routed again (stale ring, lost server)",
                          [["paramserver_client_retries_total", {}, float(counts.get("retries", 0))]]]]
    for what, value in (("sent", client.stats.bytes_sent), ("received", client.stats.bytes_received)):
        out.append([f"paramserver_client_{what}_bytes", "counter", f"bytes {what}",
                    [[f"paramserver_client_{what}_bytes_total", {}, float(value)]]])
    rows = [(t, d, f, v["bytes_in"], v["bytes_out"]) for t, by_dir in client.stats.filter_stats().items()
            for d, by_f in by_dir.items() if d != "owed" for f, v in by_f.items()]
    out += filter_byte_families(rows) + cache_families(client.stats.row_cache_stats(), client.stats.keys)
    reported = client.job.reported
    out.append(["paramserver_worker_examples", "counter", "examples this worker trained (as it reported them)",
                [["paramserver_worker_examples_total", {}, float(reported.get("examples", 0.0))]]])
    return out


def aggregate(per_server: Iterable[tuple[int, list[Family]]]) -> list[Family]:
    """Every server's families as one: counters and histograms summed over servers (same
    labels), gauges kept per server under a ``server`` label."""
    meta: dict[str, tuple[str, str]] = {}
    sums: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for server, wire in per_server:
        for name, kind, doc, samples in wire:
            meta.setdefault(name, (kind, doc))
            into = sums.setdefault(name, {})
            for sample, labels, value in samples:
                if kind == "gauge":
                    labels = {**labels, "server": str(server)}
                key = (sample, tuple(sorted(labels.items())))
                into[key] = into.get(key, 0.0) + float(value)
    return [[name, *meta[name], [[s, dict(labels), v] for (s, labels), v in sums[name].items()]] for name in sums]


def total(families: list[Family], sample: str, **labels: str) -> float:
    """The sum of ``sample`` over the label sets that have ``labels``."""
    return float(sum(v for _, _, _, samples in families for s, lab, v in samples
                     if s == sample and all(lab.get(k) == want for k, want in labels.items())))


def to_prometheus(families: list[Family]) -> Iterator[Any]:
    """prometheus-client metric families of ``wire`` data."""
    from prometheus_client.core import Metric

    for name, kind, doc, samples in families:
        m = Metric(name, doc, kind)
        for sample, labels, value in samples:
            m.add_sample(sample, labels, value)
        yield m


class WireCollector:
    """A prometheus-client collector of what ``source()`` gives as wire families."""

    def __init__(self, source: Callable[[], list[Family]]):
        self.source = source

    def collect(self) -> Iterator[Any]:
        for _ in range(3):
            try:
                families = self.source()
                break
            except RuntimeError:  # a dict changed size under a scrape from this thread: look again
                continue
        else:
            families = []
        return to_prometheus(families)


def serve(source: Callable[[], list[Family]], host: str, port: int, token: str = "") -> str:
    """Serve ``source``'s families at ``http://host:port/metrics`` (port 0: any free one;
    ``token``: asked for as ``?token=`` or ``Authorization: Bearer``); returns the URL."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from paramserver.errors import ConfigError
    from paramserver.wire.security import authorized

    registry = CollectorRegistry(auto_describe=False)
    registry.register(WireCollector(source))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path, _, query = self.path.partition("?")
            if path not in ("/", "/metrics"):
                self.send_error(404, "metrics are at /metrics")
                return
            if not authorized(query, self.headers, token):
                self.send_error(401, "this cluster has a secret: pass ?token=T or Authorization: Bearer T")
                return
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            logger.debug("metrics http: " + format, *args)

    try:
        httpd = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise ConfigError(f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror}); pick a free "
                          "port, or 0 for any") from None
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="paramserver-metrics", daemon=True).start()
    url = f"http://{host}:{httpd.server_address[1]}/metrics"
    logger.info("metrics at %s", url)
    return url
