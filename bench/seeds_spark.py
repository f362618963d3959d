"""Apache Spark MLlib runner for ``bench/seeds.py``: logistic regression, ALS and LDA.

Each subcommand starts a ``local[2]`` SparkSession the way Spark's documentation does
(``SparkSession.builder.master(...).getOrCreate()``), with Spark's defaults unless a flag
says otherwise (``--driver-memory`` sets ``spark.driver.memory``; unset means Spark's
default), fits one ``pyspark.ml`` estimator and writes the test predictions (or the
topic-word matrix) for the driver to score the same way for every system::

    python bench/seeds_spark.py lr  --train A --test B --num-features N --out P.npz [--max-iter K|default]
    python bench/seeds_spark.py als --train A --test B --out P.npz [--rank R] [--max-iter K] [--reg-param X]
    python bench/seeds_spark.py lda --train A --test B --k 50 --optimizer online|em --out M.npy [--max-iter K|default]

Outputs: ``lr`` writes ``p`` (probability of class 1) and ``y`` (0/1) per test row in file
order; ``als`` writes ``pred`` (NaN where Spark gives NaN) and ``y`` per test rating in file
order; ``lda`` writes the K x V topic-word matrix (float64).

The last line printed is ``RESULT {json}`` with ``train_seconds`` (the ``fit`` call alone,
input already loaded and cached), ``examples`` (training rows x passes made), ``rows``,
``settings`` and ``iterations``; on any exception it is ``RESULT {"error": "..."}`` and the
exit code is 1.  The JVM is always stopped.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

Result = dict[str, Any]


def session(driver_memory: str | None) -> Any:
    """A local[2] SparkSession with Spark's defaults (driver memory only if asked)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("seeds-spark")
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def memory_text(driver_memory: str | None) -> str:
    return f"driver memory {driver_memory}" if driver_memory else "driver memory default"


def max_iter_arg(text: str) -> int | None:
    """``default`` (or empty) means the estimator's own default; otherwise an integer."""
    return None if text in ("", "default") else int(text)


def timed_fit(estimator: Any, frame: Any) -> tuple[Any, float]:
    """Fit on an already materialised frame; seconds of the ``fit`` call alone."""
    start = time.perf_counter()
    model = estimator.fit(frame)
    return model, time.perf_counter() - start


def with_order(frame: Any) -> Any:
    """Tag rows with an id increasing in file order (partition index, then row)."""
    from pyspark.sql import functions as F

    return frame.withColumn("_row", F.monotonically_increasing_id())


# ---------------------------------------------------------------- logistic regression

def read_libsvm(spark: Any, path: str, num_features: int) -> Any:
    """libsvm rows with labels mapped to 0/1 (label > 0 -> 1.0, so -1/+1 and 0/1 both work)."""
    from pyspark.sql import functions as F

    frame = spark.read.format("libsvm").option("numFeatures", num_features).load(path)
    return frame.withColumn("label", (F.col("label") > 0).cast("double"))


def lr_predictions(model: Any, test: Any) -> tuple[np.ndarray, np.ndarray]:
    """P(class 1) and labels for every test row, in file order."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    scored = model.transform(with_order(test)).select(
        "_row", "label", vector_to_array(F.col("probability")).getItem(1).alias("p"))
    rows = scored.orderBy("_row").collect()
    p = np.fromiter((r["p"] for r in rows), np.float64, len(rows))
    y = np.fromiter((r["label"] for r in rows), np.float64, len(rows))
    return p, y


def run_lr(spark: Any, args: argparse.Namespace) -> Result:
    from pyspark.ml.classification import LogisticRegression

    train = read_libsvm(spark, args.train, args.num_features).cache()
    rows = train.count()
    test = read_libsvm(spark, args.test, args.num_features)
    max_iter = max_iter_arg(args.max_iter)
    lr = LogisticRegression() if max_iter is None else LogisticRegression(maxIter=max_iter)
    model, seconds = timed_fit(lr, train)
    try:
        iterations = int(model.summary.totalIterations)
    except Exception:  # summary unavailable: fall back to the configured cap
        iterations = int(lr.getMaxIter())
    p, y = lr_predictions(model, test)
    expected = test.count()
    if len(p) != expected:
        raise RuntimeError(f"collected {len(p)} predictions for {expected} test rows")
    np.savez(args.out, p=p, y=y)
    how = "defaults (maxIter=100, regParam=0)" if max_iter is None else f"maxIter={max_iter}, regParam=0"
    return {"train_seconds": seconds, "examples": rows * iterations, "rows": rows, "iterations": iterations,
            "settings": f"LogisticRegression {how}, local[2], {memory_text(args.driver_memory)}"}


# ---------------------------------------------------------------- ALS

def read_ratings(spark: Any, path: str) -> Any:
    """Tab-separated user, item, rating[, timestamp] (gzip or plain), in file order."""
    from pyspark.sql import functions as F

    frame = spark.read.csv(path, sep="\t", schema="user INT, item INT, rating FLOAT, ts LONG")
    return frame.select("user", "item", F.col("rating").cast("float").alias("rating"))


def run_als(spark: Any, args: argparse.Namespace) -> Result:
    from pyspark.ml.recommendation import ALS

    train = read_ratings(spark, args.train).cache()
    rows = train.count()
    test = with_order(read_ratings(spark, args.test))
    params: dict[str, Any] = {"userCol": "user", "itemCol": "item", "ratingCol": "rating"}
    for name, value in (("rank", args.rank), ("maxIter", args.max_iter), ("regParam", args.reg_param)):
        if value is not None:
            params[name] = value
    als = ALS(**params)
    model, seconds = timed_fit(als, train)
    out = model.transform(test).orderBy("_row").select("prediction", "rating").collect()
    pred = np.fromiter((np.nan if r[0] is None else r[0] for r in out), np.float64, len(out))
    y = np.fromiter((r[1] for r in out), np.float64, len(out))
    expected = test.count()
    if len(pred) != expected:
        raise RuntimeError(f"collected {len(pred)} predictions for {expected} test ratings")
    np.savez(args.out, pred=pred, y=y)
    iters = int(als.getMaxIter())
    how = (f"rank={als.getRank()}, maxIter={iters}, regParam={als.getRegParam()}, "
           f"coldStartStrategy={als.getColdStartStrategy()}")
    return {"train_seconds": seconds, "examples": rows * iters, "rows": rows, "iterations": iters,
            "settings": f"ALS explicit {how}, local[2], {memory_text(args.driver_memory)}"}


# ---------------------------------------------------------------- LDA

def read_docword(path: str) -> tuple[int, np.ndarray]:
    """UCI docword file: (V, array of (doc, word, count) rows, 0-based ids)."""
    opener: Callable[..., Any] = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        f.readline()
        vocab = int(f.readline())
        f.readline()
        triples = np.loadtxt(f, dtype=np.int64, ndmin=2)
    triples[:, :2] -= 1
    return vocab, triples


def doc_vectors(vocab: int, triples: np.ndarray) -> list[tuple[int, Any]]:
    """One SparseVector of word counts per document (duplicates summed, indices sorted)."""
    from pyspark.ml.linalg import SparseVector

    keys, inverse = np.unique(triples[:, 0] * vocab + triples[:, 1], return_inverse=True)
    counts = np.bincount(inverse.ravel(), weights=triples[:, 2].astype(np.float64))
    docs, words = keys // vocab, keys % vocab
    starts = np.flatnonzero(np.r_[True, docs[1:] != docs[:-1]])
    ends = np.r_[starts[1:], len(keys)]
    return [(int(docs[s]), SparseVector(vocab, words[s:e], counts[s:e])) for s, e in zip(starts, ends)]


def run_lda(spark: Any, args: argparse.Namespace) -> Result:
    from pyspark.ml.clustering import LDA

    vocab, triples = read_docword(args.train)
    test_vocab = read_test_vocab(args.test)
    if test_vocab != vocab:
        raise ValueError(f"train V={vocab} but test V={test_vocab}")
    docs = spark.createDataFrame(doc_vectors(vocab, triples), ["id", "features"]).cache()
    rows = docs.count()
    max_iter = max_iter_arg(args.max_iter)
    params: dict[str, Any] = {"k": args.k, "optimizer": args.optimizer}
    if max_iter is not None:
        params["maxIter"] = max_iter
    lda = LDA(**params)
    model, seconds = timed_fit(lda, docs)
    topics = model.topicsMatrix().toArray().T.astype(np.float64)
    if topics.shape != (args.k, vocab):
        raise RuntimeError(f"topic matrix has shape {topics.shape}, expected {(args.k, vocab)}")
    np.save(args.out, np.clip(topics, 0.0, None))
    iters = int(lda.getMaxIter())
    return {"train_seconds": seconds, "examples": rows * iters, "rows": rows, "iterations": iters,
            "settings": f"LDA k={args.k}, optimizer={args.optimizer}, maxIter={iters} (other params default), "
                        f"local[2], {memory_text(args.driver_memory)}"}


def read_test_vocab(path: str) -> int:
    """V from a docword file's header (second line)."""
    opener: Callable[..., Any] = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        f.readline()
        return int(f.readline())


# ---------------------------------------------------------------- command line

def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("lr", "als", "lda"):
        p = sub.add_parser(name)
        p.add_argument("--train", required=True)
        p.add_argument("--test", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--driver-memory", default=None, help="spark.driver.memory (default: Spark's)")
        if name == "lr":
            p.add_argument("--num-features", type=int, required=True)
            p.add_argument("--max-iter", default="default", help="integer, or 'default' (Spark's, 100)")
        elif name == "als":
            p.add_argument("--rank", type=int, default=None)
            p.add_argument("--max-iter", type=int, default=None)
            p.add_argument("--reg-param", type=float, default=None)
        else:
            p.add_argument("--k", type=int, required=True)
            p.add_argument("--max-iter", default="default", help="integer, or 'default' (Spark's, 20)")
            p.add_argument("--optimizer", choices=["online", "em"], default="online")
    return ap


def error_text(exc: BaseException) -> str:
    """``Type: first line``; for a JVM error, the Java exception's line (and any OutOfMemoryError)."""
    text = str(exc).strip()
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            text = str(java.toString()).strip()
        except Exception:  # JVM already gone: keep Py4J's own text
            pass
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0][:300] if lines else ""
    oom = next((line for line in lines if "OutOfMemoryError" in line), "")
    if oom and oom not in first:
        first = f"{first} [{oom[oom.find('java.lang.OutOfMemoryError'):][:120]}]"
    return f"{type(exc).__name__}: {first}"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    runners = {"lr": run_lr, "als": run_als, "lda": run_lda}
    spark = None
    try:
        spark = session(args.driver_memory)
        result = runners[args.cmd](spark, args)
        code = 0
    except Exception as exc:  # the driver shows failures; it never drops them
        result, code = {"error": error_text(exc)}, 1
    finally:
        if spark is not None:
            try:
                spark.stop()
            except Exception:
                pass
    print("RESULT " + json.dumps(result), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
