"""A training job as the scheduler runs it: the data-shard queue (``tasks.TaskQueue``, or
``tasks.StreamQueue`` for a stream) and the coordinated checkpoints that stop it at clock
boundaries.

No sockets here.  ``Jobs`` takes the job's requests (``start``, ``next_shard``,
``shard_done``, ``progress``, ``status``) and the cluster's events (a node removed, a
checkpoint's answers), and acts through the small ``JobHost`` interface the scheduler
implements: answer a request, send a command to every server, say that the set of busy
workers changed.

Checkpoints: every ``every`` shards done (or ``seconds``) the queue stops handing out shards ("draining");
once no shard runs (each worker drains its pushes before ``shard_done``: the servers are
quiet, a clock boundary) every server writes its vnodes ("writing"), then the manifest
is written, last.  A failed step is abandoned (it has no manifest, so it is never used)
and training goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from paramserver._runtime.logutil import Throttled
from paramserver.checkpoint import store as checkpoint
from paramserver.errors import ConfigError, ProtocolError
from paramserver.observe.progressive import Scoreboard
from paramserver.routing.ring import Ring
from paramserver.scheduler.fanout import FanOut
from paramserver.scheduler.tasks import StreamQueue, TaskQueue
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message, Op, encode, reply
from paramserver.wire.message import field as hfield

logger = logging.getLogger(__name__)


class JobHost(Protocol):
    """What ``Jobs`` needs of the scheduler."""

    ring: Ring | None
    tables: dict[str, TableSpec]
    @property
    def losses(self) -> list[dict[str, Any]]: ...
    @property
    def failovers(self) -> list[dict[str, Any]]: ...

    def answer(self, identity: bytes, frames: list[Any]) -> None: ...

    def fan_out(self, header: dict[str, Any], on_done: Callable[[FanOut], None], timeout_s: float) -> int: ...

    def workers_changed(self) -> None: ...


RETRIES = 3  # a checkpoint that failed is tried again at the next boundary, this many times in a row


@dataclass
class JobCheckpoints:
    """``JOB_START``'s ``checkpoint``: every ``every`` shards done (or once ``seconds``
    have passed and a shard was done), stop handing out shards, let the running ones
    finish (a clock boundary), checkpoint, go on."""

    url: str
    every: int
    timeout_s: float
    seconds: float | None = None
    last_at: float = field(default_factory=time.monotonic)  # when the last one was written (or the job started)
    stream: dict[str, Any] | None = None  # a stream job's state in the last manifest written (what it committed)
    since: int = 0  # shards done since the last checkpoint (or its attempt)
    phase: str | None = None  # None, "draining" (waiting for running shards), "writing"
    step: str = ""
    ring_version: int = 0
    written: list[str] = field(default_factory=list)
    abandoned: int = 0
    failures: list[str] = field(default_factory=list)  # why each abandoned checkpoint failed
    failed_in_row: int = 0  # abandoned since the last one written: retried at the next boundary, 3 times
    meta: dict[str, Any] = field(default_factory=dict)  # the job's own words for its manifests (model, data)

    @classmethod
    def from_wire(cls, w: Any) -> JobCheckpoints:
        every, timeout_s, seconds = (w.get("every"), w.get("timeout_s", 600), w.get("seconds")) \
            if isinstance(w, dict) else (0, 0, None)
        if every is None and isinstance(seconds, (int, float)):
            every = 1 << 62  # by time only
        if (not isinstance(w, dict) or not isinstance(w.get("url"), str) or not w["url"]
                or isinstance(every, bool) or not isinstance(every, int) or every < 1
                or isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0
                or not (seconds is None or (isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
                                            and seconds > 0))):
            raise ConfigError(f"job_start checkpoint must be {{url: str, every: int >= 1, timeout_s: "
                              f"number > 0, seconds: number > 0 or absent}}, got {w!r}")
        meta = w.get("meta", {})
        if not isinstance(meta, dict):
            raise ConfigError(f"job_start checkpoint meta must be a map, got {meta!r}")
        return cls(w["url"], every, float(timeout_s), None if seconds is None else float(seconds), meta=meta)

    def due(self, running: int = 0) -> bool:
        """Whether the shards done (and ``running``, once done) bring a checkpoint."""
        return self.since + running >= self.every or (
            self.seconds is not None and self.since + running > 0 and time.monotonic() - self.last_at >= self.seconds)


class Jobs:
    """The scheduler's job: at most one runs at a time."""

    def __init__(self, host: JobHost) -> None:
        self.host = host
        self.job: TaskQueue | StreamQueue | None = None
        self.scores = Scoreboard()  # the job's progressive validation (observe/progressive.py)
        self.loose: dict[str, float] = {}  # progress sent with no job running (a scheduled program's rounds)
        self._bad_scores = Throttled(logger)
        self.checkpoints: JobCheckpoints | None = None
        self.waiters: list[tuple[bytes, Any, int]] = []  # (identity, request id, node id) asking for a shard
        # workers found idle (waiting and holding no shard) since their question: the servers'
        # vector clocks may have let them go, and their answer says to rejoin (``serve``)
        self.left: set[int] = set()

    # ---- requests ----------------------------------------------------------------------
    def start(self, identity: bytes, msg: Message) -> None:
        """``shards``, ``epochs`` (or ``stream``: the source's URL, shards added later);
        optional ``checkpoint: {url, every, timeout_s, seconds}`` (every ``every`` shards
        done, or ``seconds``) and ``resume`` (``snapshot()`` of a checkpoint's queue)."""
        shards, epochs, stream = msg.header.get("shards"), msg.header.get("epochs"), msg.header.get("stream")
        if stream is None and (not isinstance(shards, list) or not isinstance(epochs, int)):
            raise ProtocolError("job_start takes shards (a list) and epochs (an int), or stream (a source's URL)")
        if stream is not None and not isinstance(stream, str):
            raise ProtocolError(f"job_start's stream must be the source's URL, got {stream!r}")
        if (self.job is not None and not self.job.finished) or self.checkpointing:
            raise ConfigError("a job is already running on this cluster; wait for it to finish")
        ckpt = msg.header.get("checkpoint")
        checkpoints = None if ckpt is None else JobCheckpoints.from_wire(ckpt)
        resume = msg.header.get("resume")
        if isinstance(stream, str):
            self.job = StreamQueue(source=stream) if resume is None else StreamQueue.resume(stream, resume)
        else:
            assert isinstance(shards, list) and isinstance(epochs, int)
            self.job = TaskQueue(shards, epochs) if resume is None else TaskQueue.resume(shards, epochs, resume)
        self.checkpoints = checkpoints
        if checkpoints is not None and resume is not None and isinstance(self.job, StreamQueue):
            # the checkpoint resumed from is saved: committable even if this run writes none (it resumed at
            # the stream's end), else a SIGKILL between a last checkpoint and its commit left the group behind
            checkpoints.stream = self.job.stream_state()
        self.scores = Scoreboard()
        logger.info("job started: %s%s%s", f"the stream {stream}" if stream else f"{len(shards or [])} shard(s), "
                    f"{epochs} epoch(s)", f", resumed with {self.job.describe()}" if resume is not None else "",
                    f", a checkpoint every {checkpoints.every} shard(s) or {checkpoints.seconds} s under "
                    f"{checkpoints.url}" if checkpoints else "")
        self.host.answer(identity, reply(msg))

    def add(self, identity: bytes, msg: Message) -> None:
        """A stream's driver adds ``shards`` cut from its source, the source's ``position``
        after them, and ``close`` once it cuts no more."""
        if not isinstance(self.job, StreamQueue):
            raise ConfigError("no stream job is running (job_add adds shards to a job started with stream=)")
        shards, close = msg.header.get("shards", []), msg.header.get("close", False)
        if not isinstance(shards, list) or not isinstance(close, bool):
            raise ProtocolError("job_add takes shards (a list), position and close (a bool)")
        self.job.add(shards, msg.header.get("position"), close)
        self.host.answer(identity, reply(msg))
        self._last_checkpoint()
        self.serve()
        self.host.workers_changed()

    def next_shard(self, identity: bytes, msg: Message, node_id: int | None) -> None:
        if node_id is None or self.job is None:
            raise ConfigError("no job is running (the driver starts one with client.job.start)")
        self.waiters.append((identity, msg.id, node_id))
        self.serve()
        self.host.workers_changed()

    def shard_done(self, identity: bytes, msg: Message, node_id: int | None) -> None:
        if self.job is None or node_id is None:
            raise ConfigError("no job is running")
        self.job.shard_done(node_id, hfield(msg, "shard_id", int), hfield(msg, "epoch", int),
                            msg.header.get("stats") or {})
        self.host.answer(identity, reply(msg))
        ckpt = self.checkpoints
        if ckpt is not None:
            ckpt.since += 1
            if ckpt.due() and ckpt.phase is None:
                ckpt.phase = "draining"
            self._last_checkpoint()
            self.maybe_checkpoint()  # the last running shard may have just finished
        self.serve()
        self.host.workers_changed()

    def tick(self) -> None:
        """The scheduler's loop, at every turn: a checkpoint due by time since the last
        shard done (no other shard may come soon: a quiet stream) is begun now."""
        ckpt = self.checkpoints
        if ckpt is not None and self.job is not None and ckpt.phase is None and ckpt.since > 0 and ckpt.due():
            ckpt.phase = "draining"
            self.maybe_checkpoint()

    def _last_checkpoint(self) -> None:
        """A stream that ended is checkpointed at its end (a job resumed from there reads
        only what came after); the workers hear that it is done once that is written."""
        ckpt = self.checkpoints
        if ckpt is not None and isinstance(self.job, StreamQueue) and self.job.finished and ckpt.since > 0 \
                and ckpt.phase is None:
            ckpt.phase = "draining"
            self.maybe_checkpoint()

    def progress(self, msg: Message, node_id: int | None = None) -> None:
        if self.job is None:  # a scheduled program's rounds (no task queue): counted for its driver's line
            stats = msg.header.get("stats") or {}
            for k, v in stats.items() if isinstance(stats, dict) else ():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.loose[str(k)] = self.loose.get(str(k), 0.0) + float(v)
            return
        self.job.progress(msg.header.get("stats") or {}, node_id)
        if (scores := msg.header.get("scores")) is not None:
            try:
                self.scores.add(scores)
            except (ValueError, KeyError, TypeError) as exc:  # a malformed report is dropped, and said (throttled)
                self._bad_scores.warning("node %s sent malformed scores (%s): dropped", node_id, exc)

    def status(self, identity: bytes, msg: Message) -> None:
        status: dict[str, Any] = self.job.status() if self.job else ({"live": dict(self.loose)} if self.loose else {})
        if self.job:  # what servers' deaths cost the job
            status["losses"], status["failovers"] = self.host.losses, self.host.failovers
            if self.scores.all_n:
                status["progressive"] = self.scores.summary()
        ckpt = self.checkpoints
        if self.job and ckpt is not None:
            status["checkpoints"] = {"written": list(ckpt.written), "abandoned": ckpt.abandoned,
                                     "failures": list(ckpt.failures), "in_progress": ckpt.phase is not None}
            if ckpt.stream is not None:
                status["checkpoints"]["stream"] = ckpt.stream
        self.host.answer(identity, reply(msg, job=status))

    # ---- events ------------------------------------------------------------------------
    def idle_workers(self) -> set[int]:
        """Workers waiting for a shard and holding none (they leave the vector clocks; each
        is told to rejoin them with its shard: ``serve``)."""
        busy = set(self.job.running.values()) if self.job is not None else set()
        idle = {w[2] for w in self.waiters} - busy
        self.left |= idle
        return idle

    def node_removed(self, node_id: int, role: str) -> None:
        """A node left or died: its shards go back to the queue."""
        self.waiters = [w for w in self.waiters if w[2] != node_id]
        self.left.discard(node_id)
        if self.job is not None:
            lost = self.job.release(node_id)
            if lost:
                logger.warning("shards %s of %s %d go back to the queue", lost, role, node_id)
                self.serve()
                self.host.workers_changed()
        self.maybe_checkpoint()  # a dead worker's shards went back: the boundary may be here

    def serve(self) -> None:
        """Answer the workers waiting for a shard that can have one now."""
        if self.checkpointing:  # no new shard until the checkpoint is written
            return
        waiting, self.waiters = self.waiters, []
        for identity, request_id, node_id in waiting:
            if self._checkpoint_due(node_id):
                self.waiters.append((identity, request_id, node_id))
                continue
            answer = self.job.next_shard(node_id) if self.job else {"done": True}
            if answer is None:
                self.waiters.append((identity, request_id, node_id))
            else:  # rejoin: whether the worker may have left the clocks while it waited
                rejoin = node_id in self.left
                self.left.discard(node_id)
                self.host.answer(identity, encode({"op": Op.OK.value, "id": request_id, **answer, "rejoin": rejoin}))

    def _checkpoint_due(self, node_id: int) -> bool:
        """A worker asks for its next shard while it finishes one; hold the new one back
        if the shards running now bring a checkpoint: it would only delay it (checkpoints
        stay N to N + workers - 1 shards apart)."""
        ckpt, job = self.checkpoints, self.job
        return (ckpt is not None and job is not None and node_id in job.running.values()
                and ckpt.due(len(job.running)))

    # ---- coordinated checkpoints -------------------------------------------------------
    @property
    def checkpointing(self) -> bool:
        return self.checkpoints is not None and self.checkpoints.phase is not None

    def maybe_checkpoint(self) -> None:
        """Once no shard runs, ask every server to write its vnodes."""
        ckpt = self.checkpoints
        if ckpt is None or ckpt.phase != "draining" or self.job is None or self.job.running:
            return
        ckpt.phase = "writing"
        try:
            ckpt.step = checkpoint.new_step_url(ckpt.url)
        except Exception as exc:  # e.g. the folder cannot be listed: this one is given up
            self._checkpoint_done(f"{ckpt.url} cannot be listed ({type(exc).__name__}: {exc})")
            return
        assert self.host.ring is not None
        ckpt.ring_version = self.host.ring.version
        logger.info("checkpoint %s: %d shard(s) done since the last one", ckpt.step, ckpt.since)
        self.host.fan_out({"op": Op.CHECKPOINT.value, "url": ckpt.step}, self._written, ckpt.timeout_s)

    def _written(self, op: FanOut) -> None:
        """Every server answered (or died): write the manifest, last, or give the step up."""
        ckpt, job, ring = self.checkpoints, self.job, self.host.ring
        if ckpt is None or job is None or ring is None:
            return
        missing = set(ring.owners.tolist()) - set(op.replies)
        if op.errors or op.lost or missing or ring.version != ckpt.ring_version:
            self._checkpoint_done(f"errors {op.errors or '-'}, lost servers {sorted(op.lost) or '-'}, "
                                  f"vnode owners without files {sorted(missing) or '-'}, ring version "
                                  f"{ckpt.ring_version} -> {ring.version}")
            return
        manifest = checkpoint.assemble_manifest(
            list(op.replies.values()), ring.to_wire(), {n: s.to_wire() for n, s in self.host.tables.items()},
            job=job.manifest(),
            **({"train": ckpt.meta} if ckpt.meta else {}))
        try:
            checkpoint.write_manifest(ckpt.step, manifest)
        except Exception as exc:
            self._checkpoint_done(f"the manifest cannot be written ({type(exc).__name__}: {exc})")
            return
        ckpt.written.append(ckpt.step)
        ckpt.last_at = time.monotonic()
        ckpt.stream = job.stream_state() if isinstance(job, StreamQueue) else None
        logger.info("checkpoint %s written (%s)", ckpt.step, job.describe())
        self._checkpoint_done(None)

    def _checkpoint_done(self, failure: str | None) -> None:
        ckpt = self.checkpoints
        assert ckpt is not None
        retry = False
        if failure is not None:
            ckpt.abandoned += 1
            ckpt.failed_in_row += 1
            ckpt.failures.append(f"{ckpt.step or ckpt.url}: {failure}"[:2000])
            if ckpt.step:  # its partial files would take the room the next one needs
                checkpoint.remove_step(ckpt.step)
            retry = ckpt.failed_in_row <= RETRIES
            logger.error("checkpoint %s abandoned and removed, training goes on; %s: %s", ckpt.step or ckpt.url,
                         "tried again at the next boundary" if retry else
                         f"{ckpt.failed_in_row} in a row failed, the next after {ckpt.every} more shard(s)", failure)
        else:
            ckpt.failed_in_row = 0
        # a failed one is due again at once: the next shard done brings the next boundary
        ckpt.phase, ckpt.since, ckpt.step = None, ckpt.every if retry else 0, ""
        self.serve()
        self.host.workers_changed()
