"""L1-regularised logistic regression (``paramserver lasso --loss logistic``) and the KKT
filter of both losses, without a cluster: the scheduled solution against liblinear's
objective, λ_max and the duality gap against their formulas, the labels, and the filter
skipping coordinates without changing the solution."""

from __future__ import annotations

import decimal
import warnings
from dataclasses import replace

import numpy as np
import pytest
from test_lasso_solver import _solve

from paramserver.apps.rounds.coordinate import LassoConfig
from paramserver.apps.rounds.kkt import kkt_filter
from paramserver.apps.rounds.l1lr import L1LRProgram, margin, signed_labels
from paramserver.apps.rounds.l1lr_math import (
    STEP,
    _glmnet,
    _loss_change,
    logistic_bound,
    logistic_gradient,
    logistic_lambda_max,
    logistic_objective,
    step_caps,
)
from paramserver.apps.rounds.lasso import LassoProgram
from paramserver.apps.rounds.lasso_math import lambda_max
from paramserver.apps.rounds.matrix import read_libsvm_matrix
from paramserver.data.reader import DataError

sklearn = pytest.importorskip("sklearn.linear_model")
datasets = pytest.importorskip("sklearn.datasets")
ConvergenceWarning = pytest.importorskip("sklearn.exceptions").ConvergenceWarning


def _classes(tmp_path, n=300, d=60, seed=0, zero_one=False):
    """Sparse features, labels from a sparse linear model with noise, as a LIBSVM file."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * (rng.random((n, d)) < 0.3)
    truth = np.zeros(d)
    truth[: d // 6] = 2 * rng.standard_normal(d // 6)
    y = np.where(X @ truth + 0.5 * rng.standard_normal(n) > 0, 1.0, 0.0 if zero_one else -1.0)
    path = str(tmp_path / f"classes{seed}.svm")
    datasets.dump_svmlight_file(X, y, path, zero_based=False)
    m = signed_labels(read_libsvm_matrix(path, d), path)
    return X, np.where(y > 0, 1.0, -1.0), m


def _objective(X, y, w, lam):
    return float(np.logaddexp(0.0, -y * (X @ w)).mean() + lam * np.abs(w).sum())


def _liblinear(X, y, lam):
    """liblinear's L1 logistic regression at C = 1/(nλ): the same problem, scaled by C·n."""
    return sklearn.LogisticRegression(l1_ratio=1, solver="liblinear", C=1 / (X.shape[0] * lam),
                                      fit_intercept=False, tol=1e-8, max_iter=10_000).fit(X, y).coef_.ravel()


@pytest.mark.parametrize("workers,schedule", [(1, "priority"), (2, "priority"), (3, "cyclic")])
def test_the_scheduled_solution_matches_liblinears_objective(tmp_path, workers, schedule):
    X, y, m = _classes(tmp_path)
    lam = logistic_lambda_max(m) / 20
    program, rounds = _solve(m, lam, workers, schedule, tol=1e-8, program=L1LRProgram)
    assert program.solved and rounds < 5000
    ours, ref = _objective(X, y, program.w, lam), _objective(X, y, _liblinear(X, y, lam), lam)
    assert abs(ours - ref) <= 1e-4 * ref, (ours, ref)
    assert ours <= ref * (1 + 1e-7)  # as good as liblinear at tol 1e-8, or better
    assert program.primal == pytest.approx(ours, rel=1e-12) and program.gap <= 1e-8 * program.primal
    assert 0 < np.count_nonzero(program.w) < X.shape[1]


def test_lambda_max_gives_zero_and_the_gap_is_the_textbook_one(tmp_path):
    X, y, m = _classes(tmp_path, seed=1)
    n = X.shape[0]
    lmax = logistic_lambda_max(m)
    assert lmax == pytest.approx(np.abs(X.T @ y).max() / (2 * n), rel=1e-12)
    above, _ = _solve(m, lmax * 1.001, 2, program=L1LRProgram)
    assert not above.w.any() and above.primal == pytest.approx(np.log(2), rel=1e-12) and above.gap == 0
    below, _ = _solve(m, lmax * 0.9, 2, program=L1LRProgram)
    assert np.count_nonzero(below.w) >= 1
    lam = lmax / 5
    w = np.random.default_rng(2).standard_normal(X.shape[1]) * 0.05
    z = margin(m, w)
    np.testing.assert_allclose(z, X @ w, rtol=1e-12, atol=1e-12)
    grad = logistic_gradient(m, z)
    p = 1 / (1 + np.exp(y * (X @ w)))  # σ(−y xᵀw)
    np.testing.assert_allclose(grad, -(X.T @ (y * p)) / n, rtol=1e-10, atol=1e-14)
    primal, dual = logistic_bound(m.y, z, w, grad, lam)
    a = p * min(1.0, n * lam / np.abs(X.T @ (y * p)).max())
    assert np.abs(X.T @ (a * y)).max() <= n * lam * (1 + 1e-12)  # the dual point is feasible
    assert primal == pytest.approx(_objective(X, y, w, lam), rel=1e-12)
    assert dual == pytest.approx(np.mean(-a * np.log(a) - (1 - a) * np.log(1 - a)), rel=1e-12)
    assert dual < primal


def test_zero_one_labels_are_read_as_minus_one_and_others_are_refused_with_the_line(tmp_path):
    X, y, m = _classes(tmp_path, seed=3, zero_one=True)
    assert set(m.y.tolist()) == {-1.0, 1.0} and np.array_equal(m.y, y)
    path = tmp_path / "three.svm"
    path.write_text("1 1:1\n\n-1 2:1\n2 1:3\n")
    with pytest.raises(DataError, match=r"three.svm:4: the label 2 is not 1, -1 .*: '2 1:3'; --loss logistic takes "
                                        "two classes"):
        signed_labels(read_libsvm_matrix(str(path)), str(path))
    path.write_text("1 1:1\n-1 2:1\n0 1:3\n")
    with pytest.raises(DataError, match="three.svm:3: the label 0 is not"):
        signed_labels(read_libsvm_matrix(str(path)), str(path))
    path.write_text("# a tool's header\n1 1:1\n  # a note\n-1 2:1\n2 1:3 # the bad one\n")  # comments are no rows
    with pytest.raises(DataError, match="three.svm:5: the label 2 is not"):
        signed_labels(read_libsvm_matrix(str(path)), str(path))
    path.write_text("2 1:1\n1 2:1\n1 1:3\n")  # two classes numbered 1 and 2, as train's --label-format 12 reads
    assert signed_labels(read_libsvm_matrix(str(path)), str(path)).y.tolist() == [1.0, -1.0, -1.0]


def test_the_kkt_filter_leaves_the_non_zeros_and_the_violators():
    w = np.array([0.0, 0.5, 0.0, 0.0, -1.0])
    grad = np.array([0.3, 0.0, -0.7, 0.5, 2.0])
    kept = kkt_filter(w, grad, 0.5)
    assert kept.active.tolist() == [1, 2, 4] and kept.skipped == 2  # |0.5| <= λ is inside: filtered
    np.testing.assert_allclose(kept.violation, [-0.2, -np.inf, 0.2, 0.0, -np.inf])
    every = kkt_filter(w, grad, 0.5, enabled=False)
    assert every.active.tolist() == [0, 1, 2, 3, 4] and every.skipped == 0


def test_a_filtered_coordinate_does_not_move_in_a_proximal_step(tmp_path):
    X, y, m = _classes(tmp_path, seed=4)
    lam = logistic_lambda_max(m) / 10
    w = np.zeros(X.shape[1])
    w[:3] = 0.3
    z = margin(m, w)
    kept = kkt_filter(w, logistic_gradient(m, z), lam)
    skipped = np.setdiff1d(np.arange(X.shape[1]), kept.active)
    assert skipped.size > 0
    before = w.copy()
    for j in skipped:  # each one alone, at this point: it stays at zero
        _newton(m, np.array([j]), w, z, lam)
    np.testing.assert_array_equal(w, before)


def _newton(m, coords, w, z, lam, steps=1, cap=None):
    n = m.shape[0]
    cap = step_caps(m, STEP) if cap is None else cap
    return _glmnet(m.colptr, m.rows, m.values, m.y, coords, w, z, n, lam, steps, 0.0, np.zeros((3, n)),
                   np.zeros(n, np.int64), np.zeros(n, np.bool_), cap)


@pytest.mark.parametrize("u,delta", [(0.3, 0.2), (-0.3, 1e-9), (5.0, -2.0), (-40.0, 100.0), (-800.0, 900.0),
                                     (800.0, -900.0), (40.0, -1e4), (-1e4, 3.0)])
def test_a_rows_loss_change_is_exact_where_the_row_is_misclassified_with_great_confidence(u, delta):
    tau = 1.0 / (1.0 + np.exp(min(u, 700.0))) if u < 700 else 0.0  # σ(−u) as the kernel has it
    with decimal.localcontext() as ctx:  # the difference to 60 digits: float64's own cancels
        ctx.prec = 60
        u_, d_ = decimal.Decimal(u), decimal.Decimal(delta)
        want = float((1 + (-u_ - d_).exp()).ln() - (1 + (-u_).exp()).ln())
    assert _loss_change(u, tau, delta) == pytest.approx(want, rel=1e-12, abs=1e-300)


def _confident(tmp_path):
    """Rows 0 and 1 misclassified by a margin of 40 through column 1 (``σ(−u)`` rounds to 1
    and the curvature to 0); column 0 touches only them: its model's step is unbounded."""
    path = tmp_path / "confident.svm"
    path.write_text("1 1:1 2:1\n1 1:1 2:1\n-1 2:1\n-1 3:1\n")
    m = signed_labels(read_libsvm_matrix(str(path)), str(path))
    w = np.array([0.0, -40.0, 0.0])
    return m, w, margin(m, w)


def test_a_newton_step_through_confidently_misclassified_rows_lowers_the_objective(tmp_path):
    m, w, z = _confident(tmp_path)
    lam = 1e-3
    before = logistic_objective(m.y, z, w, lam)
    for cap in (np.full(3, np.inf), step_caps(m, STEP)):  # unbounded, as by default
        w1, z1 = w.copy(), z.copy()
        assert _newton(m, np.array([0, 1, 2]), w1, z1, lam, steps=5, cap=cap) > 0
        after = logistic_objective(m.y, z1, w1, lam)
        assert np.isfinite(after) and after < before  # read through log1p alone, a step looked 10^11 better
        np.testing.assert_allclose(z1, margin(m, w1), rtol=0, atol=1e-9)


def test_a_newton_step_moves_a_margin_by_at_most_step_through_one_coordinate(tmp_path):
    m, w, z = _confident(tmp_path)
    w1 = w.copy()
    _newton(m, np.array([0]), w1, z.copy(), 1e-3)
    assert 0 < w1[0] <= STEP  # column 0's entries are 1: its Newton step alone would be ~10^11


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_the_kkt_filter_skips_coordinates_and_leaves_the_solution_as_it_was(tmp_path, loss):
    X, y, m = _classes(tmp_path, n=200, d=80, seed=5)
    if loss == "squared":
        program, lam = LassoProgram, lambda_max(m) / 8
    else:
        program, lam = L1LRProgram, logistic_lambda_max(m) / 8
    on, _ = _solve(m, lam, 2, tol=1e-12, program=program, per_round=8)
    off, _ = _solve(m, lam, 2, tol=1e-12, program=program, per_round=8, kkt_filter=False)
    assert on.cfg.kkt_filter and not off.cfg.kkt_filter and LassoConfig(lam=1.0).kkt_filter
    np.testing.assert_allclose(on.w, off.w, rtol=0, atol=1e-6)
    assert on.primal == pytest.approx(off.primal, rel=1e-9)
    assert on.kkt_skipped > 0 and off.kkt_skipped == 0
    active = [h["active_set"] for h in on.history]
    assert min(active) < X.shape[1] and all(h["active_set"] == X.shape[1] for h in off.history)
    assert on.history[-1]["active_set"] >= np.count_nonzero(on.w)
    assert all(h["active_set"] + h["kkt_filtered"] == X.shape[1] for h in on.history)
    skipped = [h["kkt_skipped"] for h in on.history] + [on.kkt_skipped]  # so far, at each check; at the end
    assert skipped == sorted(skipped) and skipped[0] == 0 and skipped[1] >= on.history[0]["kkt_filtered"] > 0


def test_the_unpenalised_intercept_matches_saga_and_moves_lambda_max(tmp_path):
    X, y, m = _classes(tmp_path, seed=6)
    y_shifted = np.where(X[:, 0] + X[:, 1] > -0.8, 1.0, -1.0)  # mostly +1: the intercept matters
    m = replace(m, y=y_shifted)
    n = X.shape[0]
    lmax = logistic_lambda_max(m, intercept=True)
    b0 = np.log((y_shifted > 0).sum() / (y_shifted < 0).sum())  # the best intercept of w = 0
    p = 1 / (1 + np.exp(-b0))
    assert lmax == pytest.approx(np.abs(X.T @ (y_shifted * np.where(y_shifted > 0, 1 - p, p))).max() / n, rel=1e-9)
    above, _ = _solve(m, lmax * 1.001, 2, program=L1LRProgram, intercept=True)
    assert not above.w.any() and above.b == pytest.approx(b0, rel=1e-9)
    lam = lmax / 10
    program, _ = _solve(m, lam, 2, tol=1e-10, program=L1LRProgram, intercept=True)
    with warnings.catch_warnings():  # saga may say it stopped at max_iter: its objective is compared below
        warnings.simplefilter("ignore", ConvergenceWarning)
        ref = sklearn.LogisticRegression(l1_ratio=1, solver="saga", C=1 / (n * lam), fit_intercept=True, tol=1e-12,
                                         max_iter=100_000).fit(X, y_shifted)

    def obj(w, b):
        return float(np.logaddexp(0.0, -y_shifted * (X @ w + b)).mean() + lam * np.abs(w).sum())

    ours, theirs = obj(program.w, program.b), obj(ref.coef_.ravel(), float(ref.intercept_[0]))
    assert abs(ours - theirs) <= 1e-8 * theirs and ours <= theirs * (1 + 1e-10), (ours, theirs)
    assert program.b == pytest.approx(float(ref.intercept_[0]), abs=1e-5) and abs(program.b) > 0.1
    assert program.gap <= 1e-10 * program.primal
