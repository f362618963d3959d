"""``paramserver lasso`` end to end (issue 15): two workers and a server solve a small
Lasso to scikit-learn's objective; coef.npy and the metrics are as documented; bad
flags and unwritable outputs are refused before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(240)
sklearn = pytest.importorskip("sklearn.linear_model")


def _cli(*args, check=True):
    run = subprocess.run([sys.executable, "-m", "paramserver", "lasso", "--json", *args], capture_output=True,
                         text=True, timeout=200)
    if check:
        assert run.returncode == 0, run.stderr
    return run


def _data(tmp_path, n=400, d=150):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((n, d)) * (rng.random((n, d)) < 0.1)
    w = np.zeros(d)
    w[::15] = rng.standard_normal(w[::15].size)
    y = X @ w + 0.05 * rng.standard_normal(n)
    path = tmp_path / "train.svm"
    with open(path, "w") as f:
        for i in range(n):
            f.write(f"{float(y[i])!r} " + " ".join(f"{j + 1}:{float(X[i, j])!r}" for j in np.flatnonzero(X[i]))
                    + "\n")
    return X, y, str(path)


def test_lasso_solves_to_scikit_learns_objective_and_writes_what_it_says(tmp_path):
    X, y, path = _data(tmp_path)
    n = X.shape[0]
    lam = np.abs(X.T @ y).max() / n / 30
    out, metrics = tmp_path / "model", tmp_path / "m.json"
    run = _cli("--data", path, "--lambda-ratio", "30", "--tol", "1e-6", "--workers", "2", "--save", str(out),
               "--metrics-out", str(metrics))
    report = json.loads(run.stdout.strip().splitlines()[-1])
    coef = np.load(out / "coef.npy")
    assert coef.dtype == np.float64 and coef.shape == (X.shape[1],)
    ref = sklearn.Lasso(alpha=lam, fit_intercept=False, tol=1e-12, max_iter=100_000).fit(X, y).coef_

    def obj(w):
        return np.sum((y - X @ w) ** 2) / (2 * n) + lam * np.abs(w).sum()

    assert obj(coef) <= obj(ref) * (1 + 1e-6)
    saved = json.loads(metrics.read_text())
    for key in ("objective", "duality_gap", "nonzeros", "seconds", "coordinate_updates"):
        assert key in saved and key in report
    assert saved["converged"] and saved["nonzeros"] == np.count_nonzero(coef) and saved["coordinate_updates"] > 0
    assert saved["objective"] == pytest.approx(obj(coef), rel=1e-9)
    assert saved["lambda"] == pytest.approx(lam, rel=1e-9) and saved["workers"] == 2


def test_bad_flags_and_outputs_are_refused_before_any_work(tmp_path):
    _, _, path = _data(tmp_path, n=20, d=10)
    run = _cli("--data", path, check=False)
    assert run.returncode == 2 and "one of the arguments --lambda --lambda-ratio is required" in run.stderr
    run = _cli("--data", path, "--lambda-ratio", "0.5", check=False)
    assert run.returncode == 2 and "--lambda-ratio must be a number >= 1" in run.stderr
    run = _cli("--data", path, "--lambda", "0.1", "--tol", "1e-13", check=False)
    assert run.returncode == 2 and "--tol must be in [1e-12, 1)" in run.stderr
    blocked = tmp_path / "file"
    blocked.write_text("")
    run = _cli("--data", path, "--lambda", "0.1", "--save", str(blocked / "sub"), check=False)
    assert run.returncode == 2 and "--save" in run.stderr and not os.path.exists(blocked / "sub")
    bad = tmp_path / "bad.svm"
    bad.write_text("1 1:1\n2 x:1\n")
    run = _cli("--data", str(bad), "--lambda", "0.1", check=False)
    assert run.returncode == 2 and "bad.svm:2: a feature index is not a whole number from 0 to 10^18 - 1" in run.stderr
    bad.write_text("1 1:1\n\n-1 2:1\n3 1:2\n")
    run = _cli("--data", str(bad), "--loss", "logistic", "--lambda", "0.1", check=False)
    assert run.returncode == 2 and "bad.svm:4: the label 3 is not 1, -1" in run.stderr
    run = _cli("--data", path, "--lambda", "0.1", "--intercept", check=False)
    assert run.returncode == 2 and "--intercept is for --loss logistic" in run.stderr


def test_lasso_logistic_solves_to_liblinears_objective_with_the_kkt_filter(tmp_path):
    rng = np.random.default_rng(7)
    n, d = 500, 200
    X = rng.standard_normal((n, d)) * (rng.random((n, d)) < 0.1)
    truth = np.zeros(d)
    truth[::10] = 2 * rng.standard_normal(truth[::10].size)
    y01 = (X @ truth + 0.5 * rng.standard_normal(n) > 0).astype(np.int64)  # 0/1 labels: 0 is read as -1
    path = tmp_path / "classes.svm"
    path.write_text("".join(f"{y01[i]} " + " ".join(f"{j + 1}:{float(X[i, j])!r}" for j in np.flatnonzero(X[i]))
                            + "\n" for i in range(n)))
    y = 2.0 * y01 - 1
    lam = np.abs(X.T @ y).max() / (2 * n) / 20
    out, metrics = tmp_path / "model", tmp_path / "m.json"
    run = _cli("--data", str(path), "--loss", "logistic", "--lambda-ratio", "20", "--tol", "1e-8", "--workers", "2",
               "--save", str(out), "--metrics-out", str(metrics))
    report = json.loads(run.stdout.strip().splitlines()[-1])
    coef = np.load(out / "coef.npy")
    ref = sklearn.LogisticRegression(l1_ratio=1, solver="liblinear", C=1 / (n * lam), fit_intercept=False, tol=1e-8,
                                     max_iter=10_000).fit(X, y).coef_.ravel()

    def obj(w):
        return np.logaddexp(0.0, -y * (X @ w)).mean() + lam * np.abs(w).sum()

    assert abs(obj(coef) - obj(ref)) <= 1e-4 * obj(ref), (obj(coef), obj(ref))
    assert report["loss"] == "logistic" and report["converged"] and report["relative_gap"] <= 1e-8
    assert report["lambda"] == pytest.approx(lam, rel=1e-9) and report["objective"] == pytest.approx(obj(coef),
                                                                                                      rel=1e-9)
    assert report["kkt_filter"] and report["kkt_skipped"] > 0 and report["workers"] == 2
    assert len(report["active_set"]) >= 2 and min(report["active_set"]) < d
    saved = json.loads(metrics.read_text())
    assert saved["active_set"] == [h["active_set"] for h in saved["history"]]
    assert saved["nonzeros"] == np.count_nonzero(coef) > 0


def test_a_lambda_at_float64s_resolution_stops_when_nothing_moves_and_says_why(tmp_path):
    """λ_max / 10^300: the gap sat at the objective itself, and the job ran its 10^6 rounds."""
    path = tmp_path / "tiny.svm"
    path.write_text("1 1:0.5 3:1\n-1 2:1\n")
    run = _cli("--data", str(path), "--lambda-ratio", "1e300", "--json")
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["stuck"] and not report["converged"] and report["rounds"] < 100
    said = " ".join(run.stderr.split())  # the console wraps its lines
    assert "nothing moved over 10 checks" in said and "a smaller --lambda-ratio" in said


def test_three_workers_converge_where_their_blocks_interfere(tmp_path):
    """news20 at λ_max/1000: three workers' blocks of correlated columns, each swept blind to
    the others' moves, took the objective from 0.5 to 1e8 under the two workers' interference
    bound; with the bound for three (``lasso.interference_bound``) the gap certifies, and the
    model is the two workers' within the tolerance."""
    import gzip

    from support import shared

    src, path = shared("libsvm/news20.multiclass.libsvm.gz"), tmp_path / "news20.svm"
    with gzip.open(src, "rt") as f, open(path, "w") as g:  # classes 2-6 against the rest, as bench/lasso.py
        for line in f:
            label, _, rest = line.strip().partition(" ")
            g.write(f"{1 if 2 <= int(float(label)) <= 6 else -1} {rest}\n")
    reports = {}
    for workers in (2, 3):
        metrics = tmp_path / f"m{workers}.json"
        _cli("--data", str(path), "--lambda-ratio", "1000", "--workers", str(workers), "--max-rounds", "200",
             "--metrics-out", str(metrics))
        reports[workers] = json.loads(metrics.read_text())
    three, two = reports[3], reports[2]
    assert three["converged"] and three["relative_gap"] <= 1e-4, (three["rounds"], three["objective"])
    assert abs(three["objective"] - two["objective"]) <= 1e-4 * two["objective"]
