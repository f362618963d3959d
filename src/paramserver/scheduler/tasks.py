"""The task scheduler: hands data shards to workers on request, epoch by epoch.

Sans-IO: methods take requests and return answers; the scheduler node does the I/O.
A worker asks for a shard when it is free (a pull-based queue: balancing and straggler
tolerance for free).  Epoch e+1 starts only once every shard of epoch e is done, so each
example is processed once per epoch; a worker that leaves or dies puts the shards it
held back at the front of the queue.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from paramserver.errors import ConfigError

#: a job's live counters (``progress``): examples and loss so far, and the bytes of the
#: workers' requests before and after their tables' filters (``Client.wire_totals``)
LIVE = ("examples", "loss_sum", "wire_bytes_in", "wire_bytes_out")


@dataclass
class TaskQueue:
    shards: list[list[Any]]  # wire form [path, start, end]
    epochs: int
    epoch: int = 0
    todo: deque[int] = field(default_factory=deque)
    running: dict[int, int] = field(default_factory=dict)  # shard -> node
    done: set[int] = field(default_factory=set)
    totals: dict[str, float] = field(default_factory=lambda: {
        "examples": 0, "loss_sum": 0.0, "bad_lines": 0, "bytes": 0})
    epoch_examples: list[int] = field(default_factory=list)
    live: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LIVE, 0.0))
    per_worker: dict[int, dict[str, float]] = field(default_factory=dict)  # node -> its live counters
    resumed_examples: float = 0.0  # examples done before the checkpoint this job resumed from

    def __post_init__(self) -> None:
        if not self.shards:
            raise ConfigError("a job needs at least one shard of data")
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        self.todo = deque(range(len(self.shards)))
        self.epoch_examples = [0]

    @property
    def finished(self) -> bool:
        return self.epoch == self.epochs - 1 and len(self.done) == len(self.shards)

    def next_shard(self, node_id: int) -> dict[str, Any] | None:
        """A shard for ``node_id``, ``{"done": True}`` at the end, or None: wait."""
        if not self.todo and len(self.done) == len(self.shards) and self.epoch + 1 < self.epochs:
            self.epoch += 1
            self.done.clear()
            self.todo = deque(range(len(self.shards)))
            self.epoch_examples.append(0)
        if self.todo:
            sid = self.todo.popleft()
            self.running[sid] = node_id
            return {"shard_id": sid, "shard": self.shards[sid], "epoch": self.epoch}
        if self.finished:
            return {"done": True}
        return None

    def shard_done(self, node_id: int, sid: int, epoch: int, stats: dict[str, Any]) -> None:
        if epoch != self.epoch or self.running.get(sid) != node_id:
            raise ConfigError(f"shard {sid} of epoch {epoch} is not held by node {node_id}")
        try:
            values = {k: float(stats.get(k, 0)) for k in self.totals}
        except (TypeError, ValueError, AttributeError):
            raise ConfigError(f"shard_done stats must be numbers, got {stats!r}") from None
        del self.running[sid]
        self.done.add(sid)
        self.per_worker.setdefault(node_id, {"examples": 0.0, "loss_sum": 0.0, "shards_done": 0})["shards_done"] += 1
        for k, v in values.items():
            self.totals[k] += v
        self.epoch_examples[-1] += int(values["examples"])

    def snapshot(self) -> dict[str, Any]:
        """The job's progress, to resume from: epoch, shards done in it, totals.

        Shards running now are not done: a job resumed from this snapshot does them again
        (take it when none is running, at a checkpoint's clock boundary).
        """
        return {"epoch": self.epoch, "done": sorted(self.done), "totals": dict(self.totals),
                "epoch_examples": list(self.epoch_examples)}

    @classmethod
    def resume(cls, shards: list[list[Any]], epochs: int, progress: Any) -> TaskQueue:
        """A queue that starts where ``snapshot()`` left off (totals included, so a report
        counts every example once across the restart)."""
        q = cls(shards, epochs)
        if not isinstance(progress, dict):
            raise ConfigError(f"job progress to resume from must be a map, got {progress!r}")
        epoch, done = progress.get("epoch"), progress.get("done")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < epochs:
            raise ConfigError(f"the job to resume is in epoch {epoch!r} (0-based) but this job has "
                              f"{epochs} epoch(s); give it more epochs")
        if (not isinstance(done, list)
                or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < len(shards)
                           for s in done) or len(set(done)) != len(done)):
            raise ConfigError(f"done shards to resume from must be distinct shard ids in "
                              f"[0, {len(shards)}), got {done!r}")
        totals = progress.get("totals") or {}
        try:
            values = {k: float(totals.get(k, 0)) for k in q.totals}
        except (TypeError, ValueError, AttributeError):
            raise ConfigError(f"totals to resume from must be numbers, got {totals!r}") from None
        per_epoch = progress.get("epoch_examples", [0] * epoch + [int(values["examples"])])
        if (not isinstance(per_epoch, list) or len(per_epoch) != epoch + 1
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in per_epoch)):
            raise ConfigError(f"epoch_examples to resume from must be {epoch + 1} counts, got {per_epoch!r}")
        q.epoch, q.done = epoch, set(done)
        q.todo = deque(s for s in range(len(shards)) if s not in q.done)
        q.totals.update(values)
        q.epoch_examples = list(per_epoch)
        q.live = {**dict.fromkeys(LIVE, 0.0), "examples": values["examples"], "loss_sum": values["loss_sum"]}
        q.resumed_examples = float(values["examples"])
        return q

    def progress(self, stats: dict[str, Any], node_id: int | None = None) -> None:
        """Counters of work in progress (for display; totals count at shard_done), the
        job's and the reporting worker's."""
        values = {k: float(stats.get(k, 0)) for k in self.live}
        for k, v in values.items():
            self.live[k] += v
        if node_id is not None:
            mine = self.per_worker.setdefault(node_id, {**dict.fromkeys(LIVE, 0.0), "shards_done": 0})
            for k, v in values.items():
                mine[k] += v

    def release(self, node_id: int) -> list[int]:
        """Put back the shards ``node_id`` held (it left or died)."""
        lost = [sid for sid, n in self.running.items() if n == node_id]
        for sid in lost:
            del self.running[sid]
            self.todo.appendleft(sid)
        return lost

    def status(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "epochs": self.epochs, "shards": len(self.shards),
                "shards_done": len(self.done),
                "running": len(self.running), "finished": self.finished,
                "epoch_examples": list(self.epoch_examples), "live": dict(self.live),
                "resumed_examples": self.resumed_examples,
                "per_worker": {str(k): dict(v) for k, v in self.per_worker.items()}, **self.totals}
