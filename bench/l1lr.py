"""`paramserver lasso --loss logistic` against liblinear (scikit-learn's
`LogisticRegression(l1_ratio=1, solver="liblinear", C=1/(nλ), fit_intercept=False, tol=1e-8)`,
the same problem scaled by C·n) on news20 (labels 2-6 -> +1, else -1), in one run.

λ is the one with the best held-out log loss: liblinear fits 80% of the rows (a fixed
shuffle) at λ_max/R for each R of `--ratios`, and the R whose fit has the lowest log loss
on the other 20% is taken.  Then, on all the rows at that λ: liblinear, timed from its
`fit` call, and `paramserver lasso --loss logistic --workers 2 --tol 1e-6`, with and
without the KKT filter, timed as whole commands.  Every objective is recomputed here from
the solver's coefficients; the relative difference is to liblinear's; the active set is
the filter's after each check (passes over the working set are counted in kkt_skipped).

    .venv/bin/python bench/l1lr.py [--ratios 20 50 100 200 500 1000 2000] [--json]
    .venv/bin/python bench/l1lr.py --criteo   # the Criteo sample (8 000 rows), its 39 fields hashed to 2^20

With ``--criteo`` the problem is the Criteo sample's training rows (``criteo/*_train.tsv.gz``,
parsed by paramserver's own Criteo parser at ``--hash-bits 20``: one indicator feature a
field), labels 0/1 as -1/+1; the active set is what matters there (issue 30: at most 5 % of
the coordinates after one pass at the λ with the best held-out log loss).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from lasso import DATA, binary_news20


def log_loss(X: Any, y: np.ndarray, w: np.ndarray) -> float:
    return float(np.logaddexp(0.0, -y * (X @ w)).mean())


def logistic_lambda_max(X: Any, y: np.ndarray) -> float:
    """The smallest λ at which every coefficient is 0: ``‖Xᵀy‖∞ / (2n)``."""
    return float(np.abs(X.T @ y).max() / (2 * X.shape[0]))


def liblinear(X: Any, y: np.ndarray, lam: float, tol: float = 1e-8) -> np.ndarray:
    """liblinear's coefficients at λ (scikit-learn's ``LogisticRegression``, C = 1/(nλ)): at
    tol 1e-8 the reference; at 1e-4, scikit-learn's default, what a user gets."""
    from sklearn.linear_model import LogisticRegression

    fit = LogisticRegression(l1_ratio=1, solver="liblinear", C=1 / (X.shape[0] * lam), fit_intercept=False,
                             tol=tol, max_iter=100_000).fit(X, y)
    return np.asarray(fit.coef_.ravel(), np.float64)


def best_ratio(X: Any, y: np.ndarray, lmax: float, ratios: list[float]) -> tuple[float, list[dict[str, float]]]:
    """The ratio whose liblinear fit on 80% of the rows has the lowest log loss on the rest."""
    order = np.random.default_rng(0).permutation(X.shape[0])
    cut = int(0.8 * X.shape[0])
    train, test = order[:cut], order[cut:]
    tried = []
    for ratio in ratios:
        w = liblinear(X[train], y[train], lmax / ratio)
        tried.append({"ratio": ratio, "test_log_loss": log_loss(X[test], y[test], w),
                      "nonzeros": int(np.count_nonzero(w))})
    return min(tried, key=lambda t: t["test_log_loss"])["ratio"], tried


def paramserver(path: str, ratio: float, out: str, *flags: str) -> tuple[float, dict[str, Any], np.ndarray]:
    """``paramserver lasso --loss logistic`` as a whole command (2 workers, its default) with
    ``flags``: its seconds, its ``--metrics-out`` report, its coefficients."""
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "paramserver", "lasso", "--data", path, "--loss", "logistic",
                          "--lambda-ratio", str(ratio), "--workers", "2", "--save", out,
                          "--metrics-out", out + ".json", *flags], capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if run.returncode:
        raise SystemExit(run.stderr)
    with open(out + ".json") as f:
        metrics = json.load(f)
    return seconds, metrics, np.load(os.path.join(out, "coef.npy"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--ratios", type=float, nargs="+", default=[20, 50, 100, 200, 500, 1000, 2000])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--criteo", action="store_true", help="the Criteo sample instead of news20")
    args = ap.parse_args()
    if args.criteo:
        args.data = CRITEO
    if os.path.exists(args.data):
        return run(args)
    print(f"skipped: {args.data} is absent (see ../shared/data/SOURCES.md)")
    return 0


CRITEO = os.path.join(os.path.dirname(DATA), "..", "criteo", "criteo_kaggle_wideresdnn_train.tsv.gz")


def criteo_libsvm(src: str, tmp: str) -> tuple[str, Any, np.ndarray]:
    """The Criteo sample as a LIBSVM file (features: hashed field values, 1-based), X, y."""
    import scipy.sparse as sp

    from paramserver.data.batch import DataFormat
    from paramserver.data.reader import read_all

    b = read_all([src], DataFormat("criteo", hash_bits=20))
    y = np.where(b.labels > 0.5, 1.0, -1.0)
    cols = b.keys.astype(np.int64)
    X = sp.csr_matrix((np.ones(cols.size), cols, b.indptr), shape=(len(y), int(cols.max()) + 1))
    X.sum_duplicates()
    X.data[:] = 1.0
    path = os.path.join(tmp, "criteo.svm")
    with open(path, "w") as f:
        for i in range(X.shape[0]):
            cols = X.indices[X.indptr[i]:X.indptr[i + 1]]
            f.write(f"{int(y[i])} " + " ".join(f"{c + 1}:1" for c in np.sort(cols)) + "\n")
    return path, X.tocsc(), y


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path, X, y = (criteo_libsvm if args.criteo else binary_news20)(args.data, tmp)
        X = X.tocsr()
        lmax = logistic_lambda_max(X, y)
        ratio, tried = best_ratio(X, y, lmax, args.ratios)
        lam = lmax / ratio

        def obj(w: np.ndarray) -> float:
            return log_loss(X, y, w) + lam * float(np.abs(w).sum())

        t = time.perf_counter()
        ref = liblinear(X, y, lam)
        rows = [{"solver": "liblinear (tol 1e-8)", "seconds": time.perf_counter() - t, "objective": obj(ref),
                 "nonzeros": int(np.count_nonzero(ref))}]
        for name, flags in (("paramserver lasso --loss logistic --workers 2 --tol 1e-6", ("--tol", "1e-6")),
                            ("the same, --no-kkt-filter", ("--tol", "1e-6", "--no-kkt-filter"))):
            seconds, metrics, w = paramserver(path, ratio, os.path.join(tmp, f"ps{len(rows)}"), *flags)
            rows.append({"solver": name, "seconds": seconds, "objective": obj(w), "nonzeros": int(np.count_nonzero(w)),
                         "relative_gap": metrics["relative_gap"], "rounds": metrics["rounds"],
                         "coordinate_updates": metrics["coordinate_updates"], "kkt_skipped": metrics["kkt_skipped"],
                         "active_set": metrics["active_set"]})
    for r in rows:
        r["relative_difference"] = (r["objective"] - rows[0]["objective"]) / rows[0]["objective"]
    result = {"lambda_max": lmax, "ratio": ratio, "lambda": lam, "held_out": tried, "solvers": rows}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"λ = λ_max/{ratio:g} = {lam:.6g} (λ_max = {lmax:.6g}); held-out log loss by ratio: "
          + ", ".join(f"{t['ratio']:g}: {t['test_log_loss']:.4f}" for t in tried))
    print("| solver | seconds | objective | rel. difference to liblinear | non-zeros | kkt_skipped | active set |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['solver']} | {r['seconds']:.2f} | {r['objective']:.12f} | {r['relative_difference']:.1e} | "
              f"{r['nonzeros']} | {r.get('kkt_skipped', '')} | {' '.join(map(str, r.get('active_set', [])))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
