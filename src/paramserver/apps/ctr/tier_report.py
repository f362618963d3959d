"""What a job's model table did with its memory budget (``--table-memory``): its rows in
memory and on disk, summed over the servers, and the hot tier's hit rate pass by pass."""

from __future__ import annotations

from typing import Any

from paramserver.client.client import Client
from paramserver.errors import ParamServerError

#: the servers' tier figures a report sums (``store/tiers.py``)
SUMMED = ("budget_bytes", "hot_bytes", "cold_bytes", "cold_keys", "requested", "promoted", "demoted",
          "settle_seconds", "cold_seconds", "disk_full", "prefetched", "prefetch_pages")


def tier_figures(stats: list[dict[str, Any]], table: str) -> dict[str, float]:
    """The table's tiers in the servers' ``stats``, summed (all copies); empty without a budget."""
    tiers = [s.get("tables", {}).get(table, {}).get("tiers") for s in stats]
    tiers = [t for t in tiers if t]
    if not tiers:
        return {}
    out = {k: sum(float(t.get(k, 0)) for t in tiers) for k in SUMMED}
    out["hit_rate"] = hit_rate(out["requested"], out["promoted"])
    return out


def hit_rate(requested: float, promoted: float) -> float:
    """Of the keys requests asked for, the share found in memory (1 when none was asked)."""
    return 1.0 - promoted / requested if requested else 1.0


class TierPasses:
    """The hot tier's hit rate of each pass over the data, as the job's driver sees the
    epochs turn (within its progress period).  Only a table with a budget (``tiered``) asks
    the servers; a pass whose figures a server could not give (it died: the job's own
    watch says so) is left out, never an error of the job."""

    def __init__(self, client: Client, table: str, tiered: bool) -> None:
        self.client, self.table, self.tiered = client, table, tiered
        self.epoch = 0
        self.at = {"requested": 0.0, "promoted": 0.0}
        self.passes: list[dict[str, float]] = []

    def observe(self, status: dict[str, Any], done: bool = False) -> None:
        """A job status: a pass ended if its epoch moved on (or the job is ``done``)."""
        epoch = int(status.get("epoch", 0) or 0)
        if not self.tiered or (epoch == self.epoch and not done):
            return
        try:
            now = tier_figures(self.client.stats.server_stats(), self.table)
        except ParamServerError:  # a server lost meanwhile: this pass has no figure
            return
        if not now:
            return
        asked, promoted = now["requested"] - self.at["requested"], now["promoted"] - self.at["promoted"]
        self.passes.append({"pass": len(self.passes) + 1, "requested": asked, "promoted": promoted,
                            "hit_rate": hit_rate(asked, promoted)})
        self.epoch, self.at = epoch, {"requested": now["requested"], "promoted": now["promoted"]}
