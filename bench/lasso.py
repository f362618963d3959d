"""`paramserver lasso` against scikit-learn's coordinate descent and celer, one run each,
on news20 (labels 2-6 -> +1, else -1) at λ_max/200 and λ_max/2000 (issue 15).

Every solver's objective is recomputed here from its coefficients, and compared with the
best objective any of them reached (celer, run again at tol 1e-10, is the reference).
`paramserver lasso` is timed as a whole command with default flags apart from
`--workers 2`; the others from their `fit` call.  Also: coordinate updates to converge
for each `--schedule`, which is what the scheduling buys.

    .venv/bin/python bench/lasso.py [--ratios 200 2000] [--schedules priority cyclic random]
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
from typing import Any

import numpy as np

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "libsvm", "news20.multiclass.libsvm.gz")


def binary_copy(src: str, dst: str) -> None:
    """news20 with labels 2-6 as +1 and the others -1 (the issue's problem)."""
    with gzip.open(src, "rt") as f, open(dst, "w") as g:
        for line in f:
            label, _, rest = line.strip().partition(" ")
            g.write(f"{1 if 2 <= int(float(label)) <= 6 else -1} {rest}\n")


def binary_news20(src: str, tmp: str) -> tuple[str, Any, np.ndarray]:
    """news20 as ±1 in ``tmp`` (``binary_copy``), read by scikit-learn: the file's path, X (CSC
    with 32-bit indices, which scikit-learn's solvers take) and y."""
    from sklearn.datasets import load_svmlight_file

    path = os.path.join(tmp, "news20.svm")
    binary_copy(src, path)
    X, y = load_svmlight_file(path)
    X = X.tocsc()
    X.indices, X.indptr = X.indices.astype(np.int32), X.indptr.astype(np.int32)
    return path, X, y


def lambda_max(X: Any, y: np.ndarray) -> float:
    """The smallest λ at which every coefficient is 0."""
    return float(np.abs(X.T @ y).max() / X.shape[0])


def objective(X: Any, y: np.ndarray, w: np.ndarray, lam: float) -> float:
    """Lasso's objective, ||y - Xw||² / 2n + λ|w|₁, recomputed here for every solver alike."""
    r = y - X @ w
    return float(r @ r / (2 * X.shape[0]) + lam * np.abs(w).sum())


def fit_sklearn(X: Any, y: np.ndarray, lam: float) -> tuple[float, np.ndarray]:
    """scikit-learn's coordinate descent at tol 1e-4: seconds of its ``fit`` call, and the coefficients."""
    from sklearn.linear_model import Lasso

    t = time.perf_counter()
    w = Lasso(alpha=lam, fit_intercept=False, tol=1e-4, max_iter=1_000_000).fit(X, y).coef_
    return time.perf_counter() - t, w


def fit_celer(X: Any, y: np.ndarray, lam: float, tol: float = 1e-4,
              max_iter: int | None = None) -> tuple[float, np.ndarray]:
    """celer (its own iteration cap unless ``max_iter``; tol 1e-10 and 200 iterations give the reference
    optimum): seconds of its ``fit`` call, and the coefficients."""
    import celer

    cap = {} if max_iter is None else {"max_iter": max_iter}
    t = time.perf_counter()
    w = celer.Lasso(alpha=lam, fit_intercept=False, tol=tol, **cap).fit(X, y).coef_
    return time.perf_counter() - t, w


def run_paramserver(path: str, ratio: float, tmp: str, schedule: str = "priority",
                    max_rounds: int | None = None) -> tuple[float, np.ndarray, dict]:
    """``paramserver lasso`` as a whole command (default flags, which are 2 workers; a schedule and a round
    cap when given): its seconds, its coefficients and its ``--metrics-out`` report."""
    out = os.path.join(tmp, f"ps-{schedule}")
    cap = [] if max_rounds is None else ["--max-rounds", str(max_rounds)]
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "paramserver", "lasso", "--data", path, "--lambda-ratio",
                          str(ratio), "--workers", "2", "--schedule", schedule, "--save", out,
                          "--metrics-out", out + ".json", *cap], capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if run.returncode:
        raise SystemExit(f"paramserver lasso failed:\n{run.stderr}")
    with open(out + ".json") as f:
        metrics = json.load(f)
    return seconds, np.load(os.path.join(out, "coef.npy")), metrics


def solve_all(path: str, X: Any, y: np.ndarray, ratio: float, schedules: list[str], max_rounds: int,
              tmp: str) -> list[dict]:
    """Every solver at λ_max/``ratio``, one run each: a row each, sub-optimality against the best objective."""
    lam = lambda_max(X, y) / ratio
    seconds, w = fit_sklearn(X, y, lam)
    found: list[tuple[str, float, float, int | None]] = [
        ("scikit-learn CD (tol 1e-4)", seconds, objective(X, y, w, lam), None)]
    seconds, w = fit_celer(X, y, lam)
    found.append(("celer (tol 1e-4)", seconds, objective(X, y, w, lam), None))
    best = objective(X, y, fit_celer(X, y, lam, tol=1e-10, max_iter=200)[1], lam)
    for schedule in schedules:
        cap = None if schedule == "priority" else max_rounds
        seconds, w, metrics = run_paramserver(path, ratio, tmp, schedule, cap)
        name = "paramserver lasso" + (" (default flags, --workers 2)" if schedule == "priority"
                                      else f" --schedule {schedule}")
        if not metrics["converged"]:
            name += f" (stopped at {metrics['rounds']} rounds, gap {metrics['relative_gap']:.1e})"
        found.append((name, seconds, objective(X, y, w, lam), metrics["coordinate_updates"]))
    best = min([best] + [f[2] for f in found])
    return [{"ratio": ratio, "solver": name, "seconds": round(seconds, 2), "objective": value,
             "relative_suboptimality": (value - best) / best, "coordinate_updates": updates}
            for name, seconds, value, updates in found]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--ratios", type=float, nargs="+", default=[200, 2000])
    ap.add_argument("--schedules", nargs="+", default=["priority", "cyclic", "random"])
    ap.add_argument("--max-rounds", type=int, default=1000, help="cap for the comparison schedules (cyclic, "
                    "random); the default schedule runs uncapped")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.data):
        print(f"skipped: {args.data} is absent (see ../shared/data/SOURCES.md)")
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path, X, y = binary_news20(args.data, tmp)
        for ratio in args.ratios:
            rows += solve_all(path, X, y, ratio, args.schedules, args.max_rounds, tmp)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| λ | solver | seconds | objective | rel. sub-optimality | coordinate updates |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| λmax/{r['ratio']:g} | {r['solver']} | {r['seconds']:.2f} | {r['objective']:.10f} | "
              f"{r['relative_suboptimality']:.1e} | {r['coordinate_updates'] or ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
