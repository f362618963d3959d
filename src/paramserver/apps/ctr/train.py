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

This module is the driver; a worker's training loop is in ``train_loop``, its batch ramp
in ``ramp``, the job's settings in ``train_config``, what it does worked out and checked
before any node starts in ``job_plan``, the checkpoint and resume checks in ``resume``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from paramserver.apps.ctr import step_size
from paramserver.apps.ctr.job_plan import JobPlan, plan_job
from paramserver.apps.ctr.modelfile import pull_dense, save_model
from paramserver.apps.ctr.publishing import JobPublisher, table_report
from paramserver.apps.ctr.stream_files import stream_file_report
from paramserver.apps.ctr.streaming import Feeder, StreamJob, fed, stream_rates
from paramserver.apps.ctr.test_set import Distinct, TestSet, scored
from paramserver.apps.ctr.tier_report import TierPasses
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.apps.ctr.train_loop import PROGRESS_EVERY_S, train_worker
from paramserver.apps.ctr.warmup import warm_job
from paramserver.checkpoint import store as checkpoint
from paramserver.client.client import Client
from paramserver.client.filtering import merge_stats
from paramserver.client.losses import COMMAND_FIX, loss_line, tolerating_loss
from paramserver.client.row_cache import merge_caches
from paramserver.config import parse_bytes
from paramserver.data.reader import (
    Batch,
    no_examples,
)
from paramserver.errors import ConfigError, DataLossError, WorkerError
from paramserver.lifecycle.spec import Lifecycle
from paramserver.tables.spec import TableSpec


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


def _merge_consistency(per_server: list[dict[str, Any]]) -> dict[str, Any]:
    """Staleness readers saw, over all servers: histogram, parked pulls and seconds."""
    hist: dict[str, int] = {}
    for s in per_server:
        for k, v in s["staleness_histogram"].items():
            hist[k] = hist.get(k, 0) + v
    return {"staleness_histogram": hist, "max_gap": max((s["max_gap"] for s in per_server), default=0),
            "parked_pulls": sum(s["parked_pulls"] for s in per_server),
            "parked_seconds": sum(s["parked_seconds"] for s in per_server)}


# ---- the driver --------------------------------------------------------------------


def run_training(cfg: TrainConfig, data: list[str], test: list[str], *, servers: int, workers: int,
                 save: str | None = None, shard_bytes: int = 16 << 20,
                 on_progress: Callable[[dict[str, Any], float], None] | None = None,
                 checkpoint_dir: str | None = None, checkpoint_every: int | None = None,
                 resume: str | None = None, setup: Callable[[Any], Any] | None = None,
                 cluster_options: dict[str, Any] | None = None, allow_loss: bool = False,
                 keep_checkpoints: int = 3, allow_unverified: bool = False, publish: str | None = None,
                 publish_every: float = 10.0, stream: StreamJob | None = None,
                 checkpoint_seconds: float | None = None,
                 on_done: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train on a fresh local cluster; return the report (see ``docs``).

    Args:
        checkpoint_dir: checkpoint the tables and the job's progress under this URL ...
        checkpoint_every: ... every N shards done (default: once an epoch) ...
        checkpoint_seconds: ... or (also) every this many seconds (a stream's default: 30).
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
        publish: publish the model under this URL while it trains, a base and then what
            changed (``checkpoint/publish.py``; ``load_model(URL)`` reads it) ...
        publish_every: ... every this many seconds, and once more at the end.
        stream: train on a stream instead of ``data`` until its end or a stop
            (``apps/ctr/streaming.StreamJob``).
        on_done: called with the report while the cluster is still up (its dashboard too).
    """
    from paramserver.cluster.launch import open_cluster

    cfg = _tracked(cfg, publish)
    stepsize = step_size.JobStepSize(cfg, data, stream=stream is not None, resume=bool(resume))  # the rule's auto α, β
    plan = plan_job(cfg, data, test, servers=servers, workers=workers, save=save, shard_bytes=shard_bytes,
                     checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, resume=resume,
                     keep_checkpoints=keep_checkpoints, allow_unverified=allow_unverified, publish=publish,
                     publish_every=publish_every, stream=stream, checkpoint_seconds=checkpoint_seconds,
                     cluster=(cluster_options or {}).get("cluster", "local"))
    test_set = TestSet(test, cfg.data, plan.overlap)  # read from once the nodes are forked
    with test_set, open_cluster(servers=servers, workers=workers, **_cluster_options(
            cfg, plan, cluster_options, stepsize.forked(test_set.begin))) as cluster:
        test_set.begin()  # where no node was forked (Ray's actors), now
        cfg, plan = stepsize.settled(cfg, plan)  # the tables take the α and β chosen
        table_seconds = _start_job(cluster, cfg, plan, setup, allow_unverified)
        publisher = JobPublisher(publish, publish_every, cfg, plan.spec) if publish else None
        with fed(cluster.client, plan.source, stream, checkpoints=plan.checkpoints is not None,
                 position=plan.stream_position) as feeder:
            ran = _run_job(cluster, cfg, test_set, on_progress=on_progress, allow_loss=allow_loss,
                           checkpoint_dir=checkpoint_dir, keep_checkpoints=keep_checkpoints, publisher=publisher,
                           feeder=feeder)
        report = _ended(cluster, cfg, plan, ran, test_set, save, publisher, workers, table_seconds) | stepsize.report()
        (on_done or _nothing)(report)  # the cluster (and its dashboard) still up
    return report


def _ended(cluster: Any, cfg: TrainConfig, plan: JobPlan, ran: _Ran, test_set: TestSet, save: str | None,
           publisher: JobPublisher | None, workers: int, table_seconds: float) -> dict[str, Any]:
    """The report of a job whose workers are done: they leave while the test rows are scored
    from the servers, the model is saved, and what the job did is said."""
    cluster.release_workers()
    report = _results(cluster.client, cfg, plan, ran, test_set.parts(), save) | _lived(
        cluster.client, plan.spec, publisher)
    report.update(_job_report(cfg, plan, ran, servers=cluster.n_servers, workers=workers,
                              table_seconds=table_seconds))
    return report


def _nothing(report: dict[str, Any]) -> None:
    pass


def _cluster_options(cfg: TrainConfig, plan: JobPlan, more: dict[str, Any] | None,
                     forked: Callable[[], None]) -> dict[str, Any]:
    """The local cluster's options: the nodes are forked once this process has loaded what
    the job runs (its parser, model and table layout), and ``forked`` is called then."""
    warm = replace(warm_job(cfg.data.name, cfg.model, plan.spec), forked=forked)
    return {"log_level": "WARNING", "warm": warm, **(more or {})}


def _start_job(cluster: Any, cfg: TrainConfig, plan: JobPlan, setup: Callable[[Any], Any] | None,
               allow_unverified: bool) -> float:
    """The job's tables made (or restored), ``setup`` called, the job started on the
    scheduler; the seconds the tables took."""
    client = cluster.client
    client.stats.allow_loss = True  # this driver watches the job's losses and decides (check_losses)
    table_seconds = _make_tables(client, cfg, plan, allow_unverified)
    if setup is not None:
        setup(cluster)
    client.job.start(plan.shards, cfg.epochs, checkpoint=plan.checkpoints, resume=plan.progress,
                     stream=plan.source.url if plan.source else None)
    return table_seconds


def _tracked(cfg: TrainConfig, publish: str | None) -> TrainConfig:
    """``cfg``, its table's changes tracked when the job publishes (a delta needs them)."""
    if not publish or Lifecycle.parse(cfg.lifecycle):
        return cfg
    if cfg.layout == "dense":
        raise ConfigError("--publish needs the model table's changes tracked, which a dense table cannot: "
                          "use --table-layout auto (the default) or hash")
    return replace(cfg, lifecycle="track")


def _lived(client: Client, spec: TableSpec, publisher: JobPublisher | None) -> dict[str, Any]:
    """The model as it ended published (``--publish``), and the report's lines on that
    and on the table: its storage and bytes a key always, its lifecycle if it has one."""
    report: dict[str, Any] = {}
    if publisher is not None:
        publisher.publish(client)
        report["publish"] = publisher.stats()
    report.update(table_report(client, spec))
    return report


def _make_tables(client: Client, cfg: TrainConfig, plan: JobPlan, allow_unverified: bool) -> float:
    """The job's tables, restored from the step it resumes from or created (a deep model's
    MLP from its seed, on the servers); the seconds that took (a dense table is allocated
    whole here)."""
    created = time.perf_counter()
    if plan.step is not None:
        # creates the tables with the checkpoint's (identical) specs
        client.restore(plan.step, allow_unverified=allow_unverified)
    else:
        client.admin.create_table_spec(plan.spec)
        if plan.dense_spec is not None:  # a deep model's MLP starts from its seed, on the servers
            client.admin.create_table_spec(plan.dense_spec)
            client.push(plan.dense_spec.name, np.arange(cfg.model.dense_rows, dtype=np.uint64),
                        cfg.model.dense_initial(cfg.seed), op="assign", distinct=True).result(timeout=600)
    return time.perf_counter() - created


@dataclass(frozen=True)
class _Ran:
    """How the workers' run went: what each survivor returned, the workers that died, the
    seconds it took, and the job's last status."""

    per_worker: list[dict[str, Any]]
    failed_workers: list[str]
    seconds: float
    status: dict[str, Any]
    busy_seconds: float | None = None  # a stream job's: the seconds it had rows in hand
    tier_passes: list[dict[str, float]] = field(default_factory=list)  # a memory budget's hit rate a pass


def _run_job(cluster: Any, cfg: TrainConfig, test_set: TestSet, *,
             on_progress: Callable[[dict[str, Any], float], None] | None, allow_loss: bool,
             checkpoint_dir: str | None, keep_checkpoints: int, publisher: JobPublisher | None = None,
             feeder: Feeder | None = None) -> _Ran:
    """``train_worker`` on every worker until the job is done, watched from here: its
    progress shown, a loss of data or bad test rows ending it at once, old checkpoints
    pruned as new ones are written.

    Raises:
        DataLossError: a server died with data no copy held (unless ``allow_loss``).
        WorkerError: a worker failed, or the job did not finish."""
    client = cluster.client
    t0 = time.perf_counter()
    # a table with a memory budget: its hot tier's hit rate, pass by pass
    passes = TierPasses(client, cfg.model.table, tiered=bool(parse_bytes("--table-memory", cfg.table_memory)))
    pool = ThreadPoolExecutor(1, thread_name_prefix="paramserver-train")
    pruned_at = 0  # checkpoints written when old ones were last pruned
    try:
        # the workers go on through a loss; this loop watches the job's losses and decides
        test_set.hold()  # the test rows read while the cluster started: the rest once the job is done
        running = pool.submit(cluster.run_elastic, tolerating_loss(train_worker), cfg)
        while not running.done():
            status = client.job.status()
            if on_progress:
                on_progress(status, time.perf_counter() - t0)
            passes.observe(status)
            check_losses(status, allow_loss)  # a loss ends the job now, loudly
            written = len(status.get("checkpoints", {}).get("written", []))
            if checkpoint_dir and keep_checkpoints and written > pruned_at:
                checkpoint.prune(checkpoint_dir, keep_checkpoints)
                pruned_at = written
            test_read = test_set.reading
            if test_read is not None and test_read.done() and (bad := test_read.exception()) is not None:
                raise bad  # bad test data: stop now, not after the job
            if publisher is not None and publisher.due():
                publisher.publish(client)
            if feeder is not None and feeder.error is not None:
                raise feeder.error  # the stream failed (unreachable, deleted): stop now
            wait([running], timeout=PROGRESS_EVERY_S)
        per_worker, failed_workers = running.result()  # re-raises a worker's error
    finally:
        pool.shutdown(wait=False)  # an abort must not wait for the workers: the cluster's exit stops them
    seconds = time.perf_counter() - t0
    status = client.job.status()
    passes.observe(status, done=True)
    check_losses(status, allow_loss)
    if checkpoint_dir and keep_checkpoints:
        checkpoint.prune(checkpoint_dir, keep_checkpoints)
    if not status.get("finished"):  # survivors return only once the queue says done
        raise WorkerError(f"the job did not finish (status {status}); failed workers: {failed_workers}")
    if on_progress:
        on_progress(status, seconds)
    return _Ran(per_worker, failed_workers, seconds, status, feeder.training_seconds() if feeder else None,
                passes.passes)


def _results(client: Client, cfg: TrainConfig, plan: JobPlan, ran: _Ran,
             test_parts: Iterable[tuple[Batch, Distinct]] | None, save: str | None) -> dict[str, Any]:
    """Once the job is done, with the cluster still up: the first example's time, the test
    set scored, the model saved (``--save``), the staleness readers saw, each worker's
    trace, and what failed over.  A job on files that gave it no example is an error, and
    nothing is saved."""
    spec = plan.spec
    if plan.source is None and not int(ran.status["examples"]):
        raise no_examples(list(dict.fromkeys(s.path for s in plan.shards)), int(ran.status["bad_lines"]))
    report: dict[str, Any] = {}
    per_worker, status = ran.per_worker, ran.status
    firsts = [r["first_batch_at"] for r in per_worker if r.get("first_batch_at")]
    if firsts:
        report["first_example_s"] = min(firsts) - process_start_time()
    if test_parts is not None:
        report.update(scored(client, cfg.model, test_parts))
    if save:
        keys, values = client.export_table(spec.name)
        save_model(save, cfg.model, cfg.data, spec, keys, values, dense=pull_dense(client, cfg.model))
    report["consistency"] = _merge_consistency(client.stats.consistency_stats())
    report["traces"] = {r["rank"]: r["trace"] for r in per_worker}
    if status.get("failovers") or status.get("losses"):
        report["failovers"], report["data_loss"] = status.get("failovers", []), status.get("losses", [])
        gaps = [b[0] - a[0] for r in per_worker for a, b in zip(r["trace"], r["trace"][1:])]
        report["stalled_s"] = max(gaps, default=0.0)  # the longest wait between two batches of a worker
    return report


def _job_report(cfg: TrainConfig, plan: JobPlan, ran: _Ran, *, servers: int, workers: int,
                table_seconds: float) -> dict[str, Any]:
    """The report's lines on the job: examples (in this run, when resumed) and their speed,
    the training loss, bytes moved, the settings, the checkpoints written."""
    status, per_worker, seconds = ran.status, ran.per_worker, ran.seconds
    examples = int(status["examples"])
    this_run = examples - int((plan.progress or {}).get("totals", {}).get("examples", 0))
    report = {
        "examples": examples, "seconds": seconds, "examples_per_s": this_run / seconds if seconds else 0.0,
        "train_logloss": status["loss_sum"] / examples if examples else float("nan"),
        "bad_lines": int(status["bad_lines"]),
        "bytes_sent": sum(r["bytes_sent"] for r in per_worker),
        "bytes_received": sum(r["bytes_received"] for r in per_worker),
        # what ran, said back: a flag that did not take effect shows here (issue 33.6)
        "model": cfg.model.name, "format": cfg.data.name, "hash_bits": cfg.data.hash_bits,
        "data": [plan.source.url] if plan.source else list(dict.fromkeys(s.path for s in plan.shards)),
        "table_dim": plan.spec.dim,
        "epochs": cfg.epochs, "servers": servers, "workers": workers, "table_seconds": table_seconds,
        "optimizer": plan.spec.to_wire()["optimizer"], "batch_size": cfg.batch_size, "batch_ramp": cfg.batch_ramp,
        "table_layout": "dense" if plan.spec.key_bits else "hash",
        "failed_workers": ran.failed_workers,
    }
    if ran.busy_seconds is not None:  # a stream job: its rate while it had rows, and over the wall time
        report.update(stream_rates(this_run, seconds, ran.busy_seconds))
    if "progressive" in status:  # each example scored before the model trained on it
        report["progressive"] = status["progressive"]
    report["pipeline_depth"] = max((int(r.get("pipeline_depth", 0)) for r in per_worker), default=0)
    floors = [r["round_trip_floor_ms"] for r in per_worker if r.get("round_trip_floor_ms") is not None]
    report["round_trip_floor_ms"] = max(floors) if floors else None  # --pipeline link's measure
    keys = [r.get("keys", {}) for r in per_worker]
    report["steps"] = any(k.get("step", 0) for k in keys)  # batches went as steps (``client.steps``)
    # each a server's key-operation: a step's key is read and updated, as a pull's and a push's
    sent = sum(k.get("pull", 0) + k.get("push", 0) + 2 * k.get("step", 0) for k in keys)
    report["key_ops_per_example"] = sent / this_run if this_run else 0.0
    report["keys_named_ahead"] = sum(k.get("prefetch", 0) for k in keys)  # sent ahead of their pulls (prefetch)
    caches = [c for r in per_worker for c in r.get("row_cache", {}).values()]
    if caches:  # with what workers that died held and never pushed, as they last reported it
        report["row_cache"] = merge_caches(caches) | {"sums_lost": int(status.get("sums_lost", 0))}
    if ran.tier_passes:  # a memory budget: the hot tier's hit rate each pass
        report["tier_passes"] = ran.tier_passes
    if plan.spec.filters:
        report["filters"] = str(plan.spec.filters)
        report["filter_bytes"] = merge_stats([r.get("filters", {}) for r in per_worker])
    if plan.checkpoints is not None:
        report["checkpoints"] = status["checkpoints"]["written"]
        report["checkpoints_abandoned"] = status["checkpoints"]["abandoned"]
        report["checkpoint_failures"] = status["checkpoints"].get("failures", [])
    if plan.step is not None:
        report["resumed_from"] = plan.step
        report["resumed_examples"] = examples - this_run
    report.update(stream_file_report(status, plan.source))  # a folder's files changed after they were taken
    return report


def check_losses(status: dict[str, Any], allow_loss: bool) -> None:
    """Raise ``DataLossError`` (one line: what was lost, why, and the fix) if a server died
    with vnodes that no backup held, unless the user allowed it."""
    losses = status.get("losses") or []
    if not losses or allow_loss:
        return
    raise DataLossError(loss_line(losses, COMMAND_FIX))
