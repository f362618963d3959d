"""The round jobs of ``bench/seeds.py``: matrix factorisation (paramserver mf against Spark's
ALS, RMSE) and LDA (paramserver lda against Spark's online and EM LDA, held-out perplexity),
every system on a data set in interleaved rounds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
from typing import Any

import numpy as np

from bench_harness.memory import Run, measure
from bench_harness.peers import peer_result
from lda import fold_in_perplexity
from mf import synthetic as mf_synthetic
from paramserver.apps.rounds.corpus import read_corpus
from seeds_paths import DATA, PS, SPARK
from seeds_rows import Row, chosen


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
