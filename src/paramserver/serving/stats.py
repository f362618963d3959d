"""What ``paramserver serve`` counts, and its ``/metrics``.

Requests count in plain numbers on the hot path (a few additions a request); the
families are made when scraped and rendered by prometheus-client, as a node's are
(``observe/metrics.py``): requests by endpoint and status, rows scored, the request
latency histogram, the model's version (its part's number), age, the deltas applied,
the last swap's duration and the share of the features scored that the model never saw.
"""

from __future__ import annotations

import bisect
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
