"""What a user sees: ``paramserver train`` at its DEFAULT flags against Vowpal Wabbit, on
synthetic Criteo-format data of two shapes, in one run.

Run: ``.venv/bin/python bench/train.py [--rows 1000000] [--repeat 3] [--shapes simple heavy] [--json]``
(needs ``.[bench]``).

For each shape (``paramserver synth --shape simple|heavy``: see ``apps/synth.py``), a
training file of ``--rows`` rows and a test file of ``rows / 10``.  Learners, taking turns
``--repeat`` times so that a slow spell of this VM hits all of them:

* ``paramserver (defaults)``: the command a user types, ``paramserver train --data TRAIN
  --test TEST`` and nothing else (1 server, 1 worker), run as a subprocess.  Timed end to
  end ("command s": interpreter start, cluster start-up, training, scoring the test rows,
  shutdown); its report gives the job's examples/s (training only), the time from the
  command's start to the first example trained, and the test log loss and AUC.
* ``paramserver 2+2 (defaults)``: the same with ``--servers 2 --workers 2``.
* ``paramserver (tuned: FLAGS)``: rows with other flags, labelled with them.
* Every learner runs once untimed first (``--warmup``, the same for each): the first
  paramserver run after the heavy files were written was the slowest of its three in two
  runs of this script out of two (553 k against 645-720 k examples/s).
* ``vowpalwabbit``: VW 9 one pass, ``--loss_function logistic -b 24`` (its defaults: adaptive,
  normalised, invariant updates), in this process through its Python binding, reading its
  own text format (converted from the same rows beforehand, untimed: the conversion is
  Python); examples/s counts the training pass, "command s" the training pass and the
  scoring of the test file.  Features are the same tokens paramserver makes.

The table shows each learner's median and the worst test log loss of its runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench_harness.timing import Learner, interleave
from paramserver.apps.ctr.models import auc, logloss
from paramserver.apps.ctr.synth import write_synth

PS = [sys.executable, "-m", "paramserver", "train", "--quiet"]


def criteo_tokens(line: str) -> tuple[int, list[str]]:
    """Label and the feature tokens of a Criteo line, as paramserver buckets them."""
    parts = line.rstrip("\n").split("\t")
    tokens = []
    for f in range(1, 14):
        if parts[f]:
            x = int(parts[f])
            tokens.append(f"i{f}_{x if x <= 2 else int(math.log(x) ** 2) + 16}")
    for f in range(14, 40):
        tokens.append(f"c{f}_{parts[f] or 'm'}")
    return int(parts[0]), tokens


def to_vw(src: str, dst: str) -> np.ndarray:
    """Write ``src`` in VW's text format; return its labels."""
    labels = []
    with open(src) as fin, open(dst, "w") as fout:
        for line in fin:
            label, tokens = criteo_tokens(line)
            labels.append(label)
            fout.write(f"{1 if label else -1} |f {' '.join(tokens)}\n")
    return np.array(labels, np.float64)


def bench_vw(train_vw: str, test_vw: str, test_labels: np.ndarray, rows: int, tmp: str) -> dict:
    from vowpalwabbit import Workspace

    model, preds_path = os.path.join(tmp, "vw.model"), os.path.join(tmp, "vw.preds")
    t0 = time.perf_counter()
    Workspace(f"--quiet --loss_function logistic -b 24 -d {train_vw} -f {model}").finish()
    trained = time.perf_counter()
    Workspace(f"--quiet -t -i {model} -d {test_vw} -p {preds_path} --link logistic").finish()
    done = time.perf_counter()
    preds = np.loadtxt(preds_path)
    return {"learner": "vowpalwabbit", "examples_per_s": rows / (trained - t0), "command_s": done - t0,
            "logloss": logloss(test_labels, preds), "auc": auc(test_labels, preds)}


def bench_paramserver(label: str, flags: list[str], train: str, test: str, tmp: str) -> dict:
    report = os.path.join(tmp, "report.json")
    t0 = time.perf_counter()
    done = subprocess.run(PS + ["--data", train, "--test", test, "--metrics-out", report] + flags,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"paramserver train {' '.join(flags)} failed:\n{done.stderr}")
    with open(report) as f:
        r = json.load(f)
    return {"learner": label, "examples_per_s": r["examples_per_s"], "command_s": wall,
            "first_example_s": r.get("first_example_s"), "logloss": r["logloss"], "auc": r["auc"]}


def summary(runs: list[dict]) -> dict:
    """One learner's runs: medians, and the worst test log loss (and its AUC) of any run."""
    worst = max(runs, key=lambda r: r["logloss"])
    out = {"learner": runs[0]["learner"], "logloss": worst["logloss"], "auc": worst["auc"],
           "examples_per_s": float(np.median([r["examples_per_s"] for r in runs])),
           "examples_per_s_runs": [r["examples_per_s"] for r in runs],
           "command_s": float(np.median([r["command_s"] for r in runs])),
           "command_s_runs": [r["command_s"] for r in runs]}
    if runs[0].get("first_example_s") is not None:
        out["first_example_s"] = float(np.median([r["first_example_s"] for r in runs]))
    return out


def prepare_shape(shape: str, rows: int, tmp: str) -> tuple[str, str, np.ndarray]:
    """A training file of ``rows`` rows and a test file of ``rows / 10`` in ``tmp``, each also in VW's
    format beside it (``PATH.vw``): the two paths and the test labels."""
    train, test = os.path.join(tmp, f"{shape}.train.tsv"), os.path.join(tmp, f"{shape}.test.tsv")
    print(f"{shape}: writing {rows:,} + {rows // 10:,} rows", file=sys.stderr)
    write_synth(train, rows, seed=1, shape=shape)
    write_synth(test, max(1, rows // 10), seed=2, shape=shape)
    to_vw(train, train + ".vw")
    test_labels = to_vw(test, test + ".vw")
    os.sync()  # written back now, not while a learner is timed
    return train, test, test_labels


def run_shape(shape: str, rows: int, repeat: int, tuned: list[str], tmp: str, warmup: int = 1) -> list[dict]:
    train, test, test_labels = prepare_shape(shape, rows, tmp)
    learners: dict[str, Learner] = {
        "paramserver (defaults)": lambda: bench_paramserver("paramserver (defaults)", [], train, test, tmp),
        "paramserver 2+2 (defaults)": lambda: bench_paramserver(
            "paramserver 2+2 (defaults)", ["--servers", "2", "--workers", "2"], train, test, tmp)}
    for flags in tuned:
        label = f"paramserver (tuned: {flags})"
        learners[label] = lambda f=flags, n=label: bench_paramserver(n, f.split(), train, test, tmp)
    learners["vowpalwabbit"] = lambda: bench_vw(train + ".vw", test + ".vw", test_labels, rows, tmp)
    # interleaved: a slow spell of the machine hits every learner
    table = [summary(r) for r in interleave(learners, repeat, warmup, shape).values()]
    vw = next(r for r in table if r["learner"] == "vowpalwabbit")
    for r in table:
        r.update(shape=shape, rows=rows, vs_vw=r["examples_per_s"] / vw["examples_per_s"])
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--shapes", nargs="+", default=["simple", "heavy"], choices=("simple", "heavy"))
    ap.add_argument("--repeat", type=int, default=3, help="runs of every learner, interleaved (default 3)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed runs of every learner before the timed ones (default 1)")
    ap.add_argument("--tuned", nargs="*", default=[],
                    help="extra paramserver rows, each a string of flags, labelled 'tuned' (e.g. '--pipeline 4')")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    table: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="paramserver-bench-") as tmp:
        for shape in args.shapes:
            table += run_shape(shape, args.rows, args.repeat, args.tuned, tmp, args.warmup)
    if args.json:
        print(json.dumps(table, indent=1))
        return
    print(f"{'shape':<7} {'learner':<38} {'examples/s':>11} {'x VW':>5} {'command s':>9} {'1st ex s':>8} "
          f"{'test logloss':>12} {'AUC':>7}")
    for r in table:
        first = f"{r['first_example_s']:.2f}" if "first_example_s" in r else "-"
        print(f"{r['shape']:<7} {r['learner']:<38} {r['examples_per_s']:>11,.0f} {r['vs_vw']:>5.2f} "
              f"{r['command_s']:>9.2f} {first:>8} {r['logloss']:>12.4f} {r['auc']:>7.4f}")


if __name__ == "__main__":
    main()
