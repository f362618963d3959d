"""`paramserver mf` against Surprise's `SVD` (its defaults), one run each (issue 15):

- MovieLens 100K's own `ua` split (from ../shared/data/movielens/ml-100k);
- a synthetic set of `--synthetic-ratings` ratings (default 4 M): users' activity and
  items' popularity drawn from power laws, ratings from a rank-10 model with biases and
  noise, rounded to 1..5; 10 % held out at random.

`paramserver mf` is timed as a whole command (read, train, predict) with default flags
apart from `--workers 2`; Surprise from its `fit` call alone (the data already loaded).
Test RMSE for both is computed here from the predictions.

    .venv/bin/python bench/mf.py [--synthetic-ratings 4000000] [--skip-synthetic]
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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sets = []
    if os.path.exists(os.path.join(ML100K, "ua.base.gz")):
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
            s = surprise_svd(train, test)
            o = ours(train, test, tmp, [])
            rows.append({"set": name, "surprise": s, "paramserver": o})
            print(f"{name:18s} Surprise SVD: RMSE {s['rmse']:.4f} fit {s['seconds']:7.2f} s | paramserver mf "
                  f"(defaults, --workers 2): RMSE {o['rmse']:.4f} whole command {o['seconds']:7.2f} s "
                  f"(training {o['train_seconds']:.2f} s, {o['updates_per_s'] / 1e6:.1f} M updates/s) | "
                  f"time ratio {o['seconds'] / s['seconds']:.2f}", flush=True)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
