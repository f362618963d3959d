"""The training loop of a worker (``train_worker``): shards from the scheduler's task queue
until the job is done, each streamed as mini-batches (parsed and deduplicated ahead, in
threads of their own), the rows a batch touches pulled while earlier batches compute
(``TrainConfig.pipeline`` in flight), the gradient computed in numba and pushed, and a
shard reported done once its pushes are applied.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from paramserver.apps.ctr.depth import LINK_PROBES, PROBE_TIMEOUT_S, SETTLE_BATCHES, Depth
from paramserver.apps.ctr.models import to_rows
from paramserver.apps.ctr.ramp import ramped
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.client.client import Client
from paramserver.client.row_cache import RowCacheSpec
from paramserver.client.step_calls import steppable
from paramserver.data.prefetch import Prefetch
from paramserver.data.reader import Shard, read_batches
from paramserver.lifecycle.spec import Lifecycle
from paramserver.observe.progressive import Scores

PROGRESS_EVERY_S = 0.5  # a worker reports its progress this often (and the driver asks for the job's)
NAME_AHEAD = 1  # batches whose keys are named beyond those pulled
NAME_AGAIN = 64  # batches before keys are named again to servers that did not read ahead ...
ASK_KEYS = 1024  # ... and how many
#: mini-batches parsed and deduplicated ahead of the loop, at most, and their bytes: answers
#: come back in bursts (64 steps in flight, 16 a request), and each burst wants its next
#: batches ready (4 ahead: the loop waited 0.34-0.37 s of a 1.4 s job for them, its reader
#: thread idle meanwhile; 64: 0.13 s, +9 % examples/s, the worker's peak RSS +20 MB)
READ_AHEAD, READ_AHEAD_BYTES = 64, 32 << 20
#: steps go up to a quarter of the depth in one request (a step of several batches), so that
#: four are in flight and the worker and the server keep working side by side: the default job
#: (then 16 in flight, a step a request in envelopes) at 1, 2, 4 steps an envelope: 761 k, 792 k,
#: 812 k examples/s; all 16 in one: 631-652 k (each side idle while the other works through a
#: whole envelope).  At 64 in flight, 16 a request (2026-12-02): 64 in flight at a quarter 530 k
#: median over 4 runs, at an eighth 510 k, 32 at a quarter 518 k, 16 at a quarter 454 k
ENVELOPES = 4
#: ... and of at most this many key occurrences in all (the first batch always goes): the
#: default job's groups of 16 batches hold up to ~640 000; a --batch-size of 10^5 rows goes
#: one batch a request
GROUP_OCCURRENCES = 1 << 20


def train_worker(client: Client, cfg: TrainConfig) -> dict[str, Any]:
    """What every worker runs: shards from the task queue until the job is done."""
    t0 = time.perf_counter()
    trace: list[tuple[float, int, int, float]] = []  # (seconds, clock, examples, loss sum)

    def on_batch(clock: int, n: int, loss: float) -> None:
        trace.append((time.perf_counter() - t0, clock, n, loss))

    if RowCacheSpec.parse(cfg.row_cache):
        client.cache_rows(cfg.model.table, cfg.row_cache)
    done = _train_stream(client, cfg, on_batch)
    client.flush()  # what the row cache and the filters held back goes out before the driver scores the model
    first = time.time() - (time.perf_counter() - t0 - trace[0][0]) if trace else None  # wall clock
    return {**done, "bytes_sent": client.stats.bytes_sent, "bytes_received": client.stats.bytes_received,
            "filters": client.stats.filter_stats(), "keys": client.stats.keys,
            "row_cache": client.stats.row_cache_stats(), "rank": client.rank, "trace": trace, "first_batch_at": first}


def _shard_stream(client: Client, cfg: TrainConfig, settle: Callable[[], bool]) -> Iterator[tuple[Any, ...]]:
    """Every shard the scheduler gives this worker as one stream: ``(task, batch, uniq,
    inverse, settle)`` for each mini-batch, then ``(task, None, stats, None, False)`` to
    close the shard.  Runs in the reader thread, which asks for the next shard as soon as it
    has read the last one (the closing item is queued first: the shard can be reported done
    while the question waits) and parses on into it.  Batches grow from 1 example
    (``ramp_size``).  ``settle`` marks the job's last ``SETTLE_BATCHES`` batches where the
    pipeline may run deeper than 2 (``settle()``, asked at each batch): in the shard the
    scheduler handed out last, held back that many batches so that the last ones are known."""
    seen, distinct, last = 0, 0, 1  # examples so far; the last batch's distinct keys and examples
    while (task := client.job.next_shard()) is not None:
        stats: dict[str, Any] = {}
        held: deque[tuple[Any, ...]] = deque()
        # parsing in a thread of its own, deduplication in this one: the two kernels (the
        # GIL released) run at once, and neither waits for the other
        with Prefetch(read_batches(Shard.from_wire(task["shard"]), cfg.data, cfg.batch_size, stats)) as parsed:
            for batch in ramped(parsed, cfg.batch_size, cfg.batch_ramp, seen):
                seen += len(batch)
                uniq, inverse = batch.unique(distinct * len(batch) // max(1, last))
                distinct, last = uniq.size, len(batch)
                held.append((task, batch, uniq, inverse))
                if len(held) > (SETTLE_BATCHES if task.get("last") and settle() else 0):
                    yield (*held.popleft(), False)
        while held:
            yield (*held.popleft(), True)
        yield task, None, stats, None, False


def _train_stream(client: Client, cfg: TrainConfig,
                  on_batch: Callable[[int, int, float], None] | None = None) -> dict[str, Any]:
    """Train on the shard stream with ``cfg.pipeline`` pulls and pushes in flight.

    The rows for batch t are pulled while batches t-1 .. t-pipeline+1 compute, so a
    batch sees the pushes of all but the last ``pipeline - 1`` batches before it
    (bounded delay, as in Downpour SGD); ``pipeline=1`` is strictly sequential.
    A shard is reported done once its pushes are applied.  The reader thread reads on
    into the next shard meanwhile, so a shard boundary costs one drain of the pushes, not
    also a request for the next shard and its first parse; steps do not even drain
    (``_Pipeline.close_shard``).
    """
    # a factor model's loss grows with the depth of its reads; a step reads no stale rows
    stepping = _stepping(client, cfg)
    # an LR deepens where its reads are ASP's: a table gated by clocks (bsp, ssp:S) reads s + depth - 1 clocks
    # late, and keeps the 2 that --consistency's bound always came with
    ungated = cfg.table_spec().staleness == float("inf")
    depth = Depth(cfg.pipeline, deepens=(cfg.model.name == "lr" and ungated) or stepping, stale=not stepping)

    def time_link() -> None:
        depth.time_link(lambda: client.stats.round_trip_floor(LINK_PROBES, PROBE_TIMEOUT_S))

    # link: timed before the first batch, with nothing in flight, and before the reader asks settles();
    # steps keep STEP_DEPTH on any link (the floor is only reported, and their settles() is always False):
    # their link is timed while the reader reads the first batches, not before (4-18 ms of every job's start)
    if not stepping:
        time_link()
    with Prefetch(_shard_stream(client, cfg, depth.settles), READ_AHEAD, READ_AHEAD_BYTES, _item_bytes) as items:
        if stepping:
            time_link()
        return _train_items(client, cfg, items, on_batch, depth)


def _item_bytes(item: tuple[Any, ...]) -> int:
    """The bytes a ``_shard_stream`` item holds: its batch, distinct keys and their indices."""
    _, batch, uniq, inverse, _ = item
    if batch is None:  # a shard's end
        return 0
    vals = batch.held_vals
    return int(batch.keys.nbytes + (0 if vals is None else vals.nbytes) + batch.indptr.nbytes + batch.labels.nbytes
               + uniq.nbytes + inverse.nbytes)


def _stepping(client: Client, cfg: TrainConfig) -> bool:
    """Whether this worker trains its batches as steps (``client.steps``, ``--steps auto``): an
    LR or an FM whose table suits (``steppable``) on one server, so that a batch's keys are all
    on it, and no row cache.  Should servers join later, each step whose keys they split goes
    the classic way (``client/step_calls.py``)."""
    return (cfg.steps == "auto" and not RowCacheSpec.parse(cfg.row_cache)
            and steppable(cfg.table_spec(), cfg.model.name) and np.unique(client.admin.ring.owners).size == 1)


def _train_items(client: Client, cfg: TrainConfig, items: Prefetch,
                 on_batch: Callable[[int, int, float], None] | None, depth: Depth) -> dict[str, Any]:
    """Train on ``items`` (``_shard_stream``'s) until they run out; the totals of the shards done."""
    loop = _Pipeline(client, cfg, items, on_batch, depth)
    while True:
        iteration_start = time.perf_counter()
        loop.pull_ahead()
        if not loop.ahead:
            loop.done["pipeline_depth"] = loop.depth.now  # where auto or link went
            loop.done["round_trip_floor_ms"] = loop.depth.floor_ms  # what link measured (None: it did not)
            break
        (task, batch, uniq, inverse, _), pulled = loop.ahead.popleft()
        if batch is None:  # the shard's last push is out: report it done once applied
            loop.close_shard(task, uniq)
        else:
            loop.train(batch, uniq, inverse, pulled, iteration_start)
    loop._drain(0)  # the last shard's steps answered, and it reported done
    return loop.done


def key_stats(batch: Any, inverse: np.ndarray, n: int) -> np.ndarray:
    """Each distinct key's shows (examples it is in) and clicks (those labelled 1) in a batch."""
    labels = np.repeat(batch.labels > 0, np.diff(batch.indptr))
    return np.column_stack([np.bincount(inverse, minlength=n), np.bincount(inverse, labels, minlength=n)]
                           ).astype(np.float32)


class _ShardEnd:
    """A shard's end in the steps in flight: reported done once the steps before it are answered."""

    __slots__ = ("task", "stats")

    def __init__(self, task: Any, stats: dict[str, Any]) -> None:
        self.task, self.stats = task, stats


class _Pipeline:
    """The batches of ``_train_items`` in flight: those pulled ahead (``ahead``, each with
    its pulls or ``None`` for a shard's end, in stream order) and the pushes not yet
    acknowledged; the current shard's examples and loss, and what was last reported of
    them; the totals of the shards done (``done``)."""

    def __init__(self, client: Client, cfg: TrainConfig, items: Prefetch,
                 on_batch: Callable[[int, int, float], None] | None, depth: Depth) -> None:
        self.client, self.cfg, self.items, self.on_batch = client, cfg, items, on_batch
        # a deep model's MLP, pulled with each batch
        self.dense_keys = np.arange(cfg.model.dense_rows, dtype=np.uint64)
        self.ahead: deque[Any] = deque()  # (item, its pull or None), in stream order
        self.pushes: deque[Any] = deque()
        self.pulling, self.closing = 0, False  # pulls in `ahead`; a shard's end is in it
        self.depth = depth  # batches in flight (``--pipeline``: link, fixed or auto)
        self.settling = False  # the job's last batches, one at a time (``Depth.settles``)
        self.done: dict[str, Any] = {"examples": 0, "loss_sum": 0.0, "bad_lines": 0}
        self.examples, self.loss_sum = 0, 0.0  # of the current shard
        self.shown_examples, self.shown_loss, self.shown_at = 0, 0.0, time.monotonic()
        self.exhausted = False
        self.scores = Scores()  # progressive validation since the last report
        self.wire_shown = (0, 0)  # the filters' bytes in and out, as last reported
        self.held_shown = 0  # the row cache's sums not pushed, as last reported
        self.slow = client.rank == cfg.slow_rank and cfg.slow_factor > 1
        # a lifecycle's time: the examples the job trained (this worker's, times the workers; from where it resumed)
        self.timed = bool(cfg.lifecycle)
        self.counted = Lifecycle.parse(cfg.lifecycle).stats  # admission by shows and clicks: pushes carry them
        self.time_base = float(client.job.status().get("examples", 0)) if self.timed else 0.0
        # items taken from ``items`` ahead of their pulls, to name their keys (``_name_next``)
        self.taken: deque[Any] = deque()
        self.naming = cfg.prefetch  # until the servers answer that the table has no tiers
        self.reading = True  # the servers' last answer: some reads ahead (before any: as if)
        self.batches, self.name_at = 0, 0  # batches pulled; from which one to name keys again
        self.stepping = not depth.stale  # each batch one step (``client.steps``)
        self.ends = 0  # shards whose end is among the steps in flight, not yet reported done

    def _take(self) -> Any:
        """The next item of the stream (None at its end).  Before waiting for one, every shard
        whose steps are out is reported done once they are answered: the reader may be asking
        the scheduler for its next shard, which waits for those (the epoch's last)."""
        if self.taken:
            return self.taken.popleft()
        while self.ends and not self.items.ready():  # the oldest step (or end) at a time
            self._drain(len(self.pushes) - 1)
        return next(self.items, None)

    def _name_next(self) -> None:
        """Name the next batches' keys to the servers (``Client.prefetch``), up to
        ``NAME_AHEAD`` beyond those pulled: a table with a memory budget reads those on
        disk in the background meanwhile.  Only batches already parsed, and only while
        some server holds the table in tiers.  While none reads ahead (its disk is fast
        enough), one batch in ``NAME_AGAIN``, and ``ASK_KEYS`` of its keys: enough to
        reach every server and hear whether its disk is still fast."""
        while (self.naming and self.batches >= self.name_at and len(self.taken) < NAME_AHEAD
               and not self.exhausted and (not self.taken or self.taken[-1] is not None) and self.items.ready()):
            item = next(self.items, None)
            self.taken.append(item)
            if item is None or item[1] is None:
                continue
            keys = item[2] if self.reading else item[2][:ASK_KEYS]
            if not self.reading:
                self.name_at = self.batches + NAME_AGAIN
            self.client.prefetch(self.cfg.model.table, keys).add_done_callback(self._named)

    def _named(self, future: Any) -> None:
        if future.cancelled() or future.exception() is not None:  # (the pull of the same keys says why)
            return
        found = future.result()
        self.naming, self.reading = found.tiered, found.reading
        if found.reading:
            self.name_at = 0
        elif self.name_at <= self.batches:
            self.name_at = self.batches + NAME_AGAIN

    def pull_ahead(self, wait: bool = True) -> None:
        """Pull up to a shard's end, not past it: the next shard's pulls go out once this
        shard's pushes are applied, so the updates a pull sees do not depend on timing
        (one worker trains deterministically), and a next shard that waits for this
        shard_done (a new epoch, a checkpoint) cannot wait on us.  ``wait=False``: only
        the batches already parsed (the loop's next turn pulls the rest)."""
        client, model = self.client, self.cfg.model
        while (not self.exhausted and self.pulling < self.in_flight() and not self.closing
               and (wait or self.taken or self.items.ready())):
            item = self._take()
            if item is None:
                self.exhausted = True
            elif item[1] is None:
                self.ahead.append((item, None))
                self.closing = True
            elif item[4] and not self.settling and self.pulling:  # the first to settle: pulled once the
                self.settling = True  # batches in flight are pushed, so that it sees them all
                self.taken.appendleft(item)
                break
            elif self.stepping:  # nothing to pull: the step goes out in its turn (``_step``)
                self.settling = self.settling or item[4]
                self.ahead.append((item, None))
                self.pulling += 1
                self.batches += 1
            else:
                self.settling = self.settling or item[4]
                rows = client.pull(model.table, item[2])
                self.ahead.append((item, (rows, client.pull(model.dense_table, self.dense_keys)
                                          if self.dense_keys.size else None)))
                self.pulling += 1
                self.batches += 1
        self._name_next()

    def in_flight(self) -> int:
        """Batches to keep in flight now: the depth, or 1 while the job's last ones settle."""
        return 1 if self.settling else self.depth.now

    def _progress_counts(self) -> dict[str, float]:
        """The filters' bytes in and out since the last report (none: the job has no filters), and
        how the row cache's sums not yet pushed changed (none: no cache): a worker that dies loses
        those, and the scheduler counts them from what was reported last (``tasks.LIVE``)."""
        before, after = self.client.stats.wire_totals()
        last, self.wire_shown = self.wire_shown, (before, after)
        wire: dict[str, float] = {"wire_bytes_in": before - last[0], "wire_bytes_out": after - last[1]} \
            if before else {}
        held = self.client.stats.sums_held()
        if held is None:
            return wire
        change, self.held_shown = held - self.held_shown, held
        return {**wire, "sums_held": change} if change else wire

    def _drain(self, keep: int) -> None:
        """Wait for the oldest pushes (and steps) until at most ``keep`` are unacknowledged;
        a step's batch is counted once its answer is in, and a shard whose last step is
        answered is reported done (``_ShardEnd``)."""
        while len(self.pushes) > keep:
            pushes, batch = self.pushes.popleft()
            done = [push.result(timeout=300) for push in pushes]  # errors surface here
            if isinstance(batch, _ShardEnd):
                self.ends -= 1
                self._shard_done(batch.task, batch.stats)
            elif batch is not None:
                preds, loss = done[0]
                self.scores.add(preds, batch.labels, loss)
                self._count(len(batch), loss)

    def close_shard(self, task: Any, stats: dict[str, Any]) -> None:
        """The shard's last push is out: report it done once every push is applied.  Steps
        go on into the next shard meanwhile: the one server takes them in order, so the next
        shard's steps read what this shard's applied whatever the timing, and the shard is
        reported done when its last step's answer is in (``_drain`` meets its end there)
        rather than after a drain that left the server idle (16 shards of 16 MiB: 0.2 s of a
        2.2 s job).  Pulls and pushes drain here: the next shard's pulls must see this
        shard's pushes."""
        self.closing = False
        if self.stepping:
            self.pushes.append(([], _ShardEnd(task, stats)))
            self.ends += 1
            return
        self.client.push_held()  # the row cache's sums: a shard is done once all it trained on is applied
        self._drain(0)
        self._shard_done(task, stats)

    def _shard_done(self, task: Any, stats: dict[str, Any]) -> None:
        """Every push of ``task`` is applied: its progress and its end reported, its counters
        added to the job's totals."""
        job = self.client.job
        job.report_progress(examples=self.examples - self.shown_examples, loss_sum=self.loss_sum - self.shown_loss,
                            scores=self.scores.take(), **self._progress_counts())
        job.shard_done(task, examples=self.examples, loss_sum=self.loss_sum, bad_lines=stats["bad_lines"],
                       bytes=stats.get("bytes", 0),  # and a stream's file changed, its shard skipped (reader.py)
                       **{k: stats[k] for k in ("skipped_shards", "skipped_bytes", "skipped") if k in stats})
        self.done["examples"] += self.examples
        self.done["loss_sum"] += self.loss_sum
        self.done["bad_lines"] += stats["bad_lines"]
        self.examples, self.loss_sum, self.shown_examples, self.shown_loss = 0, 0.0, 0, 0.0

    def train(self, batch: Any, uniq: np.ndarray, inverse: np.ndarray, pulled: tuple[Any, Any],
              iteration_start: float) -> None:
        """One mini-batch: its gradient from the rows pulled, pushed (at most
        ``cfg.pipeline`` pushes unacknowledged), the clock ticked, the progress reported."""
        client, cfg, model, dense_keys = self.client, self.cfg, self.cfg.model, self.dense_keys
        self.pulling -= 1
        if pulled is None:
            self._step(batch, uniq, inverse, iteration_start)
            return
        rows, dense = pulled
        waiting = time.perf_counter()
        got = rows.result(timeout=300), None if dense is None else dense.result(timeout=300)
        self.depth.waited(time.perf_counter() - waiting, time.perf_counter() - iteration_start)
        grads, loss, dense_grads, p = model.scored_step(batch, inverse, *got)
        self.scores.add(p, batch.labels, loss)  # scored before its own update: progressive validation
        if self.slow:  # a straggler, for consistency benchmarks: each batch takes factor x as long
            time.sleep((cfg.slow_factor - 1) * (time.perf_counter() - iteration_start))
        self._drain(self.in_flight() - 1)
        if self.timed:
            trained = self.done["examples"] + self.examples + len(batch)
            client.set_time(self.time_base + trained * max(client.num_workers, 1))
        stats = key_stats(batch, inverse, uniq.shape[0]) if self.counted else None
        with client.together():  # the push and the next batch's pull: one message to each server
            self.pushes.append(([client.push(model.table, uniq, grads, distinct=True, stats=stats)] + (
                [] if dense_grads is None else
                [client.push(model.dense_table, dense_keys, to_rows(dense_grads, dense_keys.size), distinct=True)]),
                None))
            client.clock()
            self.pull_ahead(wait=False)
        self._count(len(batch), loss)

    def _step(self, batch: Any, uniq: np.ndarray, inverse: np.ndarray, iteration_start: float) -> None:
        """One mini-batch as a step (``client.steps``): sent once fewer than the depth are
        unanswered, counted when its answer is in (``_drain``).  The batches ready behind it go
        with it as one step of several (``client.steps.take_many``), as many as the depth has
        room for, up to a quarter of it (``ENVELOPES``): steps answered in a burst free room in
        a burst, and a request's costs (building and encoding it, a wake-up of each side's
        threads, a send, a receive, a turn of the server's loop, the checks, the answer and its
        future) are then paid once for them all.  The server takes the batches one by one, in
        order, as if each had come alone: the same rows read, the same model."""
        client = self.client
        self.pulling -= 1
        waiting = time.perf_counter()
        self._drain(self.in_flight() - 1)
        while self.pushes and all(step.done() for step in self.pushes[0][0]):  # answered already: room
            self._drain(len(self.pushes) - 1)
        self.depth.waited(time.perf_counter() - waiting, time.perf_counter() - iteration_start)
        if self.slow:
            time.sleep((self.cfg.slow_factor - 1) * (time.perf_counter() - iteration_start))
        group, size = [(batch, uniq, inverse)], inverse.shape[0]
        room = min(self.in_flight() - len(self.pushes) - 1, self.in_flight() // ENVELOPES - 1)
        for _ in range(room):
            if not self.ahead:
                self.pull_ahead(wait=False)
            if not self.ahead or self.ahead[0][0][1] is None:  # none ready, or a shard's end
                break
            (_, batch, uniq, inverse, _), _ = self.ahead[0]
            size += inverse.shape[0]
            if size > GROUP_OCCURRENCES:  # big batches (--batch-size): a request of a few MB at most
                break
            self.ahead.popleft()
            self.pulling -= 1
            group.append((batch, uniq, inverse))
        with client.together():
            self._send_steps(group)
            self.pull_ahead(wait=False)

    def _send_steps(self, group: list[tuple[Any, np.ndarray, np.ndarray]]) -> None:
        """The batches of ``group`` sent as one step of several (``client.steps.take_many``), or
        one step each where the table's lifecycle stamps each batch with its own time; each
        batch's clock finished."""
        client, cfg = self.client, self.cfg
        if self.timed:
            for batch, uniq, inverse in group:
                client.set_time(self.time_base + (self.done["examples"] + self.examples + len(batch))
                                * max(client.num_workers, 1))
                self.pushes.append(([client.steps.take(cfg.model.table, uniq, inverse, batch.indptr, batch.values(),
                                                       batch.labels, model=cfg.model.name, l2=cfg.model.l2)], batch))
                client.clock()
            return
        stepped = client.steps.take_many(cfg.model.table,
                                         [(u, inv, b.indptr, b.values(), b.labels) for b, u, inv in group],
                                         model=cfg.model.name, l2=cfg.model.l2)
        for (batch, _, _), future in zip(group, stepped, strict=True):
            self.pushes.append(([future], batch))
        client.clock(len(group))  # a clock a batch, finished together

    def _count(self, n: int, loss: float) -> None:
        """A batch of ``n`` examples trained, its summed loss ``loss``: counted, and the
        progress reported when it is due."""
        client = self.client
        if self.on_batch is not None:
            self.on_batch(client.current_clock, n, loss)
        self.examples += n
        self.loss_sum += loss
        if time.monotonic() - self.shown_at > PROGRESS_EVERY_S:
            client.job.report_progress(examples=self.examples - self.shown_examples,
                                       loss_sum=self.loss_sum - self.shown_loss, scores=self.scores.take(),
                                       **self._progress_counts())
            self.shown_examples, self.shown_loss, self.shown_at = self.examples, self.loss_sum, time.monotonic()
