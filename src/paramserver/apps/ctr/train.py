"""Training, prediction and evaluation of sparse CTR models.

Run: ``paramserver train --model lr --format criteo --data train.tsv.gz --test test.tsv.gz``

The driver cuts the inputs into shards, hands them to the scheduler's task queue and
runs ``train_worker`` on every worker: each asks for a shard, streams its mini-batches,
pulls the rows a batch touches (the pull of batch t+1 is in flight while batch t is
computed), computes the gradient in numba and pushes it.  The driver then scores the
test set with a pull and, with ``--save``, writes the model directory:

    model.json     model, table spec, data format
    table.npz      keys (uint64) and values (float32 [n, dim])

``predict`` and ``eval`` load that directory and need no cluster.

With ``checkpoint_dir`` the scheduler checkpoints the tables and the job's progress every
``checkpoint_every`` shards (at a clock boundary); ``resume`` restores the newest complete
checkpoint of a folder, onto any number of servers, and goes on from its progress.  A
worker that dies hands its shard back to the queue and the others finish the job.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from paramserver._runtime.warm import load_numba
from paramserver.apps.ctr.deep import DENSE_BLOCK
from paramserver.apps.ctr.modelfile import dense_vector, metrics, model_meta, save_model
from paramserver.apps.ctr.models import Model, to_rows
from paramserver.apps.ctr.warmup import warm_job
from paramserver.checkpoint import store as checkpoint
from paramserver.client.client import Client
from paramserver.client.losses import COMMAND_FIX, loss_line, tolerating_loss
from paramserver.data.files import check_output, is_plain_local
from paramserver.data.prefetch import Prefetch
from paramserver.data.reader import (
    Batch,
    DataFormat,
    Shard,
    _concat,
    _slice,
    expand,
    make_shards,
    read_all,
    read_batches,
)
from paramserver.errors import CheckpointError, ConfigError, DataLossError, WorkerError
from paramserver.routing.hashing import MAX_KEY_BITS
from paramserver.tables.spec import TableSpec

PROGRESS_EVERY_S = 0.5
LAYOUTS = ("auto", "hash", "dense")
DENSE_AUTO_BYTES = 1 << 30  # --table-layout auto: dense when every copy together fits in this


@dataclass(frozen=True)
class TrainConfig:
    model: Model = field(default_factory=Model)
    data: DataFormat = field(default_factory=DataFormat)
    optimizer: Any = None  # None: the model's default
    epochs: int = 1
    batch_size: int = 4000  # the largest mini-batch (see batch_ramp)
    batch_ramp: float = 1.0  # a batch is at most ramp * sqrt(examples this worker trained on) (0: off)
    seed: int = 0
    pipeline: int = 2  # batches in flight (pulls ahead, pushes unacknowledged)
    consistency: Any = "asp"  # bsp | ssp:S | asp; a worker's clock ticks once a batch
    replicas: int = 1  # copies of every vnode (2 or 3: the job survives a server's death)
    layout: str = "auto"  # the model table's: hash | dense (keys < 2**hash_bits) | auto (see key_bits)
    slow_rank: int = -1  # benchmarks: this worker sleeps ...
    slow_factor: float = 1.0  # ... (factor - 1) x its compute time each batch

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"--epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        if not (self.batch_ramp >= 0 and math.isfinite(self.batch_ramp)):
            raise ConfigError(f"--batch-ramp must be a number >= 0 (0: no ramp), got {self.batch_ramp}")
        if not 1 <= self.pipeline <= 64:
            raise ConfigError(f"--pipeline must be in [1, 64], got {self.pipeline}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"--table-layout must be one of {LAYOUTS}, got {self.layout!r}")

    def table_spec(self) -> TableSpec:
        spec = TableSpec(self.model.table, self.model.dim,
                         optimizer=self.optimizer or self.model.default_optimizer(),
                         initializer=self.model.initializer(), seed=self.seed,
                         consistency=self.consistency, replicas=self.replicas)
        return replace(spec, key_bits=self.key_bits(spec))

    def dense_spec(self) -> TableSpec | None:
        """A deep model's MLP table (``None`` for lr and fm): the consistency and copies of
        the model's table, its own rule."""
        if self.model.deep is None:
            return None
        return TableSpec(self.model.dense_table, DENSE_BLOCK, optimizer=self.model.dense_optimizer(),
                         initializer={"name": "zeros"}, seed=self.seed, consistency=self.consistency,
                         replicas=self.replicas, key_bits=max(int(self.model.dense_rows - 1).bit_length(), 1))

    def key_bits(self, spec: TableSpec) -> int:
        """The table's ``key_bits``: folded features (``--hash-bits B``) make a key space of
        2**B, which ``dense`` stores as arrays; ``auto`` does so when all its copies
        take at most ``DENSE_AUTO_BYTES`` (2**24 dim-1 FTRL rows take 256 MiB)."""
        bits = self.data.hash_bits if self.data.hash_bits < 64 else 0
        if self.layout == "hash":
            return 0
        if self.layout == "dense":
            if not 1 <= bits <= MAX_KEY_BITS:
                raise ConfigError(f"--table-layout dense needs --hash-bits in [1, {MAX_KEY_BITS}] (the key "
                                  f"space), got {self.data.hash_bits}; fold the features or use --table-layout "
                                  "hash")
            return bits
        if 1 <= bits <= MAX_KEY_BITS and (1 << bits) * 4 * (spec.width + 1) * self.replicas <= DENSE_AUTO_BYTES:
            return bits
        return 0


def train_worker(client: Client, cfg: TrainConfig) -> dict[str, Any]:
    """What every worker runs: shards from the task queue until the job is done."""
    t0 = time.perf_counter()
    trace: list[tuple[float, int, int, float]] = []  # (seconds, clock, examples, loss sum)

    def on_batch(clock: int, n: int, loss: float) -> None:
        trace.append((time.perf_counter() - t0, clock, n, loss))

    done = _train_stream(client, cfg, on_batch)
    first = time.time() - (time.perf_counter() - t0 - trace[0][0]) if trace else None  # wall clock
    return {**done, "bytes_sent": client.bytes_sent, "bytes_received": client.bytes_received,
            "rank": client.rank, "trace": trace, "first_batch_at": first}


def process_start_time() -> float:
    """When this process started (wall clock, from /proc; the import of this module where
    that is missing): start-up is measured from there, interpreter and imports included."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - since_start
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED_AT


_IMPORTED_AT = time.time()


RAMP_FROM = 1 << 16  # past 65 536 examples ...
RAMP_FLOOR = 16  # ... a batch is at least 1/16 of the examples seen: big jobs reach --batch-size at once


def ramp_size(seen: int, batch_size: int, ramp: float) -> int:
    """The mini-batch size after ``seen`` examples: ``ramp * sqrt(seen)`` (and past 65 536
    examples at least ``seen / 16``), from 1 up to ``batch_size`` (``ramp`` 0: always
    ``batch_size``).

    A batch's examples are all computed on the same (stale) weights, and its summed
    gradient is applied as one step.  Early on the model changes fast and one step of
    1000 examples overshoots what 1000 per-example steps would do; with per-coordinate
    rates that fall like 1/sqrt(examples) (AdaGrad, FTRL), a batch stays within the
    per-example learner's reach while it grows no faster than sqrt(examples seen).  So
    the first examples are learnt one at a time and a batch reaches 100 after 10 000
    examples.  Past 65 536 examples (where the model has settled) the floor seen/16
    takes over: a batch of 4096 there (the default ``--batch-size`` 4000 at once), and a
    larger ``--batch-size`` is reached growing by 1/16 a batch.  A job of 10^6 examples
    then takes ~750 batches (~510 of them in its first 65 536 examples), against ~1 200
    with the earlier floor seen/256, for 20-30 % more examples a second and the same test
    log loss (heavy-tailed shape, docs/benchmarks.md); the small data sets, where the sqrt
    rule matters, never reach the floor.
    """
    if ramp <= 0:
        return batch_size
    floor = seen / RAMP_FLOOR if seen >= RAMP_FROM else 0
    return max(1, min(batch_size, int(max(ramp * math.sqrt(seen), floor))))


def ramped(batches: Iterator[Batch], batch_size: int, ramp: float, seen: int = 0) -> Iterator[Batch]:
    """``batches`` re-cut to ``ramp_size``: the sizes depend on the examples seen alone, not
    on where the reader's batches end (a piece may join the end of one and the start of
    the next); once the ramp reaches ``batch_size`` the reader's batches pass unchanged."""
    held: list[Batch] = []  # the start of the next piece, from earlier batches
    have = 0
    for batch in batches:
        lo, n = 0, len(batch)
        while lo < n:
            size = ramp_size(seen, batch_size, ramp)
            if not held and lo == 0 and size == n:
                piece, lo = batch, n  # no copy
            elif have + n - lo < size:  # too few here: they start the next piece
                held.append(_slice(batch, lo, n))
                have, lo = have + n - lo, n
                continue
            else:
                tail = _slice(batch, lo, lo + size - have)
                piece = _concat([*held, tail]) if held else tail
                held, have, lo = [], 0, lo + size - have
            seen += len(piece)
            yield piece
    if held:
        yield _concat(held)


def _shard_stream(client: Client, cfg: TrainConfig) -> Iterator[tuple]:
    """Every shard the scheduler gives this worker as one stream: ``(task, batch, uniq,
    inverse)`` for each mini-batch, then ``(task, None, stats, None)`` to close the shard.
    Runs in the reader thread, which asks for the next shard as soon as it has read the
    last one (the closing item is queued first: the shard can be reported done while the
    question waits) and parses on into it.  Batches grow from 1 example (``ramp_size``)."""
    seen, distinct, last = 0, 0, 1  # examples so far; the last batch's distinct keys and examples
    while (task := client.job.next_shard()) is not None:
        stats: dict[str, Any] = {}
        # parsing in a thread of its own, deduplication in this one: the two kernels (the
        # GIL released) run at once, and neither waits for the other
        with Prefetch(read_batches(Shard.from_wire(task["shard"]), cfg.data, cfg.batch_size, stats)) as parsed:
            for batch in ramped(parsed, cfg.batch_size, cfg.batch_ramp, seen):
                seen += len(batch)
                uniq, inverse = batch.unique(distinct * len(batch) // max(1, last))
                distinct, last = uniq.size, len(batch)
                yield task, batch, uniq, inverse
        yield task, None, stats, None


def _train_stream(client: Client, cfg: TrainConfig,
                  on_batch: Callable[[int, int, float], None] | None = None) -> dict[str, Any]:
    """Train on the shard stream with ``cfg.pipeline`` pulls and pushes in flight.

    The rows for batch t are pulled while batches t-1 .. t-pipeline+1 compute, so a
    batch sees the pushes of all but the last ``pipeline - 1`` batches before it
    (bounded delay, as in Downpour SGD); ``pipeline=1`` is strictly sequential.
    A shard is reported done once its pushes are applied.  The reader thread reads on
    into the next shard meanwhile, so a shard boundary costs one drain of the pushes, not
    also a request for the next shard and its first parse.
    """
    with Prefetch(_shard_stream(client, cfg)) as items:  # parsed and deduplicated ahead
        return _train_items(client, cfg, items, on_batch)


def _train_items(client: Client, cfg: TrainConfig, items: Prefetch,
                 on_batch: Callable[[int, int, float], None] | None) -> dict[str, Any]:
    table, model = cfg.model.table, cfg.model
    dense_keys = np.arange(model.dense_rows, dtype=np.uint64)  # a deep model's MLP, pulled with each batch
    ahead: deque = deque()  # (item, its pull or None), in stream order
    pushes: deque = deque()
    pulling, closing = 0, False  # pulls in `ahead`; a shard's end is in it
    done = {"examples": 0, "loss_sum": 0.0, "bad_lines": 0}
    examples, loss_sum = 0, 0.0  # of the current shard
    shown_examples, shown_loss, shown_at = 0, 0.0, time.monotonic()
    exhausted = False
    slow = client.rank == cfg.slow_rank and cfg.slow_factor > 1
    while True:
        iteration_start = time.perf_counter()
        # Pull up to a shard's end, not past it: the next shard's pulls go out once this
        # shard's pushes are applied, so the updates a pull sees do not depend on timing
        # (one worker trains deterministically), and a next shard that waits for this
        # shard_done (a new epoch, a checkpoint) cannot wait on us.
        while not exhausted and pulling < cfg.pipeline and not closing:
            item = next(items, None)
            if item is None:
                exhausted = True
            elif item[1] is None:
                ahead.append((item, None))
                closing = True
            else:
                ahead.append((item, (client.pull(table, item[2]),
                                     client.pull(model.dense_table, dense_keys) if dense_keys.size else None)))
                pulling += 1
        if not ahead:
            break
        (task, batch, uniq, inverse), pulled = ahead.popleft()
        if batch is None:  # the shard's last push is out: report it done once applied
            stats, closing = uniq, False
            while pushes:
                for push in pushes.popleft():
                    push.result(timeout=300)  # errors surface here
            client.job.report_progress(examples=examples - shown_examples, loss_sum=loss_sum - shown_loss)
            client.job.shard_done(task, examples=examples, loss_sum=loss_sum, bad_lines=stats["bad_lines"],
                                  bytes=stats.get("bytes", 0))
            done["examples"] += examples
            done["loss_sum"] += loss_sum
            done["bad_lines"] += stats["bad_lines"]
            examples, loss_sum, shown_examples, shown_loss = 0, 0.0, 0, 0.0
            continue
        pulling -= 1
        rows, dense = pulled
        grads, loss, dense_grads = model.step(batch, inverse, rows.result(timeout=300),
                                              None if dense is None else dense.result(timeout=300))
        if slow:  # a straggler, for consistency benchmarks: each batch takes factor x as long
            time.sleep((cfg.slow_factor - 1) * (time.perf_counter() - iteration_start))
        while len(pushes) >= cfg.pipeline:
            for push in pushes.popleft():
                push.result(timeout=300)  # errors surface here
        pushes.append([client.push(table, uniq, grads, distinct=True)] + (
            [] if dense_grads is None else
            [client.push(model.dense_table, dense_keys, to_rows(dense_grads, dense_keys.size), distinct=True)]))
        client.clock()
        if on_batch is not None:
            on_batch(client.current_clock, len(batch), loss)
        examples += len(batch)
        loss_sum += loss
        if time.monotonic() - shown_at > PROGRESS_EVERY_S:
            client.job.report_progress(examples=examples - shown_examples, loss_sum=loss_sum - shown_loss)
            shown_examples, shown_loss, shown_at = examples, loss_sum, time.monotonic()
    return done


def _merge_consistency(per_server: list[dict[str, Any]]) -> dict[str, Any]:
    """Staleness readers saw, over all servers: histogram, parked pulls and seconds."""
    hist: dict[str, int] = {}
    for s in per_server:
        for k, v in s["staleness_histogram"].items():
            hist[k] = hist.get(k, 0) + v
    return {"staleness_histogram": hist, "max_gap": max((s["max_gap"] for s in per_server), default=0),
            "parked_pulls": sum(s["parked_pulls"] for s in per_server),
            "parked_seconds": sum(s["parked_seconds"] for s in per_server)}


def _read_niced(paths: list[str], fmt: DataFormat) -> Batch:
    """``read_all`` at the lowest CPU priority (Linux gives a thread its own niceness): the
    test rows read while the job starts and trains give way to the nodes."""
    if sys.platform.startswith("linux"):  # elsewhere a thread id is no process id
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass
    return read_all(paths, fmt)


def _core_to_spare(servers: int, workers: int) -> bool:
    """Whether this machine has a core for reading the test rows while the job runs, beside
    one for each local node and the driver.  Without one, they are read once the job is
    done: on 2 cores, reading 10^5 test rows alongside a 1 + 1 job cost it 5 % of its
    examples/s and 0.02 s of its first example (6 interleaved runs each), and the whole
    command 0.1 s when read after."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores > servers + workers + 1


def _check_test_head(paths: list[str], fmt: DataFormat) -> None:
    """Parse the first rows of every test file (up to 1 MiB of a plain one): a wrong format
    or a malformed first line is said before the job, even when the rest is read after it."""
    load_numba()  # numba's target as the nodes get it (a first kernel call loads it with a 0.15 s BLAS probe)
    for path in expand(paths):
        end = min(os.path.getsize(path), 1 << 20) if is_plain_local(path) else -1
        next(read_batches(Shard(path, 0, end), fmt, 4096), None)  # dropped at once: its file is closed


def score(client: Client, model: Model, batch: Batch) -> np.ndarray:
    uniq, inverse = batch.unique()
    rows = client.pull(model.table, uniq).result(timeout=600)
    return model.predict(batch, inverse, rows, pull_dense(client, model))


def pull_dense(client: Client, model: Model) -> np.ndarray | None:
    """A deep model's MLP, flat (``None`` for lr and fm)."""
    if model.deep is None:
        return None
    keys = np.arange(model.dense_rows, dtype=np.uint64)
    return dense_vector(model, keys, client.pull(model.dense_table, keys).result(timeout=600))


# ---- the driver --------------------------------------------------------------------


def run_training(cfg: TrainConfig, data: list[str], test: list[str], *, servers: int, workers: int,
                 save: str | None = None, shard_bytes: int = 16 << 20,
                 on_progress: Callable[[dict[str, Any], float], None] | None = None,
                 checkpoint_dir: str | None = None, checkpoint_every: int | None = None,
                 resume: str | None = None, setup: Callable[[Any], Any] | None = None,
                 cluster_options: dict[str, Any] | None = None, allow_loss: bool = False,
                 keep_checkpoints: int = 3, allow_unverified: bool = False) -> dict[str, Any]:
    """Train on a fresh local cluster; return the report (see ``docs``).

    Args:
        checkpoint_dir: checkpoint the tables and the job's progress under this URL ...
        checkpoint_every: ... every N shards done (default: once an epoch).
        resume: a checkpoint folder (its newest complete step) or step written by a
            job with ``checkpoint_dir``: restore it and go on from its progress.  The data
            must cut into the same shards, the model and optimiser must be the same.
        setup: called with the ``LocalCluster`` once the table exists (restored, when
            resuming), before the job starts.
        cluster_options: more ``LocalCluster`` arguments (heartbeats, log level).
        allow_loss: finish (and report the loss) when a server dies with vnodes of a table
            that has no backup, instead of failing with ``DataLossError``.
        keep_checkpoints: with ``checkpoint_dir``, keep only the newest N complete steps
            there (0: keep all).
        allow_unverified: ``resume`` from a first-format checkpoint, whose files have no
            sha256 to check (refused otherwise; ``--allow-unverified-checkpoint``).
    """
    from paramserver.cluster.launch import open_cluster

    check_job(servers, workers, shard_bytes)
    if isinstance(keep_checkpoints, bool) or not isinstance(keep_checkpoints, int) or keep_checkpoints < 0:
        raise ConfigError(f"--keep-checkpoints must be a whole number >= 0 (0: keep all), got {keep_checkpoints!r}")
    check_output(save, "--save", folder=True)  # every output now, not after the job
    check_output(checkpoint_dir, "--checkpoint-dir", folder=True)
    shards = make_shards(data, shard_bytes)
    spec, dense_spec = cfg.table_spec(), cfg.dense_spec()
    job_checkpoints = _checkpoint_option(checkpoint_dir, checkpoint_every, len(shards))
    if job_checkpoints is not None:  # eval and predict read a checkpoint with these
        job_checkpoints["meta"] = model_meta(cfg.model, cfg.data)
    step, progress = _resume_point(resume, shards, spec, cfg, data, shard_bytes, allow_unverified) if resume \
        else (None, None)
    overlap = _core_to_spare(servers, workers)  # else the test rows are read after the job
    if test:
        make_shards(test, shard_bytes)  # the test files exist: said now, not after training
        if not overlap:
            _check_test_head(test, cfg.data)
    # the nodes are forked once this process has loaded what the job runs: its parser, model and table layout
    warm = warm_job(cfg.data.name, cfg.model, "dense" if spec.key_bits else "hash")
    options = {"log_level": "WARNING", "warm": warm, **(cluster_options or {})}
    with open_cluster(servers=servers, workers=workers, **options) as cluster, \
            ThreadPoolExecutor(1, thread_name_prefix="paramserver-test-reader") as reader:
        # read while the job runs where a core is free for it (a thread only now: the nodes were forked from
        # this process)
        test_read = reader.submit(_read_niced, test, cfg.data) if test and overlap else None
        client = cluster.client
        client.allow_loss = True  # this driver watches the job's losses and decides (check_losses)
        created = time.perf_counter()
        if step is not None:
            # creates the tables with the checkpoint's (identical) specs
            client.restore(step, allow_unverified=allow_unverified)
        else:
            client.create_table_spec(spec)
            if dense_spec is not None:  # a deep model's MLP starts from its seed, on the servers
                client.create_table_spec(dense_spec)
                client.push(dense_spec.name, np.arange(cfg.model.dense_rows, dtype=np.uint64),
                            cfg.model.dense_initial(cfg.seed), op="assign", distinct=True).result(timeout=600)
        table_seconds = time.perf_counter() - created  # a dense table is allocated whole here
        if setup is not None:
            setup(cluster)
        client.job.start(shards, cfg.epochs, checkpoint=job_checkpoints, resume=progress)
        t0 = time.perf_counter()
        pool = ThreadPoolExecutor(1, thread_name_prefix="paramserver-train")
        pruned_at = 0  # checkpoints written when old ones were last pruned
        try:
            # the workers go on through a loss; this loop watches the job's losses and decides
            running = pool.submit(cluster.run_elastic, tolerating_loss(train_worker), cfg)
            while not running.done():
                status = client.job.status()
                if on_progress:
                    on_progress(status, time.perf_counter() - t0)
                check_losses(status, allow_loss)  # a loss ends the job now, loudly
                written = len(status.get("checkpoints", {}).get("written", []))
                if checkpoint_dir and keep_checkpoints and written > pruned_at:
                    checkpoint.prune(checkpoint_dir, keep_checkpoints)
                    pruned_at = written
                if test_read is not None and test_read.done() and (bad := test_read.exception()) is not None:
                    raise bad  # bad test data: stop now, not after the job
                wait([running], timeout=PROGRESS_EVERY_S)
            per_worker, failed_workers = running.result()  # re-raises a worker's error
        finally:
            pool.shutdown(wait=False)  # an abort must not wait for the workers: the cluster's exit stops them
        seconds = time.perf_counter() - t0
        status = client.job.status()
        check_losses(status, allow_loss)
        if checkpoint_dir and keep_checkpoints:
            checkpoint.prune(checkpoint_dir, keep_checkpoints)
        if not status.get("finished"):  # survivors return only once the queue says done
            raise WorkerError(f"the job did not finish (status {status}); failed workers: {failed_workers}")
        if on_progress:
            on_progress(status, seconds)
        report: dict[str, Any] = {}
        firsts = [r["first_batch_at"] for r in per_worker if r.get("first_batch_at")]
        if firsts:
            report["first_example_s"] = min(firsts) - process_start_time()
        if test and test_read is None:
            test_read = reader.submit(read_all, test, cfg.data)
        if test_read is not None:
            test_batch = test_read.result()
            report.update(metrics(test_batch.labels, score(client, cfg.model, test_batch)))
            report["test_examples"] = report.pop("examples")
        if save:
            keys, values = client.export_table(spec.name)
            save_model(save, cfg.model, cfg.data, spec, keys, values, dense=pull_dense(client, cfg.model))
        report["consistency"] = _merge_consistency(client.consistency_stats())
        report["traces"] = {r["rank"]: r["trace"] for r in per_worker}
        if status.get("failovers") or status.get("losses"):
            report["failovers"], report["data_loss"] = status.get("failovers", []), status.get("losses", [])
            gaps = [b[0] - a[0] for r in per_worker for a, b in zip(r["trace"], r["trace"][1:])]
            report["stalled_s"] = max(gaps, default=0.0)  # the longest wait between two batches of a worker
    examples = int(status["examples"])
    this_run = examples - int((progress or {}).get("totals", {}).get("examples", 0))
    report.update({
        "examples": examples, "seconds": seconds, "examples_per_s": this_run / seconds if seconds else 0.0,
        "train_logloss": status["loss_sum"] / examples if examples else float("nan"),
        "bad_lines": int(status["bad_lines"]),
        "bytes_sent": sum(r["bytes_sent"] for r in per_worker),
        "bytes_received": sum(r["bytes_received"] for r in per_worker),
        "epochs": cfg.epochs, "servers": servers, "workers": workers, "table_seconds": table_seconds,
        "optimizer": spec.to_wire()["optimizer"], "batch_size": cfg.batch_size, "batch_ramp": cfg.batch_ramp,
        "table_layout": "dense" if spec.key_bits else "hash",
        "failed_workers": failed_workers,
    })
    if job_checkpoints is not None:
        report["checkpoints"] = status["checkpoints"]["written"]
        report["checkpoints_abandoned"] = status["checkpoints"]["abandoned"]
        report["checkpoint_failures"] = status["checkpoints"].get("failures", [])
    if step is not None:
        report["resumed_from"] = step
        report["resumed_examples"] = examples - this_run
    return report


def check_losses(status: dict[str, Any], allow_loss: bool) -> None:
    """Raise ``DataLossError`` (one line: what was lost, why, and the fix) if a server died
    with vnodes that no backup held, unless the user allowed it."""
    losses = status.get("losses") or []
    if not losses or allow_loss:
        return
    raise DataLossError(loss_line(losses, COMMAND_FIX))


def check_job(servers: Any, workers: Any, shard_bytes: Any) -> None:
    """The cluster and shard arguments of a job, checked before anything starts."""
    for flag, value in (("--servers", servers), ("--workers", workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{flag} must be a whole number >= 1, got {value!r}")
    if not (isinstance(shard_bytes, (int, float)) and shard_bytes >= 1):
        raise ConfigError(f"--shard-mb must be > 0 (megabytes of input per shard), got {shard_bytes / (1 << 20):g}; "
                          "try 16")


def _checkpoint_option(url: str | None, every: int | None, n_shards: int) -> dict[str, Any] | None:
    if url is None:
        if every is not None:
            raise ConfigError(f"--checkpoint-every {every} needs --checkpoint-dir URL (where to write them)")
        return None
    if not url:
        raise ConfigError("--checkpoint-dir must be a folder or URL, got an empty string")
    if every is None:
        every = n_shards  # once an epoch
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(f"--checkpoint-every must be an int >= 1 (data shards done between two "
                          f"checkpoints), got {every!r}")
    return {"url": url, "every": every}


def _resume_point(url: str, shards: list[Shard], spec: TableSpec, cfg: TrainConfig, data: list[str],
                  shard_bytes: int, allow_unverified: bool = False) -> tuple[str, dict[str, Any]]:
    """The step to restore and the job progress to start from, checked against this job."""
    step = checkpoint.resolve_step(checkpoint.local_url(url, "--resume"))
    manifest = checkpoint.read_manifest(step, allow_unverified)
    job = manifest.get("job")
    if not isinstance(job, dict) or not isinstance(job.get("shards"), list):
        raise CheckpointError(f"--resume {step}: this checkpoint has no job progress (it was written by "
                              "Client.checkpoint, not by train --checkpoint-dir); restore it with "
                              "Client.restore, or resume from a training checkpoint")
    ours, theirs = [s.to_wire() for s in shards], job["shards"]
    if ours != theirs:
        diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        there = theirs[diff] if diff < len(theirs) else "none"
        here = ours[diff] if diff < len(ours) else "none"
        raise ConfigError(f"--resume {step}: the checkpointed job has {len(theirs)} shard(s), but --data "
                          f"{' '.join(data)} with --shard-mb {shard_bytes / (1 << 20):g} gives {len(ours)} "
                          f"(shard {diff}: {there} there, {here} here); pass the --data and --shard-mb of "
                          "the checkpointed job")
    dense_spec = cfg.dense_spec()
    theirs_model = (manifest.get("train") or {}).get("model")
    if dense_spec is not None and (theirs_model is None or Model(**theirs_model) != cfg.model
                                   or (theirs := manifest["tables"].get(dense_spec.name)) is None
                                   or TableSpec.from_wire(theirs).to_wire() != dense_spec.to_wire()):
        raise ConfigError(f"--resume {step}: the checkpoint's MLP table {dense_spec.name!r} is not the one of "
                          f"{cfg.model} (it has {theirs_model}); pass the --model, --embedding-dim, --hidden, "
                          "--fm-l2 and --seed of the checkpointed job")
    theirs_spec = manifest["tables"].get(spec.name)
    if theirs_spec is None:
        raise ConfigError(f"--resume {step}: the checkpoint has table(s) {sorted(manifest['tables'])}, not "
                          f"{spec.name!r} that these flags train; pass the --model of the checkpointed job")
    if TableSpec.from_wire(theirs_spec).to_wire() != spec.to_wire():
        raise ConfigError(f"--resume {step}: the checkpoint's table {spec.name!r} is {theirs_spec}, but these "
                          f"flags give {spec.to_wire()}; pass the --model, --optimizer, --seed, "
                          "--consistency, --hash-bits and --table-layout of the checkpointed job")
    epoch = job.get("epoch")
    if isinstance(epoch, int) and epoch >= cfg.epochs:
        raise ConfigError(f"--resume {step}: the checkpoint is in epoch {epoch + 1} of the job, but --epochs "
                          f"is {cfg.epochs}; pass --epochs {job.get('epochs')} (or more)")
    return step, {k: job[k] for k in ("epoch", "done", "totals", "epoch_examples") if k in job}
