"""What a training job does for a model that lives on: publishing it while it trains
(``--publish URL --publish-every S``: a base, then deltas; ``checkpoint/publish.py``), and
the report's lines on the model table: its storage (``--storage``), keys held and bytes a
key, and with a lifecycle (``--lifecycle``) updates refused by admission, keys evicted."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from paramserver.apps.ctr.modelfile import pull_dense, save_model
from paramserver.apps.ctr.tier_report import tier_figures
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.checkpoint.publish import Publisher
from paramserver.client.client import Client
from paramserver.tables.spec import TableSpec


class JobPublisher:
    """Publishes the model table of a job every ``every`` seconds (``due``, ``publish``)
    and once more at its end; ``stats`` says what it wrote and how long the servers were
    held (an export of what changed, per server)."""

    def __init__(self, url: str, every: float, cfg: TrainConfig, spec: TableSpec) -> None:
        self.cfg, self.spec, self.every = cfg, spec, every

        def write_base(path: str, keys: np.ndarray, values: np.ndarray, dense: np.ndarray | None) -> None:
            save_model(path, cfg.model, cfg.data, spec, keys, values, dense=dense)

        self.publisher = Publisher(url, spec.name, write_base, fresh=True)  # its servers: not the folder's token's
        self.last = time.monotonic()
        self.parts: list[dict[str, Any]] = []
        self.export_s: list[float] = []

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.every

    def publish(self, client: Client) -> dict[str, Any]:
        t0 = time.perf_counter()
        delta = client.export_delta(self.spec.name, since=self.publisher.token)
        self.export_s.append(time.perf_counter() - t0)
        entry = self.publisher.publish(delta, dense=pull_dense(client, self.cfg.model))
        self.parts.append(entry)
        self.last = time.monotonic()
        return entry

    def stats(self) -> dict[str, Any]:
        deltas = [p for p in self.parts if p["kind"] == "delta"]
        return {"url": self.publisher.url, "every_s": self.every, "bases": len(self.parts) - len(deltas),
                "deltas": len(deltas), "delta_keys": [p["keys"] for p in deltas],
                "delta_deleted": [p["deleted"] for p in deltas],
                "export_s_max": max(self.export_s, default=0.0), "export_s_mean": float(np.mean(self.export_s))
                if self.export_s else 0.0}


def table_report(client: Client, spec: TableSpec) -> dict[str, Any]:
    """The model table on every server, summed: how its rows are stored (``storage``),
    keys (one copy), bytes (all copies), bytes a stored key, the servers' RSS; with a
    lifecycle, updates refused, keys admitted and evicted (as primaries)."""
    stats = client.stats.server_stats()
    per_server = [s.get("tables", {}).get(spec.name, {}) for s in stats]
    keys = sum(int(t.get("primary_keys", 0)) for t in per_server)
    stored = sum(int(t.get("keys", 0)) for t in per_server)
    nbytes = sum(int(t.get("bytes", 0)) for t in per_server)
    report: dict[str, Any] = {"storage": spec.storage, "key_bytes": spec.key_bytes, "keys": keys,
                              "table_bytes": nbytes,
                              "bytes_per_key": nbytes / stored if stored else 0.0,
                              "server_rss_bytes": sum(int(s.get("rss_bytes", 0)) for s in stats)}
    if spec.lifecycle:
        life = [t.get("lifecycle", {}) for t in per_server]
        report |= {"lifecycle": str(spec.lifecycle),
                   "updates_refused": sum(int(x.get("refused", 0)) for x in life),
                   "keys_admitted": sum(int(x.get("admitted", 0)) for x in life),
                   "keys_evicted": sum(int(x.get("evicted", 0)) for x in life) // max(spec.replicas, 1)}
    if spec.memory:  # a memory budget: its rows in memory and on disk, all copies
        report["tiers"] = tier_figures(stats, spec.name)
    return report
