"""The Lasso's dual point from its support's least squares (``lasso_support``): its
products are the matrix's, its value is a lower bound on the optimum from any point, and
from a point on the optimum's support it closes the gap the scaled residual leaves."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.apps.rounds.lasso_math import _residual, _xtr, duality_gap, lambda_max, objective
from paramserver.apps.rounds.lasso_pairs import by_row
from paramserver.apps.rounds.lasso_support import (
    SOLVED,
    _cg_start,
    _cg_steps,
    _columns_dot,
    _gram,
    support_dual,
    worth_trying,
)
from paramserver.apps.rounds.matrix import Matrix

sklearn = pytest.importorskip("sklearn.linear_model")


def _matrix(X: np.ndarray, y: np.ndarray) -> Matrix:
    nz = [np.flatnonzero(X[:, j]) for j in range(X.shape[1])]
    colptr = np.r_[0, np.cumsum([r.size for r in nz])].astype(np.int64)
    rows = np.concatenate(nz).astype(np.int64)
    values = np.concatenate([X[r, j] for j, r in enumerate(nz)])
    return Matrix(y=y.astype(np.float64), colptr=colptr, rows=rows, values=values)


def _problem(seed=0, n=200, d=80):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * (rng.random((n, d)) < 0.3)
    X[:, 1] = X[:, 0] + 0.01 * rng.standard_normal(n)  # a nearly collinear pair: coordinate descent creeps there
    w = np.zeros(d)
    w[:12] = rng.standard_normal(12)
    return X, X @ w + 0.1 * rng.standard_normal(n)


def test_the_products_are_the_columns_own():
    """The support by row is its columns' entries row by row (each one's place in the
    support); the Gram product through it is ``X_SᵀX_S·x``; ``X_Sᵀy`` by column."""
    X, y = _problem()
    X[5] = 0.0  # an empty row
    m = _matrix(X, y)
    cols = np.array([0, 3, 7, 50], np.int64)
    x = np.array([1.5, -2.0, 0.0, 0.25])
    rowptr, at, vals = by_row(m.colptr, m.rows, m.values, X.shape[0], cols)
    dense = np.zeros((X.shape[0], cols.size))
    for i in range(X.shape[0]):
        assert list(at[rowptr[i]:rowptr[i + 1]]) == sorted(at[rowptr[i]:rowptr[i + 1]])  # the support's order
        dense[i, at[rowptr[i]:rowptr[i + 1]]] = vals[rowptr[i]:rowptr[i + 1]]
    np.testing.assert_array_equal(dense, X[:, cols])
    gram = np.full(cols.size, np.nan)
    _gram(rowptr, at, vals, x, gram)
    np.testing.assert_allclose(gram, X[:, cols].T @ (X[:, cols] @ x), rtol=1e-12, atol=1e-12)
    back = np.empty(cols.size)
    _columns_dot(m.colptr, m.rows, m.values, cols, y, back)
    np.testing.assert_allclose(back, X[:, cols].T @ y, rtol=1e-12)


@pytest.mark.parametrize("ratio", [5, 50])
def test_it_bounds_the_optimum_and_closes_the_gap_on_the_support(ratio):
    X, y = _problem()
    m = _matrix(X, y)
    lam = lambda_max(m) / ratio
    best = sklearn.Lasso(alpha=lam, fit_intercept=False, tol=1e-14, max_iter=1_000_000).fit(X, y).coef_
    optimum = objective(m, best, lam)
    # a point on the optimum's support and signs, but off it: the coefficients shrunk by a tenth
    w = 0.9 * best
    r = _residual(m.colptr, m.rows, m.values, m.y, w)
    xtr = _xtr(m.colptr, m.rows, m.values, r)
    primal, gap = duality_gap(m, w, r, xtr, lam)
    assert gap > 1e-3 * primal  # the scaled residual leaves a wide gap there
    dual = support_dual(m, w, -xtr / m.shape[0], lam, primal, 1e-12)
    assert dual <= optimum * (1 + 1e-12)  # a lower bound, always
    assert optimum - dual <= 1e-9 * optimum  # and a tight one: every non-zero meets its condition
    # from a point whose support is wrong it is still a lower bound, however loose
    rng = np.random.default_rng(1)
    wrong = rng.standard_normal(X.shape[1]) * (rng.random(X.shape[1]) < 0.2)
    r = _residual(m.colptr, m.rows, m.values, m.y, wrong)
    xtr = _xtr(m.colptr, m.rows, m.values, r)
    assert support_dual(m, wrong, -xtr / m.shape[0], lam, duality_gap(m, wrong, r, xtr, lam)[0],
                        1e-12) <= optimum * (1 + 1e-12)
    zeros = np.zeros(X.shape[1])
    assert support_dual(m, zeros, zeros, lam, 1.0, 1e-4) == -np.inf


@pytest.mark.parametrize("ratio", [50, 100])
def test_the_violators_at_zero_join_the_support(ratio):
    """A point whose smallest non-zeros the rounds have yet to move off zero: the support's
    dual point with those violators (signed against their gradient) is tight, where the
    non-zeros alone leave their columns infeasible and the bound loose."""
    X, y = _problem()
    m = _matrix(X, y)
    lam = lambda_max(m) / ratio
    best = sklearn.Lasso(alpha=lam, fit_intercept=False, tol=1e-14, max_iter=1_000_000).fit(X, y).coef_
    optimum = objective(m, best, lam)
    w = best.copy()
    late = np.flatnonzero(best)[np.argsort(np.abs(best[best != 0]))[:2]]  # the two smallest: the last to move
    w[late] = 0.0
    r = _residual(m.colptr, m.rows, m.values, m.y, w)
    grad = -_xtr(m.colptr, m.rows, m.values, r) / m.shape[0]
    assert (np.abs(grad[late]) > lam).all()
    primal = objective(m, w, lam)
    with_them = support_dual(m, w, grad, lam, primal, 1e-12)
    without = support_dual(m, w, np.zeros_like(grad), lam, primal, 1e-12)  # no gradient passes λ: the non-zeros only
    assert without <= with_them <= optimum * (1 + 1e-12)
    assert optimum - with_them <= 1e-9 * optimum
    assert optimum - without > 1e3 * (optimum - with_them)


def test_the_steps_stop_once_the_least_squares_are_solved():
    """On a support of a few columns conjugate gradients solve the least squares in as many
    steps; once the residual is below ``SOLVED`` of the right-hand side no more are taken
    (they only moved the point by rounding: a tenth of a second a check on news20)."""
    X, y = _problem()
    m = _matrix(X, y)
    cols = np.arange(12, dtype=np.int64)
    rhs = X[:, cols].T @ y
    rowwise = by_row(m.colptr, m.rows, m.values, X.shape[0], cols)
    x, res, p, ap = np.zeros(cols.size), np.empty(cols.size), np.empty(cols.size), np.empty(cols.size)
    solved = SOLVED * SOLVED * float(rhs @ rhs)
    rs, taken = _cg_steps(*rowwise, x, res, p, ap, _cg_start(*rowwise, rhs, x, res, p), 200, solved)
    assert rs <= solved and taken <= 3 * cols.size, taken  # 12 steps in exact arithmetic
    np.testing.assert_allclose(x, np.linalg.lstsq(X[:, cols], y, rcond=None)[0], rtol=1e-9)
    assert _cg_steps(*rowwise, x, res, p, ap, rs, 200, solved) == (rs, 0)


def test_a_check_tries_it_only_near_the_end_whatever_the_tolerance():
    assert worth_trying(2e-3, 1.0, 1e-4) and not worth_trying(4e-3, 1.0, 1e-4)  # 30 tol
    assert not worth_trying(5e-5, 1.0, 1e-4)  # certified already
    assert worth_trying(5e-3, 1.0, 0.001) and not worth_trying(0.02, 1.0, 0.001)  # never from past 1e-2
    assert not worth_trying(0.5, 1.0, 0.1)  # a loose tolerance does not make every check try
