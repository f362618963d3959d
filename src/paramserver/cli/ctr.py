"""What the ``train``, ``predict``, ``eval``, ``synth`` and ``demo`` commands do.

The CLI parses; this module turns arguments into library calls and shows the results
(a live progress line on stderr, a final report on stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from paramserver._runtime import collector
from paramserver.apps.ctr.modelfile import evaluate, predict_file
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.synth import write_synth
from paramserver.apps.ctr.train import check_job, run_training
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.data.files import check_output, write_text
from paramserver.data.reader import DataFormat, sniff_label_format
from paramserver.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table


@functools.cache
def _console(stderr: bool) -> Console:
    """rich's console (imported on first use: 0.015 s a job need not spend before its first example)."""
    from rich.console import Console

    return Console(stderr=stderr)


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
                      max_bad_fraction=getattr(args, "max_bad_fraction", 0.01))


def _progress_line(status: dict[str, Any], seconds: float) -> str:
    if "epoch" not in status:
        return "starting..."
    live = status.get("live", {})
    examples = int(live.get("examples", 0))
    loss = live.get("loss_sum", 0.0) / examples if examples else float("nan")
    rate = (examples - int(status.get("resumed_examples", 0))) / seconds if seconds > 0 else 0.0  # this run's
    failovers = len(status.get("failovers") or [])
    where = (f"stream shards {status['shards_done']}/{status['shards']}" if "stream" in status else
             f"epoch {status['epoch'] + 1}/{status['epochs']}  shards {status['shards_done']}/{status['shards']}")
    pv = (status.get("progressive") or {}).get("window_seconds") or {}
    scored = f"  progressive AUC {pv['auc']:.4f} (last {pv['size']:g} s)" if pv.get("auc") is not None else ""
    return (f"{where}  examples {examples:,}  {rate:,.0f}/s  train logloss {loss:.4f}{scored}"
            + (f"  servers lost {failovers} (failed over)" if failovers else ""))


def _filter_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's lines on the filters: per direction, bytes of the requests' keys and
    values before and after the chain (``filter_bytes``), and what sigmod held back."""
    if "filters" not in report:
        return []
    lines = [("filters", report["filters"])]
    for table, by_direction in report.get("filter_bytes", {}).items():
        for direction, by_filter in by_direction.items():
            sizes = [v for v in by_filter.values() if isinstance(v, dict)]
            if direction == "owed":
                if by_filter.get("sigmod_in"):
                    lines.append((f"{table} sigmod", f"{by_filter['sigmod_out']:,} of {by_filter['sigmod_in']:,} "
                                                      "key updates sent at once, the rest later"))
            elif sizes:
                before, after = sizes[0]["bytes_in"], sizes[-1]["bytes_out"]
                lines.append((f"{table} {direction} bytes", f"{before:,} -> {after:,} ({before / max(after, 1):.1f}x)"))
    return lines


def _staleness(histogram: dict[str, int]) -> str:
    """The clocks pulls' readers were ahead of the slowest worker, in one short line (the
    histogram itself, up to eight "clocks:pulls" pairs, wrapped the report's table)."""
    counts = {int(k): int(v) for k, v in histogram.items()}
    total = sum(counts.values())
    if not total:
        return "-"
    at0 = counts.get(0, 0) / total
    within1 = (counts.get(0, 0) + counts.get(1, 0)) / total
    return f"{at0:.0%} at 0, {within1:.0%} ≤ 1, max {max(counts)} ({total:,} pulls)"


def _run_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's lines on what ran: the model, its rows' format and hashing, the files."""
    if "model" not in report:
        return []
    bits = report["hash_bits"]
    hashing = "no folding" if bits in (0, 64) else f"{bits} hash bits"
    files = report.get("data", [])
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return [("model", f"{report['model']} (a key's row: {report['table_dim']} values), {report['format']} rows, "
                      f"{hashing}"), ("data", shown)]


def _progressive_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's lines on progressive validation: each example scored before the model
    trained on it, over the whole run, the last examples, the last seconds and the trend."""
    pv = report.get("progressive")
    if not pv:
        return []

    def pair(w: dict[str, Any]) -> str:
        def num(x: float | None) -> str:
            return "-" if x is None else f"{x:.4f}"

        return f"logloss {num(w['logloss'])}, AUC {num(w['auc'])} ({w['examples']:,} examples)"

    ws, trend = pv["window_seconds"], pv["trend"]
    lines = [("progressive (scored before training)", pair(pv["all"])),
             (f"  last {pv['window_examples']['size']:,} examples", pair(pv["window_examples"]))]
    if ws["examples"]:
        lines.append((f"  last {ws['size']:g} s", pair(ws)))
    if trend["logloss"] is not None and trend["auc"] is not None:
        lines.append(("  trend", f"logloss {trend['logloss']:+.4f}, AUC {trend['auc']:+.4f} against the "
                                 f"{trend['over_seconds']:g} s before"))
    return lines


def _lifecycle_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's lines on the model table's lifecycle and publications."""
    lines = []
    if "lifecycle" in report:
        lines += [("lifecycle", report["lifecycle"]),
                  ("keys held", f"{report['keys']:,} ({report['bytes_per_key']:.1f} bytes a key, all copies)"),
                  ("updates refused (not admitted)", f"{report['updates_refused']:,}"),
                  ("keys evicted", f"{report['keys_evicted']:,}")]
    if "publish" in report:
        p = report["publish"]
        lines.append(("published", f"{p['bases']} base(s), {p['deltas']} delta(s) to {p['url']} (longest export "
                                   f"{p['export_s_max'] * 1000:.0f} ms)"))
    return lines


def _report_table(report: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title="paramserver train", show_header=False)
    rows = [("test logloss", "logloss", "{:.4f}"), ("test AUC", "auc", "{:.4f}"),
            ("test examples", "test_examples", "{:,}"), ("train logloss", "train_logloss", "{:.4f}"),
            ("examples", "examples", "{:,}"), ("examples/s", "examples_per_s", "{:,.0f}"),
            ("training seconds", "seconds", "{:.1f}"), ("start-up to first example (s)", "first_example_s", "{:.2f}"),
            ("bytes sent", "bytes_sent", "{:,}"),
            ("bytes received", "bytes_received", "{:,}"), ("bad lines skipped", "bad_lines", "{:,}")]
    for label, key, fmt in rows:
        if key in report and not (isinstance(report[key], float) and math.isnan(report[key])):
            table.add_row(label, fmt.format(report[key]))
    for line in _progressive_lines(report) + _run_lines(report) + _filter_lines(report) + _lifecycle_lines(report):
        table.add_row(*line)
    if "checkpoints" in report:
        table.add_row("checkpoints written", f"{len(report['checkpoints'])} "
                                             f"({report['checkpoints_abandoned']} abandoned)")
        for why in report.get("checkpoint_failures", [])[:3]:
            table.add_row("checkpoint failed", why)
    if "resumed_from" in report:
        table.add_row("resumed from", f"{report['resumed_from']} ({report['resumed_examples']:,} examples)")
    if report.get("failed_workers"):
        table.add_row("workers lost", "; ".join(report["failed_workers"]))
    if report.get("failovers"):
        table.add_row("servers lost", f"{len(report['failovers'])} (failed over; longest stall between two batches "
                                      f"{report.get('stalled_s', 0):.2f} s)")
    for loss in report.get("data_loss") or []:
        table.add_row("DATA LOST", f"server {loss['server']}: {loss['vnodes']} vnode(s) of {', '.join(loss['tables'])} "
                                   "restarted from initial values (--allow-loss)")
    c = report.get("consistency")
    if c:
        table.add_row("staleness seen (clocks)", _staleness(c["staleness_histogram"]))
        table.add_row("pulls parked", f"{c['parked_pulls']:,} ({c['parked_seconds']:.2f} s)")
    return table


def _train_config(args: argparse.Namespace, optimizer: Any, fmt: DataFormat) -> TrainConfig:
    """The job ``train`` runs (``demo`` hands in a namespace of a few flags: the rest defaults)."""
    return TrainConfig(model=Model(args.model, getattr(args, "k", 8), getattr(args, "fm_l2", 1e-2),
                                   getattr(args, "hidden", (256, 128))),
                       data=fmt, optimizer=optimizer, epochs=args.epochs, batch_size=args.batch_size,
                       batch_ramp=getattr(args, "batch_ramp", 1.0),
                       seed=getattr(args, "seed", 0), pipeline=getattr(args, "pipeline", 2),
                       consistency=getattr(args, "consistency", "asp"), replicas=getattr(args, "replicas", 1),
                       layout=getattr(args, "table_layout", "auto"), filters=getattr(args, "filters", None),
                       lifecycle=getattr(args, "lifecycle", None), storage=getattr(args, "storage", "float32"))


class _Progress:
    """What a job shows while it runs: a live progress line on stderr (none when quiet), and
    under it where to look (the scheduler, the logs, the dashboard)."""

    def __init__(self, quiet: bool, line: Callable[[dict[str, Any], float], str] | None = None) -> None:
        self.quiet, self.line = quiet, line or _progress_line
        self.live: Live | None = None  # started with the first progress line: once the nodes are started (forked
        # from this process while it has no other thread: Live's refresh thread would be one)
        self.where: list[str] = []

    def show(self, status: dict[str, Any], seconds: float) -> None:
        if self.quiet:
            return
        if self.live is None:
            from rich.live import Live

            self.live = Live(console=_console(True), refresh_per_second=4, transient=False)
            self.live.start()
        self.live.update(self.line(status, seconds) + "".join(f"\n{w}" for w in self.where))

    def announce(self, cluster: Any) -> None:  # where to look while it runs: on the progress line
        collector.resume()  # the nodes are up: start-up is over (cli.main)
        self.where.append(f"scheduler {cluster.address}, logs {cluster.log_dir}")
        if getattr(cluster, "http_url", ""):
            token = f"?token={cluster.http_token}" if getattr(cluster, "http_token", "") else ""
            self.where.append(f"dashboard {cluster.http_url}{token}   metrics {cluster.http_url}metrics{token}")
            _console(True).print(self.where[-1])  # said once, whatever the progress line does

    def stop(self) -> None:
        """End the live line; the next output starts on a line of its own, even off a
        terminal (an error was once glued to the "scheduler ..., logs DIR" line)."""
        if self.live is not None:
            self.live.stop()
            if not _console(True).is_terminal:
                _console(True).print()
            self.live = None


def _run(cfg: TrainConfig, args: argparse.Namespace, data: list[str], test: list[str],
         progress: _Progress) -> dict[str, Any]:
    """The job on its cluster: vertical (``--feature-partition``) or by data shards."""
    parts = getattr(args, "feature_partition", None)
    if parts is not None:
        from paramserver.apps.ctr.vertical import run_vertical

        collector.resume()

        return run_vertical(cfg, data, test, parts, servers=args.servers, workers=args.workers,
                            save=getattr(args, "save", None),
                            cluster_options=_cluster_options(args))
    return run_training(cfg, data, test, servers=args.servers, workers=args.workers, setup=progress.announce,
                        cluster_options=_cluster_options(args),
                        save=getattr(args, "save", None),
                        shard_bytes=int(getattr(args, "shard_mb", 16) * (1 << 20)), on_progress=progress.show,
                        checkpoint_dir=getattr(args, "checkpoint_dir", None),
                        checkpoint_every=getattr(args, "checkpoint_every", None),
                        resume=getattr(args, "resume", None), allow_loss=getattr(args, "allow_loss", False),
                        keep_checkpoints=getattr(args, "keep_checkpoints", 3),
                        allow_unverified=getattr(args, "allow_unverified_checkpoint", False),
                        publish=getattr(args, "publish", None), publish_every=getattr(args, "publish_every", 10.0),
                        stream=getattr(args, "stream", None), max_examples=getattr(args, "max_examples", None),
                        until=getattr(args, "until", None),
                        checkpoint_seconds=getattr(args, "checkpoint_seconds", None))


def _train(args: argparse.Namespace, optimizer: Any, data: list[str], test: list[str],
           fmt: DataFormat) -> dict[str, Any]:
    cfg = _train_config(args, optimizer, fmt)
    cfg.table_spec()  # validate the optimizer before starting processes
    check_output(getattr(args, "metrics_out", None), "--metrics-out", folder=False)
    quiet = getattr(args, "quiet", False) or not sys.stderr.isatty() and os.environ.get("CI")
    progress = _Progress(bool(quiet))
    log_dir = getattr(args, "log_dir", None)
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    try:
        report = _run(cfg, args, data, test, progress)
    finally:
        progress.stop()
    _console(False).print(_report_table(report))
    metrics_out = getattr(args, "metrics_out", None)
    if metrics_out:
        write_text(metrics_out, json.dumps({k: v for k, v in report.items() if k != "traces"}, indent=1))
    return report


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
        _console(True).print("stopping: the stream is closed, the job finishes what it read (Ctrl-C again to "
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
        _console(True).print(f"writing {args.rows:,} synthetic Criteo-format rows (+ {args.rows // 10:,} test rows)")
        write_synth(train_path, args.rows, seed=1)
        write_synth(test_path, max(1, args.rows // 10), seed=2)
        _console(True).print(f"training logistic regression (FTRL) on {args.servers} server(s) and "
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
    _console(True).print(f"wrote {n:,} predictions to {'standard output' if args.out == '-' else args.out}; "
                         f"{share:.1%} of their features were never seen in training"
                         + (" (is this the data the model was trained for?)" if share > 0.5 else ""))
    return 0


def eval(args: argparse.Namespace, _: Any) -> int:  # noqa: A001 - the command's name
    check_output(args.metrics_out, "--metrics-out", folder=False)
    report = evaluate(args.model, args.data, args.skip_bad_lines, _overrides(args), args.allow_unverified_checkpoint)
    print(json.dumps(report), flush=True)  # one line: rich would wrap it at the terminal width
    if args.metrics_out:
        write_text(args.metrics_out, json.dumps(report, indent=1))
    return 0


def split_columns(args: argparse.Namespace, _: Any) -> int:
    from paramserver.apps.ctr.vertical import split_columns as split

    manifest = split(args.data, args.parts, args.out, args.format)
    _console(False).print(f"{manifest['lines']:,} lines in {args.parts} column blocks under {args.out}")
    return 0


def _cluster_options(args: argparse.Namespace) -> dict[str, Any]:
    """The launcher (``--cluster``, checked now, before any data is read) and its options."""
    from paramserver.cluster.launch import parse_cluster

    options: dict[str, Any] = {}
    where = getattr(args, "cluster", None) or "local"
    if parse_cluster(where)[0] != "local":
        options["cluster"] = where
    if getattr(args, "log_dir", None):
        options["log_dir"] = args.log_dir
    if getattr(args, "secret_file", None):
        if "cluster" in options:
            raise ConfigError(f"--secret-file keys a local cluster; with --cluster {where} give the nodes "
                              "PARAMSERVER_SECRET_FILE")
        options["secret_file"] = args.secret_file
    dashboard = getattr(args, "dashboard", None)
    if dashboard is not None:
        if "cluster" in options:
            raise ConfigError(f"--dashboard serves from a local cluster's scheduler; with --cluster {where} set "
                              "PARAMSERVER_HTTP_PORT for the scheduler instead")
        if not 0 <= dashboard <= 65535:
            raise ConfigError(f"--dashboard {dashboard}: a port must be in [0, 65535] (0 or none: any free one)")
        options["http_port"] = dashboard
    return options


def _checkpoints(args: argparse.Namespace) -> Any:
    from paramserver.apps.rounds.program import CheckpointOptions

    return CheckpointOptions(args.checkpoint_dir, args.checkpoint_every, args.keep_checkpoints, args.resume,
                             getattr(args, "allow_unverified_checkpoint", False))


@contextlib.contextmanager
def _watched(app: str, args: argparse.Namespace) -> Iterator[Any]:
    """A scheduled app's watch (``apps/rounds/job.Watch``): where to look once its nodes
    are up, and its rounds on a live line (none with ``--quiet``), as train shows its job."""
    from paramserver.apps.rounds.job import Watch

    def line(status: dict[str, Any], seconds: float) -> str:
        live = status.get("live", {})
        done, most = int(live.get("rounds", 0)), int(live.get("rounds_max", 0) - live.get("rounds_start", 0))
        of = f" of {most:,}" if 0 < most < 100_000 else ""
        return f"{app}: round {done:,}{of}  {seconds:,.0f} s" if done else f"{app}: starting ({seconds:,.0f} s)"

    quiet = getattr(args, "quiet", False) or getattr(args, "json", False) or (
        not sys.stderr.isatty() and os.environ.get("CI"))
    progress = _Progress(bool(quiet), line)
    if getattr(args, "log_dir", None):
        os.makedirs(args.log_dir, exist_ok=True)
    try:
        yield Watch(announce=progress.announce, progress=progress.show)
    finally:
        progress.stop()


def _round_report(app: str, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """A scheduled app's report: a table as train's (``--json``: one JSON line)."""
    if getattr(args, "json", False):
        print(json.dumps(report), flush=True)  # one line: rich would wrap it at the terminal width
        return
    from rich.table import Table

    table = Table(title=f"paramserver {app}", show_header=False)
    for key, value in report.items():
        if isinstance(value, bool) or value is None:
            table.add_row(key.replace("_", " "), str(value).lower())
        elif isinstance(value, int):
            table.add_row(key.replace("_", " "), f"{value:,}")
        elif isinstance(value, float):
            table.add_row(key.replace("_", " "), f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.6g}")
        elif isinstance(value, str):
            table.add_row(key.replace("_", " "), value)
        elif isinstance(value, (list, dict)) and len(json.dumps(value)) <= 80:
            table.add_row(key.replace("_", " "), json.dumps(value))
    _console(False).print(table)


def lasso(args: argparse.Namespace, _: Any) -> int:
    from paramserver.apps.rounds.lasso import run_lasso

    for flag, value in (("--workers", args.workers), ("--servers", args.servers), ("--max-rounds", args.max_rounds)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    with _watched("lasso", args) as watch:
        report = run_lasso(args.data, lam=args.lam, lambda_ratio=args.lambda_ratio, tol=args.tol,
                           schedule=args.schedule, workers=args.workers, servers=args.servers, save=args.save,
                           metrics_out=args.metrics_out, max_rounds=args.max_rounds, checkpoints=_checkpoints(args),
                           cluster_options=_cluster_options(args),
                           replicas=args.replicas, allow_loss=args.allow_loss, loss=args.loss,
                           kkt_filter=args.kkt_filter, intercept=args.intercept, filters=args.filters, watch=watch)
    report.pop("history", None)
    _round_report("lasso", args, report)
    if report["stalled"] and not report["converged"]:
        err = _console(True)
        err.print(f"lasso: the objective stopped improving (by less than 1e-9 of itself over 10 checks) with the "
                  f"duality gap at {report['relative_gap']:.2g} of it, above --tol {args.tol:g}: the gap is a loose "
                  "bound here (concurrent updates leave small optimality violations the objective no longer feels); "
                  "--workers 1 certifies tighter, more slowly")
    elif not report["converged"]:
        _console(True).print(f"lasso: stopped after {report['rounds']:,} rounds with the duality gap at "
                             f"{report['relative_gap']:.2g} of the objective, above --tol {args.tol:g}: "
                             "raise --max-rounds")
    return 0


def mf(args: argparse.Namespace, _: Any) -> int:
    from paramserver.apps.rounds.mf import MFConfig, run_mf

    cfg = MFConfig(rank=args.rank, epochs=args.epochs, lr=args.lr, reg=args.reg, seed=args.seed)
    with _watched("mf", args) as watch:
        report = run_mf(args.data, test=args.test, cfg=cfg, workers=args.workers, servers=args.servers,
                        predictions_out=args.predictions_out, save=args.save, metrics_out=args.metrics_out,
                        checkpoints=_checkpoints(args), cluster_options=_cluster_options(args),
                        replicas=args.replicas, allow_loss=args.allow_loss, filters=args.filters, watch=watch)
    _round_report("mf", args, report)
    return 0


def lda(args: argparse.Namespace, _: Any) -> int:
    from paramserver.apps.rounds.lda import LDAConfig, run_lda

    cfg = LDAConfig(topics=args.topics, iterations=args.iterations, alpha=args.alpha, beta=args.beta, seed=args.seed,
                    schedule=args.schedule, staleness=args.staleness)
    with _watched("lda", args) as watch:
        report = run_lda(args.data, cfg=cfg, workers=args.workers, servers=args.servers, save=args.save,
                         metrics_out=args.metrics_out, vocabulary=args.vocabulary, checkpoints=_checkpoints(args),
                         cluster_options=_cluster_options(args),
                         replicas=args.replicas, allow_loss=args.allow_loss, filters=args.filters, watch=watch)
    _round_report("lda", args, report)
    return 0


def synth(args: argparse.Namespace, _: Any) -> int:
    shape, days = getattr(args, "shape", "simple"), getattr(args, "days", None)
    if shape != "drift":
        if days is not None:
            raise ConfigError(f"--days is for --shape drift only, not --shape {shape}")
        size = write_synth(args.out, args.rows, args.seed, shape)
        _console(True).print(f"wrote {args.rows:,} rows ({size / 1e6:,.1f} MB) to {args.out}")
        return 0
    from paramserver.apps.ctr.drift import DEFAULT_DAYS, write_drift

    days = DEFAULT_DAYS if days is None else days
    size = write_drift(args.out, args.rows, days, args.seed)
    _console(True).print(f"wrote {days} days of {args.rows:,} rows ({size / 1e6:,.1f} MB) to {args.out}/day-*.tsv")
    return 0
