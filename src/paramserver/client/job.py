"""A job's shard queue, as a node sees it: ``client.job``.

The scheduler hands data shards out one at a time (``scheduler/tasks.py``): a driver
starts a job with its shards, workers take the next one until none is left and report
each done with its counters, and anyone can read the job's status.  A worker that dies
hands its shard back to the queue.

Example:
    >>> client.job.start(make_shards(["train.tsv"]), epochs=2)       # doctest: +SKIP
    >>> while (task := client.job.next_shard()) is not None:         # doctest: +SKIP
    ...     examples = train_on(task["shard"])
    ...     client.job.shard_done(task, examples=examples)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paramserver.wire.message import Op

if TYPE_CHECKING:
    from paramserver.client.caller import Caller
    from paramserver.client.sync_calls import Clocks


class Job:
    """The job API of one ``Client``: every call goes to the scheduler."""

    def __init__(self, caller: Caller, clocks: Clocks) -> None:
        self._caller, self._clocks = caller, clocks
        self.reported: dict[str, float] = {}  # what this client's report_progress added up to

    def start(self, shards: list[Any], epochs: int = 1, *, checkpoint: dict[str, Any] | None = None,
              resume: dict[str, Any] | None = None, stream: str | None = None) -> None:
        """Give the scheduler the shards to hand out, ``epochs`` times over; or, with
        ``stream`` (its source's URL), start a job whose shards are added as they arrive
        (``add``).

        ``checkpoint={"url": URL, "every": N, "seconds": S}``: the scheduler checkpoints
        every table at a clock boundary after every N shards done (or S seconds), with the
        job's progress in the manifest.  ``resume``: the ``"job"`` part of such a manifest
        (epoch, shards done, totals; a stream's position and pending shards).  A local
        checkpoint path is made absolute here (the scheduler and the servers may each run
        in another working directory).
        """
        header: dict[str, Any] = {"op": Op.JOB_START.value, "shards": [s.to_wire() for s in shards],
                                  "epochs": epochs}
        if stream is not None:
            header["stream"] = stream
        if checkpoint is not None:
            from paramserver.checkpoint.store import local_url

            header["checkpoint"] = {**checkpoint, "url": local_url(checkpoint.get("url"), "checkpoint url")} \
                if isinstance(checkpoint, dict) else checkpoint
        if resume is not None:
            header["resume"] = resume
        self._caller.rpc.call(self._scheduler, header)

    def add(self, shards: list[Any], position: Any, close: bool = False) -> None:
        """A stream job's new shards (in the source's order), the source's position after
        them (what a checkpoint records), and ``close`` once no more will come."""
        self._caller.rpc.call(self._scheduler, {"op": Op.JOB_ADD.value, "shards": [s.to_wire() for s in shards],
                                             "position": position, "close": close})

    def next_shard(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """The next shard to process (``{"shard_id", "shard", "epoch"}``), None when done.

        Blocks while every remaining shard of the epoch is held by other workers.  A worker
        that waited holding none (the answer's ``rejoin``; a scheduler that does not say:
        always) rejoins the vector clocks at the live servers' minimum.  One that asked while
        it finished a shard never left them, and takes its shard at once: the servers' clocks
        are a question to every server, behind the steps queued there (20-50 ms at each of a
        default job's shard ends, its reader stalled meanwhile).
        """
        answer: dict[str, Any] = self._caller.rpc.call(self._scheduler, {"op": Op.NEXT_SHARD.value},
                                                    timeout_s=timeout_s)
        if answer.get("done"):
            return None
        if self._caller.role == "worker" and answer.get("rejoin", True):  # idle workers left the vector clocks
            self._clocks.resync()
        return answer

    def shard_done(self, task: dict[str, Any], **stats: float) -> None:
        """Report a shard finished, with counters (``examples``, ``loss_sum``, ...): its
        last clock taken by the servers first (a checkpoint or the job's end may follow)."""
        self._clocks.send_ticks(wait=True, landed=True)
        self._caller.rpc.call(self._scheduler, {"op": Op.SHARD_DONE.value, "shard_id": task["shard_id"],
                                             "epoch": task["epoch"], "stats": stats})

    def report_progress(self, scores: dict[str, Any] | None = None, **stats: float) -> None:
        """Add to the job's live counters (fire and forget; for progress displays), with
        the examples' scores before training on them (``observe.progressive.Scores.take``)."""
        for k, v in stats.items():  # this worker's own, for its --metrics-port
            self.reported[k] = self.reported.get(k, 0.0) + float(v)
        header: dict[str, Any] = {"op": Op.PROGRESS.value, "stats": stats}
        if scores is not None:
            header["scores"] = scores
        self._caller.io.submit(self._scheduler, header)

    def status(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Epoch, shards done and running, totals, live counters, checkpoints, losses and
        failovers (``docs/protocol.md``, ``job_status``).

        Raises:
            TimeoutError: no answer within ``timeout_s`` (None: wait as long as the client
                lives; a scheduler silent past the heartbeat timeout fails the call)."""
        job: dict[str, Any] = self._caller.rpc.call(self._scheduler, {"op": Op.JOB_STATUS.value}, timeout_s)["job"]
        return job

    @property
    def _scheduler(self) -> str:
        return str(self._caller.config.scheduler)
