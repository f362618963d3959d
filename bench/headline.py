"""The comparisons this project is judged by, side by side in one run, in one table (issue 44.4).

    .venv/bin/python bench/headline.py [--sections train,lasso,celer,l1lr,mf,lda,lda1000,pushpull] [--repeat 3]
                                       [--quick]
                                       [--json FILE] [--markdown]
    make headline HEADLINE_FLAGS="--sections train --repeat 5"

Each row is one ratio of paramserver at its DEFAULT flags to a peer measured in the same run,
its goal (the constants below) and PASS or FAIL.  The sections reuse the scripts that own each
comparison, so a row here and a row of those scripts are the same measurement:

* train (``bench/train.py``): ``paramserver train --data TRAIN --test TEST`` (1 server, 1 worker)
  against Vowpal Wabbit on 10^6 heavy-tailed rows (``paramserver synth --shape heavy``); our
  command from interpreter start to exit, VW's training pass and scoring in this process.
* lasso (``bench/lasso.py``): ``paramserver lasso`` (its default: 2 workers, as for mf and lda) on
  news20 at λ_max/2000 against scikit-learn's coordinate descent (tol 1e-4); sub-optimality
  against celer's optimum (tol 1e-10).  Times: scikit-learn's ``fit`` call, our whole command.
* celer (``bench/lasso.py``): the same ``paramserver lasso`` at λ_max/10, /100 and /1 000 against
  celer's ``fit`` (tol 1e-4), issue 49's goal; sub-optimality against celer's optimum (tol 1e-10).
* l1lr (``bench/l1lr.py``): ``paramserver lasso --loss logistic`` (whole command, default flags)
  against liblinear (scikit-learn's ``LogisticRegression``, its ``fit`` at the default tol 1e-4)
  on news20 at λ_max/10, /100 and /1 000; the objective against liblinear's at tol 1e-8.
* mf (``bench/mf.py``): ``paramserver mf`` (whole command) against Surprise's SVD (its ``fit``)
  on 4 M synthetic ratings, where start-up is a small part of the command.
* lda (``bench/lda.py``): ``paramserver lda`` (whole command) against tomotopy (its ``train``,
  2 threads) on 20 Newsgroups and NYT, K = 50, 200 iterations; held-out perplexity.
* lda1000: the same at K = 1 000 (issue 49's goals there), where ``paramserver lda``'s default
  sampler is ``hybrid``.
* pushpull (``bench/pushpull.py``): keys/s both ways, 1 server, dim 1, batches of 10^6 keys,
  against ps-lite's stock server (``KVServerDefaultHandle``) in the same run, built from its source
  by ``make pslite`` (``bench/pslite/``); "not run" where it is not built.

``--repeat N`` runs each pair N times, taking turns (medians of times, the worst of quality),
after one untimed run of paramserver (``WARM``: a fresh checkout compiles numba's kernels then);
push/pull measures for a fixed time instead.  A section whose peer is not installed, or whose
data is absent, is "not run" and says why.  ``--quick`` is a smoke run of the script itself on
small sizes: its table is labelled "quick: not the headline".  The exit status is 0 whatever the
ratios; 1 only where a section failed to run (its error is in the table and on stderr).
``--markdown`` prints the table as the block that opens ``docs/benchmarks.md`` instead: dated,
with the commit, the command, the machine, and each ratio against its peer and goal.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import asdict
from typing import Any

import numpy as np

import headline_l1
from bench_harness.timing import interleave
from bench_harness.verdict import WARM, Goal, Row, Section, fresh, judged, median, not_run, worst
from headline_l1 import section_celer, section_l1lr, section_lasso

# issue 44's goals: Fwumious Wabbit runs 7.8-14.8x VW on one core, so a compiled per-key path can beat VW 3x
TRAIN_SPEED = Goal(">=", 3.0, "issue 44: the default job at 3x VW's examples/s")
# the user times the whole command (start-up, cluster, training, scoring), not the training loop alone
TRAIN_COMMAND = Goal("<=", 0.5, "issue 44: the whole command in half VW's time")
# speed bought with a worse model is no gain: the test log loss may not exceed VW's
TRAIN_LOSS = Goal("<=", 1.0, "issue 44: test log loss at most VW's")
# issue 49 (issue 15 asked 0.5x): the whole command against Surprise's fit alone, on the multi-million set
MF_TIME = Goal("<=", 0.1, "issue 49: a tenth of Surprise's fit time")
# issue 15: the same or a better held-out RMSE
MF_RMSE = Goal("<=", 1.0, "issue 15: test RMSE at most Surprise's")
# issue 49 at K = 50 (issue 44.5 asked parity with tomotopy's C++ sampler, issue 15 0.5x)
LDA_SPEED = Goal(">=", 2.0, "issue 49: twice tomotopy's token-iterations/s at K = 50")
# 5x the gap issue 15 measured (0.999-1.001x): room for the sampler's noise, none for a worse model
LDA_PERPLEXITY = Goal("<=", 1.005, "issue 44.5: perplexity within 0.5 % of tomotopy's")
# issue 49 at many topics, where an O(1) sampler pays: 5x tomotopy's speed at K = 1 000, perplexity within 2 %
LDA_MANY_SPEED = Goal(">=", 5.0, "issue 49: 5x tomotopy's token-iterations/s at K = 1 000")
LDA_MANY_PERPLEXITY = Goal("<=", 1.02, "issue 49: perplexity within 2 % of tomotopy's")
LDA_MANY_TOPICS = 1000
# issue 44: twice ps-lite's stock server, both directions, 1 server
PUSHPULL = Goal(">=", 2.0, "issue 44: 2x ps-lite's stock server")


def section_train(args: argparse.Namespace, tmp: str) -> tuple[list[Row], dict[str, Any]]:
    from train import bench_paramserver, bench_vw, prepare_shape, summary

    n = 20_000 if args.quick else 1_000_000
    train, test, labels = prepare_shape("heavy", n, tmp)
    runs = interleave({"paramserver": lambda: bench_paramserver("paramserver (defaults)", [], train, test, tmp),
                       "vowpalwabbit": lambda: bench_vw(train + ".vw", test + ".vw", labels, n, tmp)},
                      args.repeat, warmup=1, tag="train")
    ps, vw = summary(runs["paramserver"]), summary(runs["vowpalwabbit"])
    name = f"train heavy {n:,}"
    rows = [judged(name, "examples/s ÷ VW's", TRAIN_SPEED, ps["examples_per_s"] / vw["examples_per_s"],
                   f"{ps['examples_per_s']:,.0f} ex/s", f"{vw['examples_per_s']:,.0f} ex/s"),
            judged(name, "whole command ÷ VW's", TRAIN_COMMAND, ps["command_s"] / vw["command_s"],
                   f"{ps['command_s']:.2f} s", f"{vw['command_s']:.2f} s"),
            judged(name, "test log loss ÷ VW's", TRAIN_LOSS, ps["logloss"] / vw["logloss"],
                   f"{ps['logloss']:.5f}", f"{vw['logloss']:.5f}")]
    return rows, {"rows": n, "paramserver": ps, "vowpalwabbit": vw}


def section_mf(args: argparse.Namespace, tmp: str) -> tuple[list[Row], dict[str, Any]]:
    from mf import ours, surprise_svd, synthetic

    n = 200_000 if args.quick else 4_000_000
    train, test = os.path.join(tmp, "mf.train.tsv"), os.path.join(tmp, "mf.test.tsv")
    synthetic(train, test, n)
    runs = interleave({"surprise": lambda: surprise_svd(train, test),
                       "paramserver": lambda: ours(train, test, fresh(tmp), [])}, args.repeat, tag="mf", warm=WARM)
    ps_s, su_s = median(runs["paramserver"], "seconds"), median(runs["surprise"], "seconds")
    ps_rmse, su_rmse = worst(runs["paramserver"], "rmse"), worst(runs["surprise"], "rmse")
    name = f"mf synthetic {n / 1e6:g} M"
    rows = [judged(name, "whole command ÷ Surprise's fit", MF_TIME, ps_s / su_s, f"{ps_s:.2f} s", f"{su_s:.2f} s"),
            judged(name, "test RMSE ÷ Surprise's", MF_RMSE, ps_rmse / su_rmse, f"{ps_rmse:.4f}", f"{su_rmse:.4f}")]
    return rows, {"ratings": n, **runs}


def lda_corpus(name: str, args: argparse.Namespace, tmp: str, topics: int = 50,
               goals: tuple[Goal, Goal] = (LDA_SPEED, LDA_PERPLEXITY)) -> tuple[list[Row], dict[str, Any]]:
    from lda import load_corpus, ours, perplexity, tomotopy_run

    found = load_corpus(name, tmp)
    if found is None:
        return [not_run(f"lda {name}", "its corpus is absent (see ../shared/data/SOURCES.md)")], {}
    path, train, test = found
    alpha, beta = 0.1, 0.01  # bench/lda.py's
    K, it = (min(topics, 100), 20) if args.quick else (topics, 200)
    work = train.tokens * it

    def tomotopy() -> dict:
        n_kw, seconds = tomotopy_run(train, K, it, alpha, beta)
        return {"seconds": seconds, "token_iterations_per_s": work / seconds,
                "perplexity": perplexity(n_kw, test, alpha, beta)}

    def paramserver() -> dict:
        n_kw, seconds, _ = ours(path, K, it, fresh(tmp), [])
        return {"seconds": seconds, "token_iterations_per_s": work / seconds,
                "perplexity": perplexity(n_kw, test, alpha, beta)}

    runs = interleave({"tomotopy": tomotopy, "paramserver": paramserver}, args.repeat, tag=f"lda {name}", warm=WARM)
    ps_v, tp_v = (median(runs[k], "token_iterations_per_s") for k in ("paramserver", "tomotopy"))
    ps_p, tp_p = (worst(runs[k], "perplexity") for k in ("paramserver", "tomotopy"))
    label = f"lda {name} K={K} {it} it"
    rows = [judged(label, "token-it/s ÷ tomotopy's", goals[0], ps_v / tp_v, f"{ps_v / 1e6:.2f} M/s",
                   f"{tp_v / 1e6:.2f} M/s"),
            judged(label, "perplexity ÷ tomotopy's", goals[1], ps_p / tp_p, f"{ps_p:.1f}", f"{tp_p:.1f}")]
    return rows, {"topics": K, "iterations": it, "tokens": train.tokens, **runs}


def section_lda(args: argparse.Namespace, tmp: str, topics: int = 50,
                goals: tuple[Goal, Goal] = (LDA_SPEED, LDA_PERPLEXITY)) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    for name in ["nyt"] if args.quick else ["20ng", "nyt"]:
        more, raw[name] = lda_corpus(name, args, tmp, topics, goals)
        rows += more
    return rows, raw


def section_pushpull(args: argparse.Namespace, tmp: str) -> tuple[list[Row], dict[str, Any]]:
    from paramserver._runtime.malloc import tune_allocator
    from pslite.driver import NotBuilt, ratios
    from pslite.driver import run as run_pslite
    from pushpull import budget, throughput_rows

    tune_allocator()  # this process plays the worker, as in pushpull.py (and this section runs last)
    batch = 100_000 if args.quick else 1_000_000
    measured = throughput_rows(1, [batch], [1], 1, args.quick)
    name = f"pushpull 1 server dim 1 {batch:,} keys"
    try:
        peer = run_pslite([batch], *budget(args.quick))  # the same batch, window (1) and time budget
    except NotBuilt as exc:
        print(f"headline: pushpull: {exc}", file=sys.stderr)
        return [Row(name, f"{r['op']} keys/s ÷ ps-lite's", str(PUSHPULL), None, f"{r['keys_per_s'] / 1e6:.2f} M keys/s",
                    "-", "not run: ps-lite not built (make pslite)") for r in measured], {"rows": measured}
    rows = [judged(name, f"{r['op']} keys/s ÷ ps-lite's", PUSHPULL, r["ratio"],
                   f"{r['paramserver_keys_per_s'] / 1e6:.2f} M keys/s", f"{r['pslite_keys_per_s'] / 1e6:.2f} M keys/s")
            for r in ratios(measured, peer)]
    return rows, {"rows": measured, "pslite": peer}


# name: (the section, the peers it imports as (module, package to install)); run in this order, push/pull
# last because it tunes this process's allocator
SECTIONS: dict[str, tuple[Section, list[tuple[str, str]]]] = {
    "train": (section_train, [("vowpalwabbit", "vowpalwabbit")]),
    "lasso": (section_lasso, [("sklearn", "scikit-learn"), ("celer", "celer")]),
    "celer": (section_celer, [("celer", "celer")]),
    "l1lr": (section_l1lr, [("sklearn", "scikit-learn")]),
    "mf": (section_mf, [("surprise", "scikit-surprise"), ("pandas", "pandas")]),
    "lda": (section_lda, [("tomotopy", "tomotopy")]),
    # issue 49 at many topics, where paramserver lda's default sampler is hybrid
    "lda1000": (functools.partial(section_lda, topics=LDA_MANY_TOPICS, goals=(LDA_MANY_SPEED, LDA_MANY_PERPLEXITY)),
                [("tomotopy", "tomotopy")]),
    "pushpull": (section_pushpull, []),
}


def run_section(name: str, args: argparse.Namespace) -> tuple[list[Row], dict[str, Any], bool]:
    """One section's rows and raw figures, and False where it failed to run (its error on stderr)."""
    section, peers = SECTIONS[name]
    missing = [package for module, package in peers if importlib.util.find_spec(module) is None]
    if missing:
        return [not_run(name, f"pip install {' '.join(missing)} (the .[bench] extra)")], {"missing": missing}, True
    print(f"headline: {name}", file=sys.stderr, flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix=f"paramserver-headline-{name}-") as tmp:
            rows, raw = section(args, tmp)
        return rows, raw, True
    except (Exception, SystemExit) as exc:  # a paramserver command that failed raises SystemExit in the scripts
        traceback.print_exc()
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        why = lines[0] + (f" ... {lines[-1]}" if len(lines) > 1 else "")
        return [not_run(name, why[:200], "error")], {"error": str(exc)}, False


def commit() -> str:
    """The commit of the tree whose ``paramserver`` the runs import (another tree's ``src`` on
    ``PYTHONPATH``, for a before run, is named, not this checkout), with "+dirty" where it has
    changes."""
    import importlib.util

    spec = importlib.util.find_spec("paramserver")
    here = os.path.dirname(os.path.abspath(spec.origin if spec and spec.origin else __file__))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain"], capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty.strip() else "")


def print_table(title: str, rows: list[Row]) -> None:
    print(title)
    print("| section | ratio | goal | measured | paramserver | peer | result |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        value = "-" if r.value is None else f"{r.value:.4g}"  # 4 digits: a loss ratio of 1.007 is not 1.01
        print(f"| {r.section} | {r.ratio} | {r.goal} | {value} | {r.ours} | {r.peer} | {r.result} |")


def machine() -> str:
    """The machine in one line: cores, CPU, memory, kernel, and the versions that move figures."""
    import platform

    cpu = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    mem = ""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        kb = int(next(ln for ln in f if ln.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB"
    return (f"{os.cpu_count()} cores ({cpu}){mem}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, numpy {np.__version__}")


def markdown_block(rows: list[Row], *, when: str, commit: str, command: str, machine: str, quick: bool,
                   load: tuple[float, float]) -> str:
    """The block that opens ``docs/benchmarks.md``: today's figures, dated, each ratio against
    its peer and its goal, and the count of goals met."""
    judged_rows = [r for r in rows if r.result in ("PASS", "FAIL")]
    met = sum(r.result == "PASS" for r in judged_rows)
    head = ("## Today's figures (quick: a smoke run, not the headline)" if quick else "## Today's figures")
    out = [head, "",
           f"Measured {when}, commit {commit}, with `{command}` on {machine}; load average "
           f"{load[0]:.1f} -> {load[1]:.1f}.  Each row is paramserver at its default flags against its peer in the "
           f"same run: the ratio, its goal, both sides' figures, and the verdict ({met} of {len(judged_rows)} goals "
           "met).  Written by `bench/headline.py --markdown`; how each is measured: \"Headline\" below.", "",
           "| comparison | ratio | goal | measured | paramserver | peer | result |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        value = "-" if r.value is None else f"{r.value:.4g}"  # 4 digits: a loss ratio of 1.007 is not 1.01
        result = f"**{r.result}**" if r.result == "FAIL" else r.result
        out.append(f"| {r.section} | {r.ratio} | {r.goal} | {value} | {r.ours} | {r.peer} | {result} |")
    return "\n".join(out)


def sections_arg(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown section {unknown[0] if unknown else text!r}: "
                                         f"choose from {','.join(SECTIONS)}, comma-separated")
    return [n for n in SECTIONS if n in names]  # push/pull last, whatever the order given


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", type=sections_arg, default=list(SECTIONS),
                    help=f"comma-separated, of {','.join(SECTIONS)} (default: all)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs of each pair, taking turns (default 3; 1 with --quick); push/pull runs once")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run of the script, not the headline")
    ap.add_argument("--json", metavar="FILE", help="write every number to FILE")
    ap.add_argument("--markdown", action="store_true",
                    help="print the table as the dated block that opens docs/benchmarks.md")
    args = ap.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.repeat < 1:
        ap.error(f"--repeat must be >= 1, got {args.repeat}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, load_start = datetime.datetime.now(datetime.UTC), os.getloadavg()[0]
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    ok = True
    for name in args.sections:
        more, raw[name], ran = run_section(name, args)
        rows += more
        ok = ok and ran
    load_end = os.getloadavg()[0]
    title = (f"{'quick: not the headline' if args.quick else 'headline'}: commit {commit()}, "
             f"{started:%Y-%m-%d %H:%M} UTC, --repeat {args.repeat}, load average {load_start:.1f} -> {load_end:.1f}")
    if args.markdown:
        command = " ".join(["bench/headline.py", *(sys.argv[1:] if argv is None else argv)])
        print(markdown_block(rows, when=f"{started:%Y-%m-%d %H:%M} UTC", commit=commit(), command=command,
                             machine=machine(), quick=args.quick, load=(load_start, load_end)))
    else:
        print_table(title, rows)
    if args.json:
        goals = {k: asdict(v) for module in (globals(), vars(headline_l1)) for k, v in module.items()
                 if isinstance(v, Goal)}
        report = {"title": title, "quick": args.quick, "repeat": args.repeat, "commit": commit(),
                  "started": started.isoformat(), "load_average": [load_start, load_end], "goals": goals,
                  "rows": [asdict(r) for r in rows], "sections": raw}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=float)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
