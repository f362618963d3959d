"""What ``paramserver serve`` counts, and its ``/metrics``.

Requests count in plain numbers on the hot path (a few additions a request); the
families are made when scraped and rendered by prometheus-client, as a node's are
(``observe/metrics.py``): requests by endpoint and status, rows scored, the request
latency histogram, the model's version (its part's number), age, the deltas applied,
the last swap's duration and the share of the features scored that the model never saw;
the follow loop's liveness (``--follow``); and the HTTP bounds at work: connections open
and refused, requests timed out reading headers or a body, clients gone mid-body, the
body bytes held.  ``readiness`` is ``/readyz``'s rule.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from paramserver.observe.metrics import LATENCY_BUCKETS, Family, WireCollector
from paramserver.serving.model import Snapshot


@dataclass
class Stats:
    """The service's counters (written by the event loop, and the follower's by its thread)."""

    requests: dict[tuple[str, int], int] = field(default_factory=dict)  # (endpoint, status) -> requests
    latency: list[float] = field(default_factory=lambda: [0.0] * (len(LATENCY_BUCKETS) + 2))  # buckets, +Inf, sum
    rows: int = 0
    scored: int = 0  # /predict requests scored (the unseen share samples the large ones)
    features: int = 0  # of the requests sampled for the unseen share ...
    unseen: int = 0  # ... and of those, the model never saw
    deltas_applied: int = 0
    bases_loaded: int = 0
    follow_errors: int = 0
    last_swap_s: float = 0.0
    follow_url: str = ""  # "" unless following (--follow)
    follow_alive: bool = False  # the follow thread runs its loop
    follow_last_ok_at: float = 0.0  # time.time() of the last poll that ended without error
    follow_last_error: str = ""  # the last poll's error ("" when it was fine)
    client_disconnects: int = 0  # clients that hung up before their body was read
    timeouts: dict[str, int] = field(default_factory=dict)  # phase ("header", "body") -> connections timed out
    connections_refused: int = 0  # over --max-connections
    connections_open: int = 0
    body_bytes_held: int = 0  # bodies being read or scored now

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        key = (endpoint, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        h = self.latency
        h[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        h[-1] += seconds

    @property
    def unseen_share(self) -> float:
        return self.unseen / self.features if self.features else 0.0

    def families(self, snap: Snapshot | None) -> list[Family]:
        """Every family, as wire data (``observe.metrics``)."""
        p = "paramserver_serve"
        out: list[Family] = [
            [f"{p}_requests", "counter", "HTTP requests answered, by endpoint and status",
             [[f"{p}_requests_total", {"endpoint": e, "status": str(s)}, float(n)]
              for (e, s), n in list(self.requests.items())]],
            [f"{p}_rows", "counter", "rows scored", [[f"{p}_rows_total", {}, float(self.rows)]]],
            [f"{p}_deltas_applied", "counter", "published deltas applied",
             [[f"{p}_deltas_applied_total", {}, float(self.deltas_applied)]]],
            [f"{p}_bases_loaded", "counter", "published bases (whole chains) loaded",
             [[f"{p}_bases_loaded_total", {}, float(self.bases_loaded)]]],
            [f"{p}_follow_errors", "counter", "polls of --follow that met a damaged or missing part",
             [[f"{p}_follow_errors_total", {}, float(self.follow_errors)]]],
            *self._follow_gauges(p),
            [f"{p}_client_disconnects", "counter", "clients that hung up before their request's body was read",
             [[f"{p}_client_disconnects_total", {}, float(self.client_disconnects)]]],
            [f"{p}_timeouts", "counter", "connections closed for sending their headers or body too slowly, by phase",
             [[f"{p}_timeouts_total", {"phase": k}, float(n)] for k, n in sorted(self.timeouts.items())]],
            [f"{p}_connections_refused", "counter", "connections refused (503) over --max-connections",
             [[f"{p}_connections_refused_total", {}, float(self.connections_refused)]]],
            _gauge(f"{p}_connections_open", "connections open now", self.connections_open),
            _gauge(f"{p}_body_bytes_held", "bytes of request bodies being read or scored now", self.body_bytes_held),
            _gauge(f"{p}_last_swap_seconds", "time the last new model version took to load and swap in",
                   self.last_swap_s),
            _gauge(f"{p}_unseen_feature_share", "share of the features scored that the model never saw in training",
                   self.unseen_share),
            [f"{p}_model_version", "gauge", "the served model's part number (seq; 0: loaded once), its name labelled",
             [] if snap is None else [[f"{p}_model_version", {"version": snap.version}, float(snap.seq)]]],
            [f"{p}_model_age_seconds", "gauge", "seconds since the served model version was published or saved",
             [] if snap is None else [[f"{p}_model_age_seconds", {}, snap.age_s]]],
        ]
        return out + [self._histogram(f"{p}_request_seconds")]

    def _follow_gauges(self, p: str) -> list[Family]:
        """The follow loop's liveness (none when not following)."""
        if not self.follow_url:
            return []
        ok_age = time.time() - self.follow_last_ok_at if self.follow_last_ok_at else float("nan")
        return [_gauge(f"{p}_follow_alive", "1 while the --follow loop runs, 0 once it has stopped",
                       float(self.follow_alive)),
                _gauge(f"{p}_follow_last_ok_age_seconds", "seconds since a poll of --follow last ended without error "
                       "(NaN: none has yet)", ok_age),
                _gauge(f"{p}_follow_failing", "1 while the last poll of --follow failed", float(bool(
                    self.follow_last_error)))]

    def _histogram(self, name: str) -> Family:
        samples: list[list[object]] = []
        total = 0.0
        for le, n in zip([*map(str, LATENCY_BUCKETS), "+Inf"], self.latency[:-1]):
            total += n
            samples.append([f"{name}_bucket", {"le": le}, total])
        samples += [[f"{name}_count", {}, total], [f"{name}_sum", {}, self.latency[-1]]]
        return [name, "histogram", "time to answer a request (all endpoints)", samples]


def _gauge(name: str, doc: str, value: float) -> Family:
    return [name, "gauge", doc, [[name, {}, float(value)]]]


def renderer(source: Callable[[], list[Family]]) -> Callable[[], tuple[bytes, str]]:
    """A function that renders ``source``'s families as Prometheus text: (body, content type)."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(WireCollector(source))

    def render() -> tuple[bytes, str]:
        return generate_latest(registry), CONTENT_TYPE_LATEST

    return render


def readiness(snap: Snapshot | None, stats: Stats, max_age_s: float = 0.0) -> tuple[int, dict[str, object]]:
    """``/readyz``: (status, document).  503 with the reason before a model is loaded, once
    the follow loop has stopped, or while the followed model is older than ``max_age_s``
    (0: no bound); 200 ``degraded`` with the reason while the last poll failed but the
    model is within the bound; else 200 ``ready``."""
    following, error = bool(stats.follow_url), stats.follow_last_error
    last = f" (its last error: {error})" if error else ""
    if snap is None:
        why = "no model loaded yet (nothing published, or loading)"
        if following and stats.follow_alive is False and (error or stats.follow_errors):
            why = f"no model loaded, and the follow loop of {stats.follow_url} has stopped{last}"
        return 503, {"ready": False, "status": "not ready", "reason": why}
    doc: dict[str, object] = {"model_version": snap.version, "model_age_s": round(snap.age_s, 3)}
    if following and not stats.follow_alive:
        return 503, {"ready": False, "status": "not ready", **doc, "reason":
                     f"the follow loop of {stats.follow_url} has stopped{last}: the model is no longer kept "
                     "current; restart serve (its log has the cause)"}
    if following and max_age_s > 0 and snap.age_s > max_age_s:
        return 503, {"ready": False, "status": "not ready", **doc, "reason":
                     f"the model is {snap.age_s:.0f} s old, over --max-age {max_age_s:g}: nothing newer was "
                     f"applied from {stats.follow_url}{last} (is the training job publishing?)"}
    if following and error:
        return 200, {"ready": True, "status": "degraded", **doc, "reason":
                     f"the last poll of {stats.follow_url} failed: {error}; serving the last whole model"}
    return 200, {"ready": True, "status": "ready", **doc}
