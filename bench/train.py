"""Training throughput and quality: paramserver against Vowpal Wabbit and scikit-learn.

Run: ``.venv/bin/python bench/train.py [--rows 1000000] [--repeat 3] [--json]``  (needs ``.[bench]``)

One synthetic Criteo-format file (``paramserver synth``) of ``--rows`` training rows and
a test file of ``rows / 10``; every learner makes one pass over the same rows with the
same hashed feature space (``--hash-bits``, default 24) and is scored on the same test
rows.  Timed: from the start of learning to the end of the pass, parsing included;
not timed: writing the data, VW's text conversion, cluster start-up and table creation, scoring.
Every learner runs ``--repeat`` times (default 3), the learners taking turns so a slow
spell of the machine (this 2-core VM varies ±15 % from run to run) hits all of them; the
table shows the median time with the range, and the worst test log loss of the runs.

* paramserver: logistic regression, FTRL, ``--batch-size`` (default 4000: on 1e6 rows,
  batch 1000 and 4000 give the same test log loss, 0.4341, and 4000 is ~1.5× faster:
  fewer requests and fewer distinct keys per example; 8000 loses log loss); 1 server +
  1 worker and 2 + 2; both table layouts (``--layouts``): dense arrays over the 2**BITS
  keys, as VW's weight vector, and hash tables.  Creating the table (a dense one is
  allocated and mapped whole) is not in the training time; it is printed ("table s").
* Vowpal Wabbit: ``--loss_function logistic -b BITS`` (its defaults: adaptive, normalised,
  invariant updates), reading its own text format with its own C++ parser; features are
  the same tokens (integer buckets and categorical values, per field namespace).
* scikit-learn: ``SGDClassifier(loss="log_loss")`` (defaults) with ``FeatureHasher(2**BITS)`` over the
  same tokens, ``partial_fit`` in batches of 10 000 (hashing included in the time).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

from paramserver.apps.models import Model, logloss
from paramserver.apps.synth import write_synth
from paramserver.apps.train import TrainConfig, run_training
from paramserver.data.reader import DataFormat


def criteo_tokens(line: str) -> tuple[int, list[str]]:
    """Label and the feature tokens of a Criteo line, as paramserver buckets them."""
    parts = line.rstrip("\n").split("\t")
    tokens = []
    for f in range(1, 14):
        v = parts[f]
        if v == "":
            tokens.append(f"i{f}_m")
        else:
            x = int(v)
            tokens.append(f"i{f}_{x if x <= 2 else int(math.log(x) ** 2) + 16}")
    for f in range(14, 40):
        tokens.append(f"c{f}_{parts[f] or 'm'}")
    return int(parts[0]), tokens


def to_vw(src: str, dst: str) -> None:
    with open(src) as fin, open(dst, "w") as fout:
        for line in fin:
            label, tokens = criteo_tokens(line)
            fout.write(f"{1 if label else -1} |f {' '.join(tokens)}\n")


def bench_vw(train_vw: str, test_vw: str, test_labels: np.ndarray, bits: int, tmp: str) -> dict:
    from vowpalwabbit import Workspace

    model = os.path.join(tmp, "vw.model")
    t0 = time.perf_counter()
    ws = Workspace(f"--quiet --loss_function logistic -b {bits} -d {train_vw} -f {model}")
    ws.finish()
    seconds = time.perf_counter() - t0
    preds_path = os.path.join(tmp, "vw.preds")
    Workspace(f"--quiet -t -i {model} -d {test_vw} -p {preds_path} --link logistic").finish()
    preds = np.loadtxt(preds_path)
    return {"learner": "vowpalwabbit", "seconds": seconds, "logloss": logloss(test_labels, preds)}


def read_tokens(path: str) -> tuple[np.ndarray, list[list[str]]]:
    labels, rows = [], []
    with open(path) as f:
        for line in f:
            y, tokens = criteo_tokens(line)
            labels.append(y)
            rows.append(tokens)
    return np.array(labels, np.float64), rows


def bench_sklearn(labels: np.ndarray, rows: list, test_labels: np.ndarray, test_rows: list, bits: int) -> dict:
    from sklearn.feature_extraction import FeatureHasher
    from sklearn.linear_model import SGDClassifier

    hasher = FeatureHasher(2**bits, input_type="string", alternate_sign=False)
    clf = SGDClassifier(loss="log_loss", random_state=0)
    t0 = time.perf_counter()
    for start in range(0, len(rows), 10_000):
        X = hasher.transform(rows[start:start + 10_000])
        clf.partial_fit(X, labels[start:start + 10_000], classes=[0, 1])
    seconds = time.perf_counter() - t0
    preds = clf.predict_proba(hasher.transform(test_rows))[:, 1]
    return {"learner": "scikit-learn", "seconds": seconds, "logloss": logloss(test_labels, preds)}


def bench_paramserver(train: str, test: str, bits: int, servers: int, workers: int, batch_size: int,
                      layout: str) -> dict:
    cfg = TrainConfig(Model("lr"), DataFormat("criteo", hash_bits=bits), batch_size=batch_size, layout=layout)
    report = run_training(cfg, [train], [test], servers=servers, workers=workers, shard_bytes=16 << 20)
    return {"learner": f"paramserver {servers}s+{workers}w {report['table_layout']}", "seconds": report["seconds"],
            "logloss": report["logloss"], "table_seconds": report["table_seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--hash-bits", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=4000, help="paramserver's mini-batch (default 4000)")
    ap.add_argument("--layouts", nargs="+", default=["dense", "hash"], choices=("dense", "hash"),
                    help="paramserver table layouts to run (default both)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--skip", nargs="*", default=[], help="learners to leave out: vw sklearn")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of every learner, interleaved; the median time counts (default 3)")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="paramserver-bench-") as tmp:
        train, test = os.path.join(tmp, "train.tsv"), os.path.join(tmp, "test.tsv")
        print(f"writing {args.rows:,} + {args.rows // 10:,} rows", file=sys.stderr)
        write_synth(train, args.rows, seed=1)
        write_synth(test, args.rows // 10, seed=2)
        os.sync()  # written back now, not by the kernel while a learner is timed
        test_labels, test_rows = read_tokens(test)
        learners = [functools.partial(bench_paramserver, train, test, args.hash_bits, servers, workers,
                                      args.batch_size, layout)
                    for layout in args.layouts for servers, workers in ((1, 1), (2, 2))]
        if "vw" not in args.skip:  # converted once, not timed
            to_vw(train, train + ".vw")
            to_vw(test, test + ".vw")
            os.sync()
            learners.append(functools.partial(bench_vw, train + ".vw", test + ".vw", test_labels, args.hash_bits,
                                              tmp))
        if "sklearn" not in args.skip:  # parsing to tokens is not timed (it is Python here)
            learners.append(functools.partial(bench_sklearn, *read_tokens(train), test_labels, test_rows,
                                              args.hash_bits))
        for _ in range(args.repeat):  # interleaved: a slow spell of the machine hits every learner
            for learner in learners:
                run = learner()
                runs.setdefault(run["learner"], []).append(run)
                print(run, file=sys.stderr)
    rows = [_summary(r) for r in runs.values()]
    for r in rows:
        r["rows"] = args.rows
        r["examples_per_s"] = args.rows / r["seconds"]
    vw = next((r for r in rows if r["learner"] == "vowpalwabbit"), None)
    for r in rows:
        r["vs_vw"] = r["examples_per_s"] / vw["examples_per_s"] if vw else None
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'learner':<28} {'examples/s':>12} {'(range)':>19} {'x VW':>6} {'test logloss':>13} {'table s':>8}")
    for r in rows:
        ratio = f"{r['vs_vw']:.2f}" if r["vs_vw"] else "-"
        table = f"{r['table_seconds']:.2f}" if "table_seconds" in r else "-"
        spread = f"{args.rows / max(r['seconds_runs']):,.0f}-{args.rows / min(r['seconds_runs']):,.0f}"
        print(f"{r['learner']:<28} {r['examples_per_s']:>12,.0f} {spread:>19} {ratio:>6} {r['logloss']:>13.4f} "
              f"{table:>8}")


def _summary(runs: list[dict]) -> dict:
    """One learner's runs: the median time, and the worst test log loss of any run (the
    asynchronous runs differ a little from run to run)."""
    times = sorted(r["seconds"] for r in runs)
    out = {"learner": runs[0]["learner"], "seconds": float(np.median(times)), "seconds_runs": times,
           "logloss": max(r["logloss"] for r in runs), "logloss_runs": [r["logloss"] for r in runs]}
    if "table_seconds" in runs[0]:
        out["table_seconds"] = float(np.median([r["table_seconds"] for r in runs]))
    return out


if __name__ == "__main__":
    main()
