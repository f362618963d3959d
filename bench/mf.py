"""`paramserver mf` against Surprise's `SVD` (its defaults), and with `--peers spark` against
Spark MLlib's ALS (its defaults, `local[2]`), one run each (issues 15, 49):

- MovieLens 100K's own `ua` split (from ../shared/data/movielens/ml-100k);
- a synthetic set of `--synthetic-ratings` ratings (default 4 M): users' activity and
  items' popularity drawn from power laws, ratings from a rank-10 model with biases and
  noise, rounded to 1..5; 10 % held out at random.

`paramserver mf` is timed as a whole command (read, train, predict) with default flags
apart from `--workers 2`; Surprise from its `fit` call alone (the data already loaded); Spark
both ways, its whole command (`bench/seeds_spark.py als`: the JVM, reading, fitting,
predicting) and its `fit` call.  Test RMSE for all is computed here from the predictions (a
rating Spark cannot predict, of a user or item it never saw, counts as the training mean).

    .venv/bin/python bench/mf.py [--synthetic-ratings 4000000] [--skip-synthetic] [--skip-ml100k]
        [--peers surprise spark] [--spark-python .venv-seeds/bin/python] [--driver-memory 8g]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ML100K = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "movielens", "ml-100k")


def synthetic(path_train: str, path_test: str, ratings: int, seed: int = 0) -> None:
    """Power-law users and items, a rank-10 truth plus biases and noise, rounded to 1..5."""
    rng = np.random.default_rng(seed)
    n_users, n_items, k = max(ratings // 40, 100), max(ratings // 200, 50), 10
    pu = 1.0 / np.arange(1, n_users + 1) ** 0.7
    pi = 1.0 / np.arange(1, n_items + 1) ** 0.9
    draw = int(ratings * 1.2)  # some pairs repeat; one rating a pair is kept, then `ratings` of them
    u = rng.choice(n_users, draw, p=pu / pu.sum())
    i = rng.choice(n_items, draw, p=pi / pi.sum())
    pair = np.unique(u.astype(np.int64) * n_items + i)
    rng.shuffle(pair)
    pair = pair[:ratings]
    u, i = pair // n_items, pair % n_items
    P = rng.normal(0, 1 / np.sqrt(k), (n_users, k)) * 1.0
    Q = rng.normal(0, 1 / np.sqrt(k), (n_items, k)) * 1.0
    bu, bi = rng.normal(0, 0.3, n_users), rng.normal(0, 0.4, n_items)
    r = 3.5 + bu[u] + bi[i] + np.einsum("nk,nk->n", P[u], Q[i]) + rng.normal(0, 0.6, u.size)
    r = np.clip(np.rint(r), 1, 5).astype(np.int64)
    cut = u.size // 10
    for path, sl in ((path_test, slice(0, cut)), (path_train, slice(cut, None))):
        lines = np.char.add(np.char.add(np.char.add(np.char.add(u[sl].astype(str), "\t"), i[sl].astype(str)), "\t"),
                            r[sl].astype(str))
        with open(path, "w") as f:
            f.write("\n".join(lines.tolist()) + "\n")


def load(path: str) -> tuple[list[tuple[str, str, float]], np.ndarray]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = [line.split("\t")[:3] for line in f.read().splitlines() if line.strip()]
    return [(a, b, float(c)) for a, b, c in rows], np.array([float(c) for _, _, c in rows])


def surprise_svd(train: str, test: str) -> dict[str, float]:
    import pandas
    from surprise import SVD, Dataset, Reader

    tr, _ = load(train)
    te, truth = load(test)
    data = Dataset.load_from_df(pandas.DataFrame(tr, columns=["u", "i", "r"]), Reader(rating_scale=(1, 5)))
    trainset = data.build_full_trainset()
    algo = SVD(random_state=0)
    t = time.perf_counter()
    algo.fit(trainset)
    fit = time.perf_counter() - t
    pred = np.array([algo.predict(a, b).est for a, b, _ in te])
    return {"rmse": float(np.sqrt(np.mean((pred - truth) ** 2))), "seconds": fit}


def spark_als(train: str, test: str, tmp: str, python: str, driver_memory: str | None) -> dict[str, float]:
    """Spark ALS at its defaults (``bench/seeds_spark.py als``): the whole command's seconds, its
    ``fit`` call's, and the test RMSE."""
    out = os.path.join(tmp, "als.npz")
    memory = [] if driver_memory is None else ["--driver-memory", driver_memory]
    t = time.perf_counter()
    run = subprocess.run([python, os.path.join(os.path.dirname(__file__), "seeds_spark.py"), "als", "--train", train,
                          "--test", test, "--out", out, *memory], capture_output=True, text=True, timeout=7200)
    seconds = time.perf_counter() - t
    result = json.loads(run.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
    if run.returncode or "error" in result:
        raise SystemExit(f"Spark ALS failed: {result.get('error', run.stderr[-2000:])}")
    got = np.load(out)
    import pandas

    mean = float(pandas.read_csv(train, sep="\t", header=None, usecols=[2]).iloc[:, 0].mean())
    pred = np.where(np.isnan(got["pred"]), mean, got["pred"])
    return {"rmse": float(np.sqrt(np.mean((pred - got["y"]) ** 2))), "seconds": seconds,
            "train_seconds": result["train_seconds"], "unpredicted": int(np.isnan(got["pred"]).sum())}


def ours(train: str, test: str, tmp: str, extra: list[str]) -> dict[str, float]:
    out = os.path.join(tmp, "pred.txt")
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "paramserver", "mf", "--json", "--data", train, "--test", test,
                          "--workers", "2", "--predictions-out", out, *extra], capture_output=True, text=True,
                         timeout=3600)
    seconds = time.perf_counter() - t
    if run.returncode:
        raise SystemExit(f"paramserver mf failed:\n{run.stderr}")
    report = json.loads(run.stdout.strip().splitlines()[-1])
    _, truth = load(test)
    pred = np.loadtxt(out)
    return {"rmse": float(np.sqrt(np.mean((pred - truth) ** 2))), "seconds": seconds,
            "train_seconds": report["train_seconds"], "updates_per_s": report["rating_updates_per_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic-ratings", type=int, default=4_000_000)
    ap.add_argument("--skip-synthetic", action="store_true")
    ap.add_argument("--skip-ml100k", action="store_true")
    ap.add_argument("--peers", nargs="+", choices=["surprise", "spark"], default=["surprise"])
    ap.add_argument("--spark-python", default=".venv-seeds/bin/python",
                    help="an interpreter with pyspark (make seeds builds .venv-seeds)")
    ap.add_argument("--driver-memory", default=None, help="Spark's spark.driver.memory (default: Spark's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sets = []
    if args.skip_ml100k:
        pass
    elif os.path.exists(os.path.join(ML100K, "ua.base.gz")):
        sets.append(("ml-100k ua", os.path.join(ML100K, "ua.base.gz"), os.path.join(ML100K, "ua.test.gz")))
    else:
        print(f"skipped ml-100k: {ML100K} is absent (see ../shared/data/SOURCES.md)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_synthetic:
            train, test = os.path.join(tmp, "synth.train.tsv"), os.path.join(tmp, "synth.test.tsv")
            synthetic(train, test, args.synthetic_ratings)
            sets.append((f"synthetic {args.synthetic_ratings / 1e6:g} M", train, test))
        for name, train, test in sets:
            o = ours(train, test, tmp, [])
            row = {"set": name, "paramserver": o}
            print(f"{name:18s} paramserver mf (defaults, --workers 2): RMSE {o['rmse']:.4f} whole command "
                  f"{o['seconds']:7.2f} s (training {o['train_seconds']:.2f} s, {o['updates_per_s'] / 1e6:.1f} M "
                  "updates/s)", flush=True)
            if "surprise" in args.peers:
                s = row["surprise"] = surprise_svd(train, test)
                print(f"{'':18s} Surprise SVD: RMSE {s['rmse']:.4f} fit {s['seconds']:7.2f} s | time ratio "
                      f"{o['seconds'] / s['seconds']:.3f}", flush=True)
            if "spark" in args.peers:
                a = row["spark"] = spark_als(train, test, tmp, args.spark_python, args.driver_memory)
                print(f"{'':18s} Spark ALS (defaults, local[2]): RMSE {a['rmse']:.4f} ({a['unpredicted']} unpredicted)"
                      f" whole command {a['seconds']:7.2f} s, fit {a['train_seconds']:.2f} s | time ratio "
                      f"{o['seconds'] / a['seconds']:.3f} (whole commands)", flush=True)
            rows.append(row)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
