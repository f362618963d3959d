"""The task scheduler: hands data shards to workers on request, epoch by epoch
(``TaskQueue``, a job over files) or as they arrive (``StreamQueue``, ``train --stream``).

Sans-IO: methods take requests and return answers; the scheduler node does the I/O.
A worker asks for a shard when it is free (a pull-based queue: balancing and straggler
tolerance for free).  Epoch e+1 starts only once every shard of epoch e is done, so each
example is processed once per epoch; a worker that leaves or dies puts the shards it
held back at the front of the queue.

A stream's driver adds the shards it cuts from its source with the source's position
after them; the shards not done and that position are what a checkpoint records
(``snapshot``), so a job resumed from it reads each example exactly once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from paramserver.errors import ConfigError

#: a job's live counters (``progress``): examples and loss so far, and the bytes of the
#: workers' requests before and after their tables' filters (``Client.wire_totals``)
#: a worker's live counters, reported as they grow; ``sums_held`` is a gauge (its changes are reported):
#: the row cache's gradient sums not pushed yet, which a worker that dies takes with it (``sums_lost``)
LIVE = ("examples", "loss_sum", "wire_bytes_in", "wire_bytes_out", "sums_held")


@dataclass
class _Queue:
    """What both queues count: shards running (shard -> node), totals of the shards done,
    live counters, each worker's."""

    running: dict[int, int] = field(default_factory=dict)  # shard -> node
    totals: dict[str, float] = field(default_factory=lambda: {
        "examples": 0, "loss_sum": 0.0, "bad_lines": 0, "bytes": 0, "skipped_shards": 0, "skipped_bytes": 0})
    # a stream's files that changed after they were taken, their shards skipped (--changed-files skip):
    # file -> {what changed, shards, bytes}
    skipped_files: dict[str, dict[str, Any]] = field(default_factory=dict)
    epoch_examples: list[int] = field(default_factory=lambda: [0])
    live: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LIVE, 0.0))
    per_worker: dict[int, dict[str, float]] = field(default_factory=dict)  # node -> its live counters
    resumed_examples: float = 0.0  # examples done before the checkpoint this job resumed from
    sums_lost: float = 0.0  # row cache sums held by workers that left without pushing them (they died)
    todo: deque[int] = field(default_factory=deque)
    epoch: int = 0

    def _count_done(self, node_id: int, sid: int, epoch: int, stats: dict[str, Any]) -> None:
        """Shard ``sid``, held by ``node_id``, is done: its counters added to the totals."""
        if epoch != self.epoch or self.running.get(sid) != node_id:
            raise ConfigError(f"shard {sid} of epoch {epoch} is not held by node {node_id}")
        try:
            values = {k: float(stats.get(k, 0)) for k in self.totals}
        except (TypeError, ValueError, AttributeError):
            raise ConfigError(f"shard_done stats must be numbers, got {stats!r}") from None
        del self.running[sid]
        self.per_worker.setdefault(node_id, {"examples": 0.0, "loss_sum": 0.0, "shards_done": 0})["shards_done"] += 1
        for k, v in values.items():
            self.totals[k] += v
        self.epoch_examples[-1] += int(values["examples"])
        self.count_skipped(stats.get("skipped"), values["skipped_shards"], values["skipped_bytes"])

    def count_skipped(self, skipped: Any, shards: float, nbytes: float) -> None:
        """A file's shards skipped (``{"file", "what"}``), added to its line in ``skipped_files``."""
        if isinstance(skipped, dict) and isinstance(skipped.get("file"), str):
            line = self.skipped_files.setdefault(skipped["file"], {"what": "", "shards": 0, "bytes": 0})
            line.update(what=str(skipped.get("what", "")), shards=line["shards"] + int(shards),
                        bytes=line["bytes"] + int(nbytes))

    def _resume_totals(self, progress: dict[str, Any]) -> dict[str, float]:
        """The totals of a snapshot to resume from, checked, taken as this queue's."""
        totals = progress.get("totals") or {}
        try:
            values = {k: float(totals.get(k, 0)) for k in self.totals}
        except (TypeError, ValueError, AttributeError):
            raise ConfigError(f"totals to resume from must be numbers, got {totals!r}") from None
        self.totals.update(values)
        self.live = {**dict.fromkeys(LIVE, 0.0), "examples": values["examples"], "loss_sum": values["loss_sum"]}
        self.resumed_examples = float(values["examples"])
        return values

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
        for sid in sorted(lost, reverse=True):  # at the front, in their order
            del self.running[sid]
            self.todo.appendleft(sid)
        mine = self.per_worker.get(node_id, {})
        held = mine.get("sums_held", 0.0)
        if held > 0:  # a worker that finishes pushes every sum first: it died holding these
            self.sums_lost += held
            self.live["sums_held"] -= held
            mine["sums_held"] = 0.0
        return lost

    def _status(self) -> dict[str, Any]:
        return {"running": len(self.running), "epoch_examples": list(self.epoch_examples), "live": dict(self.live),
                "skipped_files": {k: dict(v) for k, v in self.skipped_files.items()},
                "resumed_examples": self.resumed_examples, "sums_lost": self.sums_lost,
                "per_worker": {str(k): dict(v) for k, v in self.per_worker.items()}, **self.totals}


@dataclass
class TaskQueue(_Queue):
    """The shards of files, ``epochs`` times over."""

    shards: list[list[Any]] = field(default_factory=list)  # wire form [path, start, end]
    epochs: int = 1
    done: set[int] = field(default_factory=set)

    def __init__(self, shards: list[list[Any]], epochs: int) -> None:
        super().__init__()
        self.shards, self.epochs, self.done = shards, epochs, set()
        if not self.shards:
            raise ConfigError("a job needs at least one shard of data")
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        self.todo = deque(range(len(self.shards)))

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
            last = not self.todo and self.epoch + 1 >= self.epochs  # no shard is handed out after it
            return {"shard_id": sid, "shard": self.shards[sid], "epoch": self.epoch, "last": last}
        if self.finished:
            return {"done": True}
        return None

    def shard_done(self, node_id: int, sid: int, epoch: int, stats: dict[str, Any]) -> None:
        self._count_done(node_id, sid, epoch, stats)
        self.done.add(sid)

    def snapshot(self) -> dict[str, Any]:
        """The job's progress, to resume from: epoch, shards done in it, totals.

        Shards running now are not done: a job resumed from this snapshot does them again
        (take it when none is running, at a checkpoint's clock boundary).
        """
        return {"epoch": self.epoch, "done": sorted(self.done), "totals": dict(self.totals),
                "epoch_examples": list(self.epoch_examples)}

    def manifest(self) -> dict[str, Any]:
        """What a checkpoint's manifest records of the job (``job``)."""
        return {"shards": self.shards, "epochs": self.epochs, **self.snapshot()}

    def describe(self) -> str:
        return f"epoch {self.epoch}, {len(self.done)} shard(s) done"

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
        values = q._resume_totals(progress)
        per_epoch = progress.get("epoch_examples", [0] * epoch + [int(values["examples"])])
        if (not isinstance(per_epoch, list) or len(per_epoch) != epoch + 1
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in per_epoch)):
            raise ConfigError(f"epoch_examples to resume from must be {epoch + 1} counts, got {per_epoch!r}")
        q.epoch, q.done = epoch, set(done)
        q.todo = deque(s for s in range(len(shards)) if s not in q.done)
        q.epoch_examples = list(per_epoch)
        return q

    def status(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "epochs": self.epochs, "shards": len(self.shards),
                "shards_done": len(self.done), "finished": self.finished, **self._status()}


@dataclass
class StreamQueue(_Queue):
    """The shards of a stream (``train --stream``), as its driver cuts them: one epoch,
    open until the driver closes it.  Only the shards not done are kept."""

    source: str = ""
    position: Any = None  # the source's position after the last shard added (JSON, the source's own)
    pending: dict[int, list[Any]] = field(default_factory=dict)  # shard -> wire, not done yet
    added: int = 0  # shards added so far (the next one's id)
    closed: bool = False
    epochs: int = 1

    @property
    def finished(self) -> bool:
        return self.closed and not self.pending

    def add(self, shards: list[list[Any]], position: Any, close: bool = False) -> None:
        """Shards cut from the source, in its order, and its position after them."""
        if self.closed and shards:
            raise ConfigError("the stream was closed: no shard can be added to it")
        for wire in shards:
            self.pending[self.added] = wire
            self.todo.append(self.added)
            self.added += 1
        self.position = position
        self.closed = self.closed or close

    def next_shard(self, node_id: int) -> dict[str, Any] | None:
        """The oldest shard not handed out, ``{"done": True}`` once closed and done, or None: wait."""
        if self.todo:
            sid = self.todo.popleft()
            self.running[sid] = node_id
            return {"shard_id": sid, "shard": self.pending[sid], "epoch": 0}
        return {"done": True} if self.finished else None

    def shard_done(self, node_id: int, sid: int, epoch: int, stats: dict[str, Any]) -> None:
        self._count_done(node_id, sid, epoch, stats)
        del self.pending[sid]

    def snapshot(self) -> dict[str, Any]:
        """The job's progress, to resume from: totals, and the stream's position with the
        shards cut before it and not done (running ones are not done: take it when none runs)."""
        return {"epoch": 0, "done": [], "totals": dict(self.totals), "epoch_examples": list(self.epoch_examples),
                "stream": self.stream_state(), "skipped_files": {k: dict(v) for k, v in self.skipped_files.items()}}

    def stream_state(self) -> dict[str, Any]:
        return {"source": self.source, "position": self.position,
                "pending": [self.pending[s] for s in sorted(self.pending)]}

    def manifest(self) -> dict[str, Any]:
        return {"epochs": 1, **self.snapshot()}

    def describe(self) -> str:
        return f"{self.added - len(self.pending)} shard(s) of the stream done"

    @classmethod
    def resume(cls, source: str, progress: Any) -> StreamQueue:
        """A queue that starts where ``snapshot()`` left off: its pending shards first."""
        q = cls(source=source)
        stream = progress.get("stream") if isinstance(progress, dict) else None
        if not isinstance(stream, dict) or not isinstance(stream.get("pending"), list):
            raise ConfigError(f"stream progress to resume from must have the stream's pending shards, got {progress!r}")
        if stream.get("source") != source:
            raise ConfigError(f"the job to resume read the stream {stream.get('source')!r}, not {source!r}")
        q._resume_totals(progress)
        q.epoch_examples = [int(q.totals["examples"])]
        for file, line in (progress.get("skipped_files") or {}).items():  # before the checkpoint, or on resuming
            if isinstance(line, dict):
                q.count_skipped({"file": file, "what": line.get("what", "")}, line.get("shards", 0),
                                line.get("bytes", 0))
        q.add(list(stream["pending"]), stream.get("position"))
        return q

    def status(self) -> dict[str, Any]:
        return {"epoch": 0, "epochs": 1, "shards": self.added, "shards_done": self.added - len(self.pending),
                "finished": self.finished, "stream": {**self.stream_state(), "closed": self.closed},
                **self._status()}
