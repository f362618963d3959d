"""The command line of the round apps (apps/rounds): ``lasso``, ``mf`` and ``lda``, scheduled
programs that run on a local cluster of their own and checkpoint at round boundaries: their
flags, and what they do (watched as ``train`` is: ``cli/running.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from paramserver.apps.rounds.settings import LDAConfig, MFConfig
from paramserver.cli.parser import cluster_flag, filters_flag, loss_flags, secret_flag, unverified_flag, watch_flags
from paramserver.cli.running import Progress, cluster_options, console
from paramserver.data.files import report_json
from paramserver.errors import ConfigError

if TYPE_CHECKING:
    from paramserver.cli.parser import Subparsers


def _round_checkpoint_flags(p: argparse.ArgumentParser, unit: str, default: int) -> None:
    """The checkpoint flags of a scheduled app (``schedule.CheckpointOptions``)."""
    p.add_argument("--checkpoint-dir", metavar="URL", help="checkpoint the model and every worker's state here "
                   "(a folder or fsspec URL) at round boundaries; an existing checkpoint there needs --resume")
    p.add_argument("--checkpoint-every", type=int, default=default, metavar="N",
                   help=f"{unit} between two checkpoints (default {default}; the last one is always checkpointed)")
    p.add_argument("--keep-checkpoints", type=int, default=3, metavar="N",
                   help="keep the newest N complete checkpoints under --checkpoint-dir, remove older ones (0: all)")
    p.add_argument("--resume", metavar="URL", help="go on from the newest complete checkpoint in this folder (or "
                   "this step): same data and layout settings; it checks them")
    unverified_flag(p)


def _cluster_flags(p: argparse.ArgumentParser, filters: str = "none (default)") -> None:
    """The cluster a round app starts: its processes, where, what a server's death may cost,
    and what its tables send (``filters``: the default's help text)."""
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--servers", type=int, default=1, help="server processes (default 1)")
    cluster_flag(p)
    loss_flags(p)
    filters_flag(p, filters)
    secret_flag(p)
    watch_flags(p)
    p.add_argument("--json", action="store_true", help="print the report as one JSON line, not a table")


def _flag_fields(config: type) -> list[dataclasses.Field[Any]]:
    """The fields of ``config`` (``MFConfig``, ``LDAConfig``) that are flags (``settings.flag``)."""
    return [f for f in dataclasses.fields(config) if "help" in f.metadata]


def _config_flags(p: argparse.ArgumentParser, config: type) -> None:
    """One flag a flag field of the ``config`` dataclass, typed and defaulted as the field,
    so that a default and its help are written once (``_config`` reads them back)."""
    for f in _flag_fields(config):
        plain = isinstance(f.default, str) or "type" in f.metadata["options"]  # a str, or typed by its options
        kind: dict[str, Any] = {} if plain else {"type": type(f.default)}
        p.add_argument(f"--{f.name.replace('_', '-')}", default=f.default, help=f.metadata["help"], **kind,
                       **f.metadata["options"])


def _config(args: argparse.Namespace, config: type) -> Any:
    """The ``config`` dataclass of the flags ``_config_flags`` declared."""
    return config(**{f.name: getattr(args, f.name) for f in _flag_fields(config)})


def _app_parser(sub: Subparsers, name: str, text: str, data: str) -> argparse.ArgumentParser:
    """A round app's command and its one required input, ``--data``."""
    p = sub.add_parser(name, help=text)
    p.add_argument("--data", required=True, help=data)
    return p


def _result_flags(p: argparse.ArgumentParser, save: str, metrics: str, unit: str, every: int) -> None:
    """What a round app leaves behind: its model (``--save DIR``), its report and checkpoints
    every ``every`` of its ``unit``."""
    p.add_argument("--save", metavar="DIR", help=save)
    p.add_argument("--metrics-out", metavar="FILE", help=metrics)
    _round_checkpoint_flags(p, unit, every)


def add_lasso(sub: Subparsers) -> None:
    p = _app_parser(sub, "lasso", "L1-regularised least squares (Lasso) or logistic regression by coordinate descent "
                    "scheduled over the workers (STRADS style) on a local cluster", "LIBSVM file: 'target "
                    "index:value ...' (target a real number; with --loss logistic a label 1 or -1, or 1 or 0; indices "
                    "from 1, or from 0 where an index 0 appears; svmlight's qid: and # comments skipped; .gz ok; "
                    "local or fsspec URL)")
    p.add_argument("--loss", default="squared", choices=("squared", "logistic"), help="squared (default): "
                   "1/(2n)·‖y − Xw‖² + λ‖w‖₁; logistic: (1/n)·Σ log(1 + exp(−y_i x_iᵀw)) + λ‖w‖₁ (no intercept)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--lambda", dest="lam", type=float, metavar="L", help="the L1 weight λ")
    how.add_argument("--lambda-ratio", type=float, metavar="R", help="λ = λ_max / R (λ_max, the smallest λ with "
                     "w = 0: ‖Xᵀy‖∞ / n for squared, ‖Xᵀy‖∞ / (2n) for logistic)")
    p.add_argument("--tol", type=float, default=1e-4, help="stop when the duality gap is below TOL times the "
                   "objective: then the objective is within TOL of the optimum, relatively (default 1e-4; both losses)")
    p.add_argument("--intercept", action="store_true", help="with --loss logistic: an unpenalised intercept b in "
                   "the margin x_iᵀw + b (set exactly for the coefficients at each check; --save writes "
                   "DIR/intercept.npy)")
    p.add_argument("--kkt-filter", action=argparse.BooleanOptionalAction, default=True, help="skip, until the next "
                   "check, the coordinates at zero whose gradient is inside [−λ, λ] (a proximal step leaves them at "
                   "zero): not computed, pushed or pulled; counted in the report as kkt_skipped and active_set "
                   "(default on; the gap still looks at every coordinate, so the solution is the same)")
    p.add_argument("--schedule", default="priority", choices=("priority", "cyclic", "random"),
                   help="which coordinates a round updates: priority (default; by recent change, STRADS), "
                        "cyclic or random (for comparison)")
    _cluster_flags(p)
    p.add_argument("--max-rounds", type=int, default=1_000_000, help="stop after this many rounds even if the "
                   "gap is not below --tol (it is said)")
    _result_flags(p, "write DIR/coef.npy: float64, entry i is feature i + 1 (feature i where the "
                  "file's indices start at 0: an index 0 in it)", "write objective, duality gap, "
                  "non-zeros, seconds, coordinate updates, the active set after each check and kkt_skipped as JSON",
                  "rounds", 100)


def add_mf(sub: Subparsers) -> None:
    p = _app_parser(sub, "mf", "biased matrix factorisation trained model-parallel by block rotation (DSGD) on a "
                    "local cluster", "training ratings: 'user item rating [timestamp]' lines (MovieLens u.data TSV, "
                    "ratings.csv with its header, or ratings.dat '::'; ids whole numbers, or names where the first "
                    "line's are, as in Amazon's ratings files); .gz ok; local or fsspec URL")
    p.add_argument("--test", help="ratings to predict and score (same formats): test RMSE in the report")
    _config_flags(p, MFConfig)
    _cluster_flags(p)
    p.add_argument("--predictions-out", metavar="FILE", help="one predicted rating per --test line, in order")
    _result_flags(p, "write DIR/mf.npz: ids, factors, biases, global mean", "write test RMSE, seconds and rating "
                  "updates/s as JSON", "epochs", 5)


def add_lda(sub: Subparsers) -> None:
    p = _app_parser(sub, "lda", "topic model (LDA) by collapsed Gibbs sampling, word blocks scheduled over the "
                    "workers (STRADS/LightLDA style) on a local cluster", "corpus: UCI docword (D, V, NNZ lines, "
                    "then 'doc word count', 1-based), LDA-C ('N word:count ...', 0-based) or text (a line a "
                    "document, its words separated by blanks up to a tab, as OCTIS's corpus.tsv); .gz ok; local or "
                    "fsspec URL")
    p.add_argument("--vocabulary", metavar="FILE", help="LDA-C and text: the vocabulary, one word a line (word i on "
                   "line i), so V covers words no document uses and text's words are numbered as it numbers them "
                   "(default: <name>.tokens, <name>.vocab, vocab.txt or vocabulary.txt beside the corpus if there, "
                   "else the largest word + 1, and for text the corpus's own words in byte order, which --save "
                   "writes to DIR/vocabulary.txt)")
    _config_flags(p, LDAConfig)
    _cluster_flags(p, "none (default on a local cluster below 256 topics; else 'push=sparse;reply=sparse': the "
                   "non-zero counts and a bit a count, the same model)")
    _result_flags(p, "write DIR/topic_word.npy: K x V counts n_kw, column j = word j in the input's numbering from "
                  "0", "write log-likelihood per token, tokens and token-iterations/s as JSON", "iterations", 20)


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
    progress = Progress(bool(quiet), line)
    if getattr(args, "log_dir", None):
        os.makedirs(args.log_dir, exist_ok=True)
    try:
        yield Watch(announce=progress.announce, progress=progress.show)
    finally:
        progress.stop()


def _round_report(app: str, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """A scheduled app's report: a table as train's (``--json``: one JSON line); MF's test
    ratings mostly of users or items never trained on said on stderr."""
    if report.get("test_unseen_share", 0.0) > 0.5:
        console(True).print(f"{report['test_unseen_share']:.1%} of the test ratings have a user or item never seen in "
                            "training (is this the test file for this training file?)")
    if getattr(args, "json", False):
        print(report_json(report), flush=True)  # one line: rich would wrap it at the terminal width
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
    console(False).print(table)


def lasso(args: argparse.Namespace) -> int:
    from paramserver.apps.rounds.lasso import run_lasso

    for flag, value in (("--workers", args.workers), ("--servers", args.servers), ("--max-rounds", args.max_rounds)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    with _watched("lasso", args) as watch:
        report = run_lasso(args.data, lam=args.lam, lambda_ratio=args.lambda_ratio, tol=args.tol,
                           schedule=args.schedule, workers=args.workers, servers=args.servers, save=args.save,
                           metrics_out=args.metrics_out, max_rounds=args.max_rounds, checkpoints=_checkpoints(args),
                           cluster_options=cluster_options(args),
                           replicas=args.replicas, allow_loss=args.allow_loss, loss=args.loss,
                           kkt_filter=args.kkt_filter, intercept=args.intercept, filters=args.filters, watch=watch)
    report.pop("history", None)
    _round_report("lasso", args, report)
    if report["stuck"] and not report["converged"]:
        console(True).print(f"lasso: nothing moved over 10 checks, the objective nor the duality gap (at "
                            f"{report['relative_gap']:.2g} of the objective, above --tol {args.tol:g}): λ = "
                            f"{report['lambda']:.3g} is at the resolution of float64 for this data, where no gap "
                            "can be certified; give a larger λ (a smaller --lambda-ratio)")
    elif report["stalled"] and not report["converged"]:
        err = console(True)
        err.print(f"lasso: the objective stopped improving (by less than 1e-9 of itself over 10 checks) with the "
                  f"duality gap at {report['relative_gap']:.2g} of it, above --tol {args.tol:g}: the gap is a loose "
                  "bound here (concurrent updates leave small optimality violations the objective no longer feels); "
                  "--workers 1 certifies tighter, more slowly")
    elif not report["converged"]:
        console(True).print(f"lasso: stopped after {report['rounds']:,} rounds with the duality gap at "
                             f"{report['relative_gap']:.2g} of the objective, above --tol {args.tol:g}: "
                             "raise --max-rounds")
    return 0


def mf(args: argparse.Namespace) -> int:
    from paramserver.apps.rounds.mf import run_mf

    cfg = _config(args, MFConfig)
    with _watched("mf", args) as watch:
        report = run_mf(args.data, test=args.test, cfg=cfg, workers=args.workers, servers=args.servers,
                        predictions_out=args.predictions_out, save=args.save, metrics_out=args.metrics_out,
                        checkpoints=_checkpoints(args), cluster_options=cluster_options(args),
                        replicas=args.replicas, allow_loss=args.allow_loss, filters=args.filters, watch=watch)
    _round_report("mf", args, report)
    return 0


def lda(args: argparse.Namespace) -> int:
    from paramserver.apps.rounds.lda import run_lda

    cfg = _config(args, LDAConfig)
    with _watched("lda", args) as watch:
        report = run_lda(args.data, cfg=cfg, workers=args.workers, servers=args.servers, save=args.save,
                         metrics_out=args.metrics_out, vocabulary=args.vocabulary, checkpoints=_checkpoints(args),
                         cluster_options=cluster_options(args),
                         replicas=args.replicas, allow_loss=args.allow_loss, filters=args.filters, watch=watch)
    _round_report("lda", args, report)
    return 0
