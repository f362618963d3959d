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
    import celer
    from sklearn.linear_model import Lasso

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path, X, y = binary_news20(args.data, tmp)
        n = X.shape[0]
        lmax = float(np.abs(X.T @ y).max() / n)

        def obj(w: np.ndarray, lam: float) -> float:
            r = y - X @ w
            return float(r @ r / (2 * n) + lam * np.abs(w).sum())

        for ratio in args.ratios:
            lam = lmax / ratio
            found = []
            t = time.perf_counter()
            w = Lasso(alpha=lam, fit_intercept=False, tol=1e-4, max_iter=1_000_000).fit(X, y).coef_
            found.append(("scikit-learn CD (tol 1e-4)", time.perf_counter() - t, obj(w, lam), None))
            t = time.perf_counter()
            w = celer.Lasso(alpha=lam, fit_intercept=False, tol=1e-4).fit(X, y).coef_
            found.append(("celer (tol 1e-4)", time.perf_counter() - t, obj(w, lam), None))
            best = obj(celer.Lasso(alpha=lam, fit_intercept=False, tol=1e-10, max_iter=200).fit(X, y).coef_, lam)
            for schedule in args.schedules:
                out = os.path.join(tmp, f"ps-{schedule}")
                t = time.perf_counter()
                cap = [] if schedule == "priority" else ["--max-rounds", str(args.max_rounds)]
                run = subprocess.run([sys.executable, "-m", "paramserver", "lasso", "--data", path, "--lambda-ratio",
                                      str(ratio), "--workers", "2", "--schedule", schedule, "--save", out,
                                      "--metrics-out", out + ".json", *cap], capture_output=True, text=True)
                seconds = time.perf_counter() - t
                if run.returncode:
                    print(run.stderr, file=sys.stderr)
                    return 1
                metrics = json.load(open(out + ".json"))
                name = "paramserver lasso" + (" (default flags, --workers 2)" if schedule == "priority"
                                              else f" --schedule {schedule}")
                if not metrics["converged"]:
                    name += f" (stopped at {metrics['rounds']} rounds, gap {metrics['relative_gap']:.1e})"
                found.append((name, seconds, obj(np.load(os.path.join(out, "coef.npy")), lam),
                              metrics["coordinate_updates"]))
            best = min([best] + [f[2] for f in found])
            for name, seconds, value, updates in found:
                rows.append({"ratio": ratio, "solver": name, "seconds": round(seconds, 2), "objective": value,
                             "relative_suboptimality": (value - best) / best, "coordinate_updates": updates})
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
