"""paramserver against the systems the source documents name, on their own jobs (issue 34):
Spark MLlib, TensorFlow's parameter-server training (and a single-process Keras model) and,
where it installs, MXNet's KVStore.

Run (never part of ``make test``): ``make seeds`` (a venv of its own, ``.venv-seeds``, with
``.[seeds]``: pyspark, tensorflow-cpu; Spark needs Java 17+), or by hand::

    .venv-seeds/bin/python bench/seeds.py [--sections lr mf lda] [--sets a9a criteo heavy]
        [--repeat 1] [--timeout 900] [--json OUT]

Every run is a command of its own, started here as a user would start it, one at a time,
interleaved round by round.  For each the table gives: the test metric (log loss and AUC,
RMSE, or perplexity), the whole command's wall time (interpreter, JVM or TF runtime, reading
the data, training, scoring, shutdown), the training alone as the system reports it,
examples/s of that training, and the peak resident memory of the command's whole process
tree (the sum of every process's RSS, sampled every 50 ms, and the same with PSS, which
counts a page shared by forked processes once).

Fairness, the same for every system:
- **LR.** a9a → a9a.t as published (123 features).  The Criteo sample and 10^6 heavy-tailed
  Criteo-format rows (``paramserver synth --shape heavy``) are hashed once by paramserver's
  own featurizer into 2^24 buckets and written as LIBSVM files, which Spark (its libsvm
  reader), TensorFlow (tf.data) and MXNet read; paramserver reads the raw files with the
  same hashing, so every system sees the same features.  Log loss and AUC are computed here
  from each peer's test probabilities with paramserver's own functions (p clipped to
  [1e-15, 1 - 1e-15]); paramserver's come from its report, computed the same way.
- **MF.** ml-100k ``ua.base`` → ``ua.test``, and a power-law set (``bench/mf.py``'s
  generator).  RMSE over every test rating; a rating Spark cannot predict (coldStartStrategy
  "nan", its default) is predicted as the training mean, and the count is shown.
- **LDA.** 20 Newsgroups (its own train/test files), K = 50 for all.  Held-out
  document-completion perplexity from each model's topic-word matrix M: φ = (M + 0.01) /
  (Σ_w M + V·0.01), half of each test document's tokens fold θ in (50 EM steps, α = 0.1),
  the other half is scored (``bench/lda.py``'s procedure, the same for every model).

A row's settings say what it is: "defaults" is the system with no setting changed; "one
pass" limits it to one pass where the system has such a setting; a "fixed" row changes only
what the default needs to run at all, beside the failing default row.  A run that fails,
diverges or passes --timeout is shown with its error, never dropped.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)

from bench_harness.memory import Run, measure  # noqa: E402
from bench_harness.peers import peer_result  # noqa: E402
from paramserver.apps.ctr.models import auc, logloss  # noqa: E402
from paramserver.data.batch import DataFormat  # noqa: E402
from paramserver.data.reader import read_all  # noqa: E402
from seeds_paths import DATA, HASHED, MXNET, PS, SPARK, TF  # noqa: E402
from seeds_rounds import run_lda, run_mf  # noqa: E402
from seeds_rows import Row, chosen, goals, table  # noqa: E402


def libsvm_from(src: str, dst: str, fmt: DataFormat) -> None:
    """``src`` parsed by paramserver's featurizer, written as LIBSVM (1-based sorted keys,
    value 1, label 0/1) so every peer reads the very features paramserver trains on."""
    if os.path.exists(dst):
        return
    b = read_all([src], fmt)
    tmp = dst + ".part"
    with open(tmp, "w") as f:
        for i in range(len(b)):
            k = np.unique(b.keys[b.indptr[i]:b.indptr[i + 1]]) + 1
            f.write(f"{int(b.labels[i])} " + " ".join(f"{x}:1" for x in k.tolist()) + "\n")
    os.replace(tmp, dst)


@dataclass
class LRSet:
    name: str
    ps_train: str
    ps_test: str
    ps_flags: list[str]
    peer_train: str
    peer_test: str
    features: int


def lr_sets(names: list[str], work: str) -> list[LRSet]:
    out = []
    lib = os.path.join(DATA, "libsvm")
    criteo = os.path.join(DATA, "criteo")
    for name in names:
        if name == "a9a":
            tr, te = os.path.join(lib, "a9a.libsvm.gz"), os.path.join(lib, "a9a.t.libsvm.gz")
            if not os.path.exists(tr):
                print(f"skipped a9a: {tr} is absent (see ../shared/data/SOURCES.md)")
                continue
            plain = [os.path.join(work, "a9a.libsvm"), os.path.join(work, "a9a.t.libsvm")]
            for src, dst in zip((tr, te), plain, strict=True):
                if not os.path.exists(dst):
                    with gzip.open(src, "rb") as f, open(dst, "wb") as g:
                        shutil.copyfileobj(f, g)
            out.append(LRSet("a9a", tr, te, ["--format", "libsvm"], plain[0], plain[1], 123))
        elif name == "criteo":
            tr = os.path.join(criteo, "criteo_kaggle_wideresdnn_train.tsv.gz")
            te = os.path.join(criteo, "criteo_kaggle_wideresdnn_test.tsv.gz")
            if not os.path.exists(tr):
                print(f"skipped criteo: {tr} is absent (see ../shared/data/SOURCES.md)")
                continue
            out.append(_hashed("criteo", tr, te, work))
        elif name == "heavy":
            tr, te = os.path.join(work, "heavy.train.tsv"), os.path.join(work, "heavy.test.tsv")
            for path, rows, seed in ((tr, 1_000_000, 1), (te, 100_000, 2)):
                if not os.path.exists(path):
                    subprocess.run([*PS, "synth", "--shape", "heavy", "--rows", str(rows), "--seed", str(seed),
                                    "--out", path], check=True, capture_output=True)
            out.append(_hashed("heavy", tr, te, work))
        else:
            raise SystemExit(f"--sets: unknown set {name!r} (a9a, criteo, heavy)")
    return out


def _hashed(name: str, train: str, test: str, work: str) -> LRSet:
    fmt = DataFormat("criteo", 24)
    pt, pe = os.path.join(work, f"{name}.train.libsvm"), os.path.join(work, f"{name}.test.libsvm")
    libsvm_from(train, pt, fmt)
    libsvm_from(test, pe, fmt)
    return LRSet(name, train, test, [], pt, pe, HASHED)


def ps_train(s: LRSet, model: str, work: str, timeout: float) -> tuple[Run, dict[str, Any]]:
    metrics = os.path.join(work, "ps-metrics.json")
    if os.path.exists(metrics):
        os.remove(metrics)
    extra = ["--model", model] if model != "lr" else []
    run = measure([*PS, "train", "--data", s.ps_train, "--test", s.ps_test, *s.ps_flags, *extra,
                   "--metrics-out", metrics], timeout)
    if run.code or not os.path.exists(metrics):
        return run, peer_result(run)
    with open(metrics) as f:
        m = json.load(f)
    return run, {"logloss": m["logloss"], "auc": m["auc"], "train_seconds": m["seconds"],
                 "examples": m["examples"]}


def peer_lr(cmd: list[str], s: LRSet, work: str, timeout: float) -> tuple[Run, dict[str, Any]]:
    out = os.path.join(work, "peer-pred.npz")
    if os.path.exists(out):
        os.remove(out)
    run = measure([*cmd, "--train", s.peer_train, "--test", s.peer_test, "--num-features", str(s.features),
                   "--out", out], timeout)
    result = peer_result(run)
    if "error" in result or not os.path.exists(out):
        result.setdefault("error", f"no predictions written (exit code {run.code})")
        return run, result
    z = np.load(out)
    p, y = np.asarray(z["p"], np.float64), np.asarray(z["y"], np.float64)
    if not np.all(np.isfinite(p)):
        result["diverged"] = int((~np.isfinite(p)).sum())
        p = np.nan_to_num(p, nan=0.5)
    result.update(logloss=logloss(y, p), auc=auc(y, p))
    return run, result


def lr_systems(s: LRSet, args: argparse.Namespace) -> list[tuple[str, str, Any, int | None]]:
    """(system, settings, how to run it, the row it fixes) for one set, in the order they
    run.  A "fixed" row runs only where the row it fixes failed.  A run known to be slow at
    its defaults on a hashed set gets ``--slow-timeout``."""
    slow = min(args.timeout, args.slow_timeout) if s.features == HASHED else args.timeout
    batch = args.tf_batch if s.name != "heavy" else args.tf_big_batch  # 31,250 steps of 32 take TF ~10 min
    tuned = ["--batch-size", str(batch), "--learning-rate", str(args.tf_lr)]
    tuned_text = f"tuned here: batch {batch}, Adagrad lr {args.tf_lr}"
    big = ["--driver-memory", args.spark_fixed_memory]

    def peer(cmd: list[str], timeout: float) -> Any:
        return lambda w, t: peer_lr(cmd, s, w, min(t, timeout))

    rows: list[tuple[str, str, Any, int | None]] = [
        ("paramserver LR", "defaults (one pass)", lambda w, t: ps_train(s, "lr", w, t), None),
        ("paramserver FM", "defaults (one pass), --model fm", lambda w, t: ps_train(s, "fm", w, t), None),
        ("Spark MLlib LogisticRegression", "defaults (maxIter=100, driver memory 1g)", peer([*SPARK, "lr"], slow),
         None),
        ("Spark MLlib LogisticRegression", "one pass (maxIter=1, driver memory 1g)",
         peer([*SPARK, "lr", "--max-iter", "1"], args.timeout), None),
        ("Spark MLlib LogisticRegression", f"fixed: defaults with driver memory {args.spark_fixed_memory}",
         peer([*SPARK, "lr", *big], slow), 2),
        ("Spark MLlib LogisticRegression", f"fixed: one pass with driver memory {args.spark_fixed_memory}",
         peer([*SPARK, "lr", "--max-iter", "1", *big], args.timeout), 3),
        ("TensorFlow PS strategy 1+1", "defaults (1 epoch, batch 32, Adagrad lr 0.001)",
         peer([*TF, "ps", "--workers", "1", "--ps", "1"], slow), None),
        ("TensorFlow PS strategy 1+1", tuned_text, peer([*TF, "ps", "--workers", "1", "--ps", "1", *tuned], slow),
         None),
        ("TensorFlow PS strategy 2+2", tuned_text, peer([*TF, "ps", "--workers", "2", "--ps", "2", *tuned], slow),
         None),
        ("Keras, one process", "defaults (1 epoch, batch 32, Adagrad lr 0.001)", peer([*TF, "keras"], slow), None),
        ("Keras, one process", tuned_text, peer([*TF, "keras", *tuned], slow), None),
    ]
    if os.path.exists(args.mxnet_python):
        mx = [args.mxnet_python, MXNET, "lr"]
        rows += [("MXNet KVStore dist_sync 1+1", "one pass, FTRL lr 0.5, batch 16 (the runner's defaults)",
                  peer([*mx, "--mode", "dist_sync"], slow), None),
                 ("MXNet KVStore dist_async 2+1", "one pass, FTRL lr 0.5, batch 16 (the runner's defaults)",
                  peer([*mx, "--mode", "dist_async", "--workers", "2"], slow), None)]
    return rows


def run_lr(args: argparse.Namespace, work: str) -> list[Row]:
    rows: list[Row] = []
    if not os.path.exists(args.mxnet_python):
        print(f"MXNet skipped: no interpreter at {args.mxnet_python} (make seeds makes .venv-mxnet: mxnet 1.9.1 "
              "imports only beside numpy < 1.24)")
    for s in lr_sets(args.sets, work):
        systems = lr_systems(s, args)
        mine = [Row("lr", s.name, name, settings) for name, settings, _, _ in systems]
        rows += mine
        for r in range(args.repeat):
            print(f"LR on {s.name}, round {r + 1}/{args.repeat}", flush=True)
            for row, (_, _, go, fixes) in zip(mine, systems, strict=True):
                if not chosen(args, row) or (fixes is not None and (mine[fixes].ok() or not mine[fixes].runs)):
                    continue
                if r > 0 and row.runs and not row.ok():
                    continue  # what failed once (a timeout, an out-of-memory) is not run again
                row.add(*go(work, args.timeout))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", nargs="+", default=["lr", "mf", "lda"], choices=["lr", "mf", "lda"])
    ap.add_argument("--sets", nargs="+", default=["a9a", "criteo", "heavy"], help="LR data sets")
    ap.add_argument("--mf-sets", nargs="+", default=["ml100k", "powerlaw"])
    ap.add_argument("--mf-ratings", type=int, default=4_000_000, help="ratings of the power-law MF set")
    ap.add_argument("--topics", type=int, default=50, help="LDA topics, the same for every system")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved rounds (medians; the worst metric)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a run may take before it is killed")
    ap.add_argument("--slow-timeout", type=float, default=180,
                    help="seconds for the rows known to be slow at their defaults on the hashed sets (Spark's "
                         "maxIter=100, TensorFlow's batch of 32 over 2^24 weights): shown as not finished")
    ap.add_argument("--tf-batch", type=int, default=32, help="TensorFlow's tuned rows: batch size")
    ap.add_argument("--tf-big-batch", type=int, default=256, help="... on the 10^6-row set")
    ap.add_argument("--tf-lr", type=float, default=0.1, help="TensorFlow's tuned rows: Adagrad's learning rate")
    ap.add_argument("--spark-fixed-memory", default="8g",
                    help="spark.driver.memory of Spark's fixed rows, run where its default (1g) fails")
    ap.add_argument("--mxnet-python", default=os.path.join(HERE, "..", ".venv-mxnet", "bin", "python"),
                    help="an interpreter with mxnet 1.9.1 (and numpy < 1.24)")
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "paramserver-seeds"),
                    help="where converted data and outputs are kept between runs")
    ap.add_argument("--only", nargs="+", default=[], metavar="TEXT",
                    help="run only the systems whose name contains one of these (e.g. paramserver Spark)")
    ap.add_argument("--json", metavar="OUT", help="write every run's figures here")
    args = ap.parse_args()
    missing = [m for m in ("pyspark", "tensorflow", "psutil") if _absent(m)]
    if missing:
        raise SystemExit(f"bench/seeds.py needs {', '.join(missing)}: run `make seeds` (a venv of its own with "
                         "pip install -e '.[seeds]'), or install the seeds extra in this interpreter")
    os.makedirs(args.work, exist_ok=True)
    warm_up(args.work)
    started = time.strftime("%Y-%m-%d %H:%M")
    rows: list[Row] = []
    for section, fn in (("lr", run_lr), ("mf", run_mf), ("lda", run_lda)):
        if section in args.sections:
            rows += fn(args, args.work)
    print(f"\nbench/seeds.py, started {started}, {os.cpu_count()} cores\n")
    table(rows)
    print()
    met = goals(rows)
    for what, measured, ok in met:
        print(f"{'PASS' if ok else 'FAIL'}  {what}: {measured}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"started": started, "rows": [r.__dict__ for r in rows],
                       "goals": [{"goal": a, "measured": b, "met": c} for a, b, c in met]}, f, indent=1)
    return 0


def warm_up(work: str) -> None:
    """One small job of each command, untimed: numba compiles paramserver's kernels into its
    cache once after an install (``make demo`` does it for the quick start), never again."""
    print("warming up: one small job of train (lr, fm), mf and lda, untimed, so that numba's cache holds the "
          "kernels as after any first run", flush=True)
    small = os.path.join(work, "warm.tsv")
    subprocess.run([*PS, "synth", "--rows", "2000", "--out", small], check=True, capture_output=True)
    sample = os.path.join(DATA, "criteo", "criteo_kaggle_wideresdnn_test.tsv.gz")  # a compressed file reads apart
    a9a = os.path.join(DATA, "libsvm", "a9a.t.libsvm.gz")
    for fmt, data in (("criteo", small), ("criteo", sample), ("libsvm", a9a)):
        for model in ("lr", "fm"):
            if os.path.exists(data):
                subprocess.run([*PS, "train", "--data", data, "--test", data, "--format", fmt, "--model", model,
                                "--quiet"], check=True, capture_output=True)
    ua = os.path.join(DATA, "movielens", "ml-100k", "ua.test.gz")
    if os.path.exists(ua):
        subprocess.run([*PS, "mf", "--data", ua, "--test", ua, "--epochs", "1", "--json"], check=True,
                       capture_output=True)
    docs = os.path.join(DATA, "lda", "20newsgroups_etm", "docword.valid.txt.gz")
    if os.path.exists(docs):
        subprocess.run([*PS, "lda", "--data", docs, "--iterations", "2", "--json"], check=True, capture_output=True)


def _absent(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


if __name__ == "__main__":
    sys.exit(main())
