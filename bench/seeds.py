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
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)
DATA = os.path.join(HERE, "..", "..", "shared", "data")

from lda import fold_in_perplexity  # noqa: E402
from mf import synthetic as mf_synthetic  # noqa: E402
from paramserver.apps.ctr.models import auc, logloss  # noqa: E402
from paramserver.apps.rounds.corpus import read_corpus  # noqa: E402
from paramserver.data.batch import DataFormat  # noqa: E402
from paramserver.data.reader import read_all  # noqa: E402

PY = sys.executable
PS = [PY, "-m", "paramserver"]
SPARK = [PY, os.path.join(HERE, "seeds_spark.py")]
TF = [PY, os.path.join(HERE, "seeds_tf.py")]
MXNET = os.path.join(HERE, "seeds_mxnet.py")
HASHED = 1 << 24


# ---------------------------------------------------------------- running a command, measured

@dataclass
class Run:
    """One command's outcome: wall seconds, peak RSS and PSS of its process tree (bytes)."""

    wall: float = 0.0
    rss: int = 0
    pss: int = 0
    code: int = 0
    out: str = ""
    err: str = ""
    timed_out: bool = False


def _tree(proc: Any) -> list[Any]:
    try:
        return [proc, *proc.children(recursive=True)]
    except Exception:  # noqa: BLE001  (the process ended between two samples)
        return []


def _memory(procs: list[Any], pss: bool) -> tuple[int, int]:
    rss = sh = 0
    for p in procs:
        try:
            if pss:
                full = p.memory_full_info()
                rss += full.rss
                sh += full.pss
            else:
                rss += p.memory_info().rss
        except Exception:  # noqa: BLE001  (gone, or not ours to read)
            continue
    return rss, sh


def measure(cmd: list[str], timeout: float, env: dict[str, str] | None = None, cwd: str | None = None) -> Run:
    """Run ``cmd`` in a session of its own; sample its tree's memory every 50 ms (PSS every
    4th sample: reading smaps costs more); kill the whole session past ``timeout``."""
    import psutil

    run = Run()
    t0 = time.perf_counter()
    with open(os.devnull, "rb") as null:
        proc = subprocess.Popen(cmd, stdin=null, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=cwd, start_new_session=True)
    ps = psutil.Process(proc.pid)
    chunks: dict[str, list[str]] = {"out": [], "err": []}
    readers = [threading.Thread(target=lambda s=s, k=k: chunks[k].extend(iter(s.readline, "")), daemon=True)
               for s, k in ((proc.stdout, "out"), (proc.stderr, "err"))]
    for r in readers:
        r.start()
    tick = 0
    while proc.poll() is None:
        rss, pss = _memory(_tree(ps), pss=tick % 4 == 0)
        run.rss, run.pss = max(run.rss, rss), max(run.pss, pss)
        tick += 1
        if time.perf_counter() - t0 > timeout:
            run.timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.05)
    run.wall = time.perf_counter() - t0
    for r in readers:
        r.join(5)
    run.code, run.out, run.err = proc.returncode, "".join(chunks["out"]), "".join(chunks["err"])
    _reap(proc.pid)
    return run


def _reap(pgid: int) -> None:
    """Whatever the command left behind in its session (a JVM, a TF server) is killed."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def peer_result(run: Run) -> dict[str, Any]:
    """A peer runner's last ``RESULT {...}`` line; its error, or the timeout, otherwise."""
    for line in reversed(run.out.splitlines()):
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    if run.timed_out:
        return {"error": f"did not finish in {run.wall:.0f} s (--timeout)"}
    tail = [x for x in run.err.strip().splitlines() if x.strip()][-1:] or [f"exit code {run.code}"]
    return {"error": tail[0][:200]}


# ---------------------------------------------------------------- rows of the tables

@dataclass
class Row:
    section: str
    dataset: str
    system: str
    settings: str
    runs: list[dict[str, Any]] = field(default_factory=list)

    def add(self, run: Run, result: dict[str, Any]) -> None:
        result = dict(result)
        result.update(wall=run.wall, rss=run.rss, pss=run.pss)
        self.runs.append(result)
        brief = result.get("error") or ", ".join(f"{k} {v:.4f}" for k, v in result.items()
                                                  if k in ("logloss", "auc", "rmse", "perplexity"))
        print(f"  {self.dataset:8} {self.system:34} {run.wall:8.1f} s  {run.rss / 2**30:5.2f} GB  {brief}",
              flush=True)

    def ok(self) -> list[dict[str, Any]]:
        return [r for r in self.runs if "error" not in r]

    def median(self, key: str) -> float:
        vals = [float(r[key]) for r in self.ok() if r.get(key) is not None]
        return float(np.median(vals)) if vals else math.nan

    def worst(self, key: str, higher_is_worse: bool = True) -> float:
        vals = [float(r[key]) for r in self.ok() if r.get(key) is not None]
        if not vals:
            return math.nan
        return max(vals) if higher_is_worse else min(vals)

    def error(self) -> str:
        errs = [r["error"] for r in self.runs if "error" in r]
        if not errs:
            return ""
        for cause in ("java.lang.OutOfMemoryError: Java heap space", "SparkContext was shut down"):
            if cause in errs[0]:
                return cause  # the JVM's own reason, not py4j's wrapping of it
        return str(errs[0])


# ---------------------------------------------------------------- data

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


# ---------------------------------------------------------------- the jobs

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


def chosen(args: argparse.Namespace, row: Row) -> bool:
    return not args.only or any(o.lower() in row.system.lower() for o in args.only)


# ---------------------------------------------------------------- matrix factorisation

def _ratings(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    opener: Any = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        a = np.loadtxt(f, dtype=np.float64, usecols=(0, 1, 2), ndmin=2)
    return a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2]


def mf_sets(names: list[str], work: str, ratings: int) -> list[tuple[str, str, str]]:
    out = []
    for name in names:
        if name == "ml100k":
            base = os.path.join(DATA, "movielens", "ml-100k")
            if not os.path.exists(os.path.join(base, "ua.base.gz")):
                print(f"skipped ml100k: {base} is absent (see ../shared/data/SOURCES.md)")
                continue
            out.append(("ml-100k ua", os.path.join(base, "ua.base.gz"), os.path.join(base, "ua.test.gz")))
        elif name == "powerlaw":
            tr, te = os.path.join(work, f"mf-{ratings}.train.tsv"), os.path.join(work, f"mf-{ratings}.test.tsv")
            if not os.path.exists(tr):
                mf_synthetic(tr, te, ratings)
            out.append((f"power law {ratings / 1e6:g}M", tr, te))
        else:
            raise SystemExit(f"--mf-sets: unknown set {name!r} (ml100k, powerlaw)")
    return out


def _rmse(pred: np.ndarray, train: str, test: str) -> dict[str, Any]:
    _, _, y = _ratings(test)
    if pred.shape != y.shape:
        return {"error": f"{pred.size} predictions for {y.size} test ratings"}
    missing = ~np.isfinite(pred)
    if missing.any():
        pred = np.where(missing, _ratings(train)[2].mean(), pred)
    return {"rmse": float(np.sqrt(np.mean((pred - y) ** 2))), "unpredicted": int(missing.sum())}


def ps_mf(train: str, test: str, work: str, timeout: float) -> tuple[Run, dict[str, Any]]:
    out = os.path.join(work, "mf-pred.txt")
    run = measure([*PS, "mf", "--data", train, "--test", test, "--json", "--predictions-out", out], timeout)
    if run.code:
        return run, peer_result(run)
    rep = json.loads(run.out.strip().splitlines()[-1])
    res = _rmse(np.loadtxt(out, ndmin=1), train, test)
    res.update(train_seconds=rep["train_seconds"], examples=rep["rating_updates"])
    return run, res


def spark_mf(train: str, test: str, work: str, timeout: float, extra: list[str]) -> tuple[Run, dict[str, Any]]:
    out = os.path.join(work, "als-pred.npz")
    if os.path.exists(out):
        os.remove(out)
    run = measure([*SPARK, "als", "--train", train, "--test", test, "--out", out, *extra], timeout)
    res = peer_result(run)
    if "error" not in res:
        res.update(_rmse(np.asarray(np.load(out)["pred"], np.float64), train, test))
    return run, res


def run_mf(args: argparse.Namespace, work: str) -> list[Row]:
    rows: list[Row] = []
    for name, train, test in mf_sets(args.mf_sets, work, args.mf_ratings):
        systems: list[tuple[str, str, Any]] = [
            ("paramserver mf", "defaults (rank 64, 40 epochs)", lambda w, t, a=train, b=test: ps_mf(a, b, w, t)),
            ("Spark MLlib ALS", "defaults (rank 10, maxIter 10, regParam 0.1)",
             lambda w, t, a=train, b=test: spark_mf(a, b, w, t, [])),
        ]
        rows += run_rounds(args, work, "mf", name, systems)
    return rows


def run_rounds(args: argparse.Namespace, work: str, section: str, dataset: str,
               systems: list[tuple[str, str, Any]]) -> list[Row]:
    """Every system on one data set, ``--repeat`` interleaved rounds."""
    rows = [Row(section, dataset, n, s) for n, s, _ in systems]
    for r in range(args.repeat):
        print(f"{section.upper()} on {dataset}, round {r + 1}/{args.repeat}", flush=True)
        for row, (_, _, go) in zip(rows, systems, strict=True):
            if chosen(args, row):
                row.add(*go(work, args.timeout))
    return rows


# ---------------------------------------------------------------- LDA

def ps_lda(train: str, test: Any, work: str, timeout: float, topics: int,
           extra: list[str]) -> tuple[Run, dict[str, Any]]:
    out = os.path.join(work, "lda-model")
    shutil.rmtree(out, ignore_errors=True)
    run = measure([*PS, "lda", "--data", train, "--topics", str(topics), "--json", "--save", out, *extra], timeout)
    if run.code:
        return run, peer_result(run)
    rep = json.loads(run.out.strip().splitlines()[-1])
    m = np.load(os.path.join(out, "topic_word.npy"))
    return run, {"perplexity": fold_in_perplexity(smoothed(m), test, 0.1), "train_seconds": rep["seconds"],
                 "examples": rep["token_iterations"]}


def spark_lda(train: str, test_path: str, test: Any, work: str, timeout: float, topics: int,
              optimizer: str) -> tuple[Run, dict[str, Any]]:
    out = os.path.join(work, "spark-lda.npy")
    if os.path.exists(out):
        os.remove(out)
    run = measure([*SPARK, "lda", "--train", train, "--test", test_path, "--k", str(topics), "--optimizer", optimizer,
                   "--out", out], timeout)
    res = peer_result(run)
    if "error" not in res:
        res["perplexity"] = fold_in_perplexity(smoothed(np.load(out)), test, 0.1)
    return run, res


def smoothed(m: np.ndarray, beta: float = 0.01) -> np.ndarray:
    """Any model's topic-word matrix (counts, or online LDA's λ) as φ, smoothed the same way."""
    m = np.maximum(np.asarray(m, np.float64), 0)
    return (m + beta) / (m.sum(1, keepdims=True) + m.shape[1] * beta)


def run_lda(args: argparse.Namespace, work: str) -> list[Row]:
    base = os.path.join(DATA, "lda", "20newsgroups_etm")
    train, test_path = os.path.join(base, "docword.train.txt.gz"), os.path.join(base, "docword.test.txt.gz")
    if not os.path.exists(train):
        print(f"skipped LDA: {train} is absent (see ../shared/data/SOURCES.md)")
        return []
    test, k = read_corpus(test_path), args.topics
    systems: list[tuple[str, str, Any]] = [
        ("paramserver lda", f"defaults (K={k} as for all, 200 sweeps)",
         lambda w, t: ps_lda(train, test, w, t, k, [])),
        ("paramserver lda", "20 sweeps: Spark's maxIter (--iterations 20)",
         lambda w, t: ps_lda(train, test, w, t, k, ["--iterations", "20"])),
        ("Spark MLlib LDA online", f"defaults (maxIter 20, miniBatchFraction 0.05), k={k}",
         lambda w, t: spark_lda(train, test_path, test, w, t, k, "online")),
        ("Spark MLlib LDA EM", f"defaults (maxIter 20), k={k}, optimizer em",
         lambda w, t: spark_lda(train, test_path, test, w, t, k, "em")),
    ]
    return run_rounds(args, work, "lda", "20 Newsgroups", systems)


# ---------------------------------------------------------------- report

def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _metric(r: Row) -> str:
    if r.section == "lr":
        return f"log loss {r.worst('logloss'):.4f}, AUC {r.worst('auc', False):.4f}"
    if r.section == "mf":
        missing = r.median("unpredicted")
        return f"RMSE {r.worst('rmse'):.4f}" + (f" ({int(missing)} unpredicted)" if missing else "")
    return f"perplexity {r.worst('perplexity'):.1f}"


def table(rows: list[Row]) -> None:
    head = ("| data | system | settings | metric | command s | train s | examples/s | peak RSS GB | peak PSS GB |\n"
            "|---|---|---|---|---|---|---|---|---|")
    print(head)
    for r in rows:
        if not r.runs:
            continue
        if not r.ok():
            print(f"| {r.dataset} | {r.system} | {r.settings} | failed: {r.error()} | "
                  f"{_fmt(r.runs[0]['wall'] if r.runs else None, '.1f')} | - | - | - | - |")
            continue
        metric = _metric(r)
        train_s = r.median("train_seconds")
        speed = r.median("examples") / train_s if train_s else math.nan
        print(f"| {r.dataset} | {r.system} | {r.settings} | {metric} | {r.median('wall'):.1f} | {_fmt(train_s, '.1f')} "
              f"| {_fmt(speed, ',.0f')} | {r.median('rss') / 2**30:.2f} | {r.median('pss') / 2**30:.2f} |")


def _best(rows: list[Row], prefix: str, key: str, low: bool = True) -> tuple[float, Row | None]:
    found = [(r.worst(key, low) if key != "wall" and key != "rss" else r.median(key), r)
             for r in rows if r.system.startswith(prefix) and r.ok()]
    if not found:
        return math.nan, None
    return (min if low else max)(found, key=lambda x: x[0])


def goals(rows: list[Row]) -> list[tuple[str, str, bool]]:
    """The issue's goals, each (what, measured, met)."""
    out: list[tuple[str, str, bool]] = []
    for ds in dict.fromkeys(r.dataset for r in rows if r.section == "lr"):
        here = [r for r in rows if r.dataset == ds]
        me = next((r for r in here if r.system == "paramserver LR" and r.ok()), None)
        if me is None:
            out.append((f"LR {ds}", "paramserver failed", False))
            continue
        for peer, factor in (("TensorFlow PS", 5), ("Spark", 20)):
            wall, row = _best(here, peer, "wall")
            loss, _ = _best(here, peer, "logloss")
            if row is None:
                continue
            ratio = wall / me.median("wall")
            out.append((f"LR {ds}: ≥ {factor}× faster than {peer} (whole command)",
                        f"{ratio:.1f}× ({me.median('wall'):.1f} s against {wall:.1f} s)", ratio >= factor))
            out.append((f"LR {ds}: log loss ≤ {peer}'s best", f"{me.worst('logloss'):.4f} against {loss:.4f}",
                        me.worst("logloss") <= loss))
        if ds == "heavy":
            for peer in ("Spark", "TensorFlow PS", "Keras", "MXNet"):
                rss, row = _best(here, peer, "rss")
                if row is not None:
                    out.append((f"LR heavy: peak RSS ≤ 0.5× {peer}'s", f"{me.median('rss') / rss:.2f}× "
                                f"({me.median('rss') / 2**30:.2f} GB against {rss / 2**30:.2f} GB)",
                                me.median("rss") <= 0.5 * rss))
    out += _round_goals(rows, "mf", "paramserver mf", "rmse", 1.0, 3)
    out += _round_goals(rows, "lda", "paramserver lda", "perplexity", 1.02, 5)
    return out


def _round_goals(rows: list[Row], section: str, mine: str, key: str, slack: float,
                 factor: int) -> list[tuple[str, str, bool]]:
    """Each of paramserver's rows against Spark's best metric and its fastest run."""
    out = []
    for ds in dict.fromkeys(r.dataset for r in rows if r.section == section):
        here = [r for r in rows if r.dataset == ds]
        best, row = _best(here, "Spark", key)
        wall = _best(here, "Spark", "wall")[0]
        if row is None:
            continue  # no Spark row ran (--only), nothing to compare with
        for me in (r for r in here if r.system == mine):
            what = f"{section} {ds}, {me.settings}"
            if not me.ok():
                out.append((what, "a run failed", False))
                continue
            out.append((f"{what}: {key} ≤ {slack:g}× Spark's best", f"{me.worst(key):.4f} against {best:.4f}",
                        me.worst(key) <= slack * best))
            out.append((f"{what}: ≥ {factor}× faster than Spark's fastest", f"{wall / me.median('wall'):.1f}× "
                        f"({me.median('wall'):.1f} s against {wall:.1f} s)", wall >= factor * me.median("wall")))
    return out


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
