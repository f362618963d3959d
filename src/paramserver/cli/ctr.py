"""What the ``train``, ``predict``, ``eval``, ``split-columns``, ``synth`` and ``demo``
commands do.

The CLI parses; this module turns arguments into library calls and shows the results
(a live progress line on stderr, a final report on stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from paramserver._runtime import collector
from paramserver.apps.ctr.job_plan import check_job
from paramserver.apps.ctr.modelfile import evaluate, predict_file
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.streaming import StreamJob
from paramserver.apps.ctr.train import run_training
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.cli.running import Progress, cluster_options, console
from paramserver.cli.train_report import progress_line, report_table
from paramserver.data.files import check_output, report_json, write_text
from paramserver.data.reader import DataFormat, shard_bytes, sniff_label_format
from paramserver.errors import ConfigError


def _fmt(args: argparse.Namespace) -> DataFormat:
    label_format = getattr(args, "label_format", None) or "01"
    if args.format == "libsvm" and not getattr(args, "label_format", None) and args.data:
        first = args.data[0]
        if os.path.isdir(first):  # column blocks from split-columns: every block has the labels
            from paramserver.apps.ctr.vertical import MANIFEST
            if os.path.exists(os.path.join(first, MANIFEST)):
                first = os.path.join(first, "block-0.libsvm")
        label_format = sniff_label_format(first)
    return DataFormat(args.format, args.hash_bits, label_format, args.skip_bad_lines, getattr(args, "cache", ""),
                      label_column=getattr(args, "label", ""),
                      ignore_columns=tuple(getattr(args, "ignore_columns", ())),
                      numeric_columns=tuple(getattr(args, "numeric_columns", ())),
                      max_bad_fraction=getattr(args, "max_bad_fraction", 0.01),
                      changed_files=_changed_files(args))


def _changed_files(args: argparse.Namespace) -> str:
    """``--changed-files``, which only a folder stream's files can need."""
    changed: str = getattr(args, "changed_files", "fail")
    if changed != "fail" and not getattr(args, "stream", None):
        raise ConfigError(f"--changed-files {changed} applies to --stream FOLDER (files that change after they "
                          "are taken); --data files are read as they are: drop it")
    return changed


def _train_config(args: argparse.Namespace, optimizer: Any, fmt: DataFormat) -> TrainConfig:
    """The job ``train`` runs (``demo`` hands in a namespace of a few flags: the rest defaults)."""
    return TrainConfig(model=Model(args.model, getattr(args, "k", 8), getattr(args, "fm_l2", 1e-2),
                                   getattr(args, "hidden", (256, 128))),
                       data=fmt, optimizer=optimizer, epochs=args.epochs, batch_size=args.batch_size,
                       batch_ramp=getattr(args, "batch_ramp", 1.0),
                       seed=getattr(args, "seed", 0), pipeline=getattr(args, "pipeline", "link"),
                       consistency=getattr(args, "consistency", "asp"), replicas=getattr(args, "replicas", 1),
                       layout=getattr(args, "table_layout", "auto"), filters=getattr(args, "filters", None),
                       lifecycle=getattr(args, "lifecycle", None), storage=getattr(args, "storage", "float32"),
                       row_cache=getattr(args, "row_cache", "off"), table_memory=getattr(args, "table_memory", 0),
                       hot_keys=getattr(args, "hot_keys", "full"),
                       prefetch=getattr(args, "prefetch", True), steps=getattr(args, "steps", "auto"))


def _run(cfg: TrainConfig, args: argparse.Namespace, data: list[str], test: list[str],
         progress: Progress, done: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The job on its cluster: vertical (``--feature-partition``) or by data shards."""
    parts = getattr(args, "feature_partition", None)
    if parts is not None:
        from paramserver.apps.ctr.vertical import run_vertical

        collector.resume()

        return run_vertical(cfg, data, test, parts, servers=args.servers, workers=args.workers,
                            save=getattr(args, "save", None),
                            cluster_options=cluster_options(args))
    return run_training(cfg, data, test, servers=args.servers, workers=args.workers, setup=progress.announce,
                        cluster_options=cluster_options(args),
                        save=getattr(args, "save", None),
                        shard_bytes=shard_bytes(getattr(args, "shard_mb", 16)), on_progress=progress.show,
                        checkpoint_dir=getattr(args, "checkpoint_dir", None),
                        checkpoint_every=getattr(args, "checkpoint_every", None),
                        resume=getattr(args, "resume", None), allow_loss=getattr(args, "allow_loss", False),
                        keep_checkpoints=getattr(args, "keep_checkpoints", 3),
                        allow_unverified=getattr(args, "allow_unverified_checkpoint", False),
                        publish=getattr(args, "publish", None), publish_every=getattr(args, "publish_every", 10.0),
                        stream=StreamJob(args.stream, getattr(args, "max_examples", None),
                                         getattr(args, "until", None)) if getattr(args, "stream", None) else None,
                        checkpoint_seconds=getattr(args, "checkpoint_seconds", None), on_done=done)


def _train(args: argparse.Namespace, optimizer: Any, data: list[str], test: list[str],
           fmt: DataFormat) -> dict[str, Any]:
    cfg = _train_config(args, optimizer, fmt)
    cfg.table_spec()  # validate the optimizer before starting processes
    check_output(getattr(args, "metrics_out", None), "--metrics-out", folder=False)
    quiet = getattr(args, "quiet", False) or not sys.stderr.isatty() and os.environ.get("CI")
    progress = Progress(bool(quiet), progress_line)
    log_dir = getattr(args, "log_dir", None)
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    shown: list[dict[str, Any]] = []

    def done(report: dict[str, Any]) -> None:  # the cluster (and its dashboard) still up
        progress.stop()
        _show(args, report)
        shown.append(report)
        if getattr(args, "keep_dashboard", False):
            _linger(progress)

    try:
        report = _run(cfg, args, data, test, progress, done)
    except Exception as exc:
        if not shown:  # --metrics-out says the job failed, and how far it got
            _failed_metrics(args, exc, progress)
        raise
    finally:
        progress.stop()
    if not shown:  # --feature-partition's job reports once its cluster is gone
        _show(args, report)
    return report


def _show(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """The report: a table on stdout, and the JSON of --metrics-out."""
    console(False).print(report_table(report))
    metrics_out = getattr(args, "metrics_out", None)
    if metrics_out:
        write_text(metrics_out, report_json({k: v for k, v in report.items() if k != "traces"}, indent=1))


def _failed_metrics(args: argparse.Namespace, exc: Exception, progress: Progress) -> None:
    """``--metrics-out`` of a job that failed: the error, and its last status (examples,
    seconds, bad lines, a stream's position)."""
    metrics_out = getattr(args, "metrics_out", None)
    if not metrics_out:
        return
    status, seconds = progress.last or ({}, 0.0)
    failed = {"failed": True, "error": str(exc), "error_type": type(exc).__name__,
              "data": [args.stream] if getattr(args, "stream", None) else list(getattr(args, "data", [])),
              "examples": int(status.get("examples", 0)), "seconds": seconds,
              "bad_lines": int(status.get("bad_lines", 0))}
    if isinstance(status.get("stream"), dict):
        failed["stream_position"] = status["stream"].get("position")
    try:
        write_text(metrics_out, report_json(failed, indent=1))
    except OSError as write_error:  # the job's own error is the one to say
        print(f"paramserver train: --metrics-out {metrics_out}: cannot write it: {write_error}", file=sys.stderr)


def _linger(progress: Progress) -> None:
    """``--keep-dashboard``: the job is done and reported; its dashboard stays up until Ctrl-C."""
    import time

    where = next((w for w in progress.where if w.startswith("dashboard")), "the dashboard")
    console(True).print(f"the job is done; {where} stays up for a last look: Ctrl-C to end")
    try:
        while True:  # awake every 0.2 s: a Ctrl-C the kernel handed to another of the process's threads
            time.sleep(0.2)  # is raised here all the same (a lock's wait slept through it: the test hung 60 s)
    except KeyboardInterrupt:
        console(True).print("ending")


def train(args: argparse.Namespace, parse_optimizer: Callable[[str | None], Any]) -> int:
    optimizer = parse_optimizer(args.optimizer)
    if args.stream is None and (args.max_examples is not None or args.until is not None):
        raise ConfigError(f"{'--max-examples' if args.max_examples is not None else '--until'} is for --stream "
                          "(a job on --data ends with its data)")
    if args.stream is not None:
        if getattr(args, "feature_partition", None) is not None:
            raise ConfigError("--feature-partition trains on files cut by columns (paramserver split-columns); it "
                              "cannot read --stream")
        with _stops_streams():
            _train(args, optimizer, args.data, args.test, _fmt(args))
        return 0
    if not args.data:
        raise ConfigError("train needs --data FILE... (or --stream SOURCE: rows as they arrive)")
    if "-" not in args.data:
        _train(args, optimizer, args.data, args.test, _fmt(args))
        return 0
    if "-" in (args.test or []):
        raise ConfigError("--data - and --test -: standard input can hold the rows of one of them; write the test "
                          "rows to a file and pass it to --test")
    # --data -: standard input is spooled to a temporary file first, since the workers (other
    # processes) read the data, by shards, and every epoch reads it again
    with tempfile.TemporaryDirectory(prefix="paramserver-stdin-") as tmp:
        spool = os.path.join(tmp, "stdin")
        with open(spool, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
        if os.path.getsize(spool) == 0:
            raise ConfigError("--data -: standard input is empty; pipe the training data in")
        args.data = [spool if p == "-" else p for p in args.data]
        _train(args, optimizer, args.data, args.test, _fmt(args))
    return 0


@contextlib.contextmanager
def _stops_streams() -> Iterator[None]:
    """The first Ctrl-C or SIGTERM closes the stream (the job finishes what was cut and
    reports); a second Ctrl-C interrupts it."""
    from paramserver.apps.ctr.streaming import stop_streams

    def stop(signum: int, frame: Any) -> None:
        if stopping or not stop_streams():  # a second time, or no stream runs yet: interrupted
            raise KeyboardInterrupt
        stopping.append(signum)
        console(True).print("stopping: the stream is closed, the job finishes what it read (Ctrl-C again to "
                             "interrupt)")

    stopping: list[int] = []
    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def demo(args: argparse.Namespace, parse_optimizer: Callable[[str | None], Any]) -> int:
    check_job(args.servers, args.workers, 4 << 20)  # before writing any data
    if args.rows < 1:
        raise ConfigError(f"--rows must be >= 1, got {args.rows}")
    with tempfile.TemporaryDirectory(prefix="paramserver-demo-") as tmp:
        train_path, test_path = os.path.join(tmp, "train.tsv"), os.path.join(tmp, "test.tsv")
        console(True).print(f"writing {args.rows:,} synthetic Criteo-format rows (+ {args.rows // 10:,} test rows)")
        # imported here: its gzip was ~25 ms of every command's start (bz2 and lzma come with scipy anyway)
        from paramserver.apps.ctr.synth import write_synth

        write_synth(train_path, args.rows, seed=1)
        write_synth(test_path, max(1, args.rows // 10), seed=2)
        console(True).print(f"training logistic regression (FTRL) on {args.servers} server(s) and "
                  f"{args.workers} worker(s)")
        ns = argparse.Namespace(model="lr", epochs=1, batch_size=4000, servers=args.servers,
                                workers=args.workers, shard_mb=4, quiet=False)
        _train(ns, None, [train_path], [test_path], DataFormat("criteo"))
    return 0


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """``--format`` / ``--label-format`` of predict and eval, over the saved model's own."""
    out = {}
    if getattr(args, "format", None):
        out["name"] = args.format
    if getattr(args, "label_format", None):
        out["label_format"] = args.label_format
    return out


def predict(args: argparse.Namespace, _: Any) -> int:
    seen: dict[str, Any] = {}
    n = predict_file(args.model, args.data, args.out, args.skip_bad_lines, _overrides(args),
                     args.allow_unverified_checkpoint, seen)
    share = seen["unseen_feature_share"]
    console(True).print(f"wrote {n:,} predictions to {'standard output' if args.out == '-' else args.out}; "
                         f"{share:.1%} of their features were never seen in training"
                         + (" (is this the data the model was trained for?)" if share > 0.5 else ""))
    return 0


def eval(args: argparse.Namespace, _: Any) -> int:  # noqa: A001 - the command's name
    check_output(args.metrics_out, "--metrics-out", folder=False)
    report = evaluate(args.model, args.data, args.skip_bad_lines, _overrides(args), args.allow_unverified_checkpoint)
    print(report_json(report), flush=True)  # one line: rich would wrap it at the terminal width
    if report.get("unseen_feature_share", 0.0) > 0.5:  # as predict says it
        console(True).print(f"{report['unseen_feature_share']:.1%} of the rows' features were never seen in training "
                            "(is this the data the model was trained for?)")
    if args.metrics_out:
        write_text(args.metrics_out, report_json(report, indent=1))
    return 0


def split_columns(args: argparse.Namespace, _: Any) -> int:
    from paramserver.apps.ctr.vertical import split_columns as split

    manifest = split(args.data, args.parts, args.out, args.format)
    console(False).print(f"{manifest['lines']:,} lines in {args.parts} column blocks under {args.out}")
    return 0


def synth(args: argparse.Namespace, _: Any) -> int:
    from paramserver.apps.ctr.synth import write_synth

    shape, days = getattr(args, "shape", "simple"), getattr(args, "days", None)
    if shape != "drift":
        if days is not None:
            raise ConfigError(f"--days is for --shape drift only, not --shape {shape}")
        size = write_synth(args.out, args.rows, args.seed, shape)
        where = "standard output" if args.out == "-" else args.out
        console(True).print(f"wrote {args.rows:,} rows ({size / 1e6:,.1f} MB) to {where}")
        return 0
    from paramserver.apps.ctr.drift import DEFAULT_DAYS, write_drift

    days = DEFAULT_DAYS if days is None else days
    size = write_drift(args.out, args.rows, days, args.seed)
    console(True).print(f"wrote {days} days of {args.rows:,} rows ({size / 1e6:,.1f} MB) to {args.out}/day-*.tsv")
    return 0
