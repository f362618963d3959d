"""Exact steps on nearly collinear column pairs (``apps/lasso_pairs.py``): ``twins``
finds a planted near-duplicate column and no false one; ``pair_steps`` reaches the
two-variable Lasso's minimum, which plain coordinate descent only creeps towards, with
the residual kept exactly ``y − Xw``."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.apps.rounds.lasso_math import _cd
from paramserver.apps.rounds.lasso_pairs import by_row, pair_steps, twins


def _csc(X):
    colptr = np.zeros(X.shape[1] + 1, np.int64)
    rows, values = [], []
    for j in range(X.shape[1]):
        nz = np.flatnonzero(X[:, j])
        rows.append(nz)
        values.append(X[nz, j])
        colptr[j + 1] = colptr[j] + nz.size
    return colptr, np.concatenate(rows).astype(np.int64), np.concatenate(values)


def _data(c, seed=0, n=200, d=12, both=0.0):
    """Columns 3 and 7 with correlation about ``c`` (a shared part and a private one);
    ``both``: column 7's weight in y."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * (rng.random((n, d)) < 0.5)
    base = rng.standard_normal(n)
    X[:, 3] = base + np.sqrt(1 - c * c) / c * rng.standard_normal(n)
    X[:, 7] = -base if c < 0 else base
    y = X[:, 3] * 1.5 + both * X[:, 7] - X[:, 0] + 0.1 * rng.standard_normal(n)
    return X, y


def _objective(X, y, w, lam):
    return 0.5 * np.mean((y - X @ w) ** 2) + lam * np.abs(w).sum()


@pytest.mark.parametrize("row_type", [np.int64, np.int32])
def test_by_row_is_the_matrix_by_row_each_row_in_column_order(row_type):
    """The counting sort gives what a transpose gives: each row's entries, columns ascending;
    empty rows and columns (the first and last of each here) included."""
    sp = pytest.importorskip("scipy.sparse")
    rng = np.random.default_rng(3)
    X = rng.standard_normal((50, 30)) * (rng.random((50, 30)) < 0.2)
    X[0], X[-1], X[:, 0], X[:, -1] = 0.0, 0.0, 0.0, 0.0
    colptr, rows, values = _csc(X)
    rowptr, cols, by_value = by_row(colptr, rows.astype(row_type), values, X.shape[0])
    csr = sp.csr_matrix(X)
    csr.sort_indices()
    assert rowptr.tolist() == csr.indptr.tolist()
    assert cols.tolist() == csr.indices.tolist()
    assert np.array_equal(by_value, csr.data)


def test_twins_finds_the_planted_partner_and_no_other():
    X, _ = _data(0.999)
    colptr, rows, values = _csc(X)
    norm = np.sqrt((X * X).sum(0))
    found = twins(colptr, rows, values, *by_row(colptr, rows, values, X.shape[0]), norm,
                  np.array([3, 7, 0], np.int64), 0.95)
    assert found.tolist() == [7, 3, -1]
    cos = np.abs(X.T @ X) / np.outer(norm, norm)
    np.fill_diagonal(cos, 0)
    assert cos[0].max() < 0.95  # column 0 truly has no twin


@pytest.mark.parametrize("c,lam_frac,both", [(0.999, 0.05, 0.0), (0.9995, 0.2, 0.0), (-0.999, 0.05, 0.0),
                                            (0.97, 0.01, 0.0), (1.0, 0.05, 0.0), (0.999, 0.003, -2.0),
                                            (0.995, 0.001, 1.0)])
def test_pair_step_is_the_exact_minimum_coordinate_descent_creeps_to(c, lam_frac, both):
    X, y = _data(c, both=both)
    n = X.shape[0]
    colptr, rows, values = _csc(X)
    col_sq = (X * X).sum(0)
    lam = lam_frac * np.abs(X.T @ y).max() / n
    rng = np.random.default_rng(1)
    w = np.where(rng.random(X.shape[1]) < 0.5, rng.standard_normal(X.shape[1]), 0.0)
    w[3], w[7] = 0.3, -0.2  # far from the pair's optimum
    r = y - X @ w
    pair = (np.array([3], np.int64), np.array([7], np.int64))
    stepped_w, stepped_r = w.copy(), r.copy()
    pair_steps(colptr, rows, values, *pair, stepped_w, stepped_r, col_sq, n, lam, np.zeros(n))
    np.testing.assert_allclose(stepped_r, y - X @ stepped_w, atol=1e-12)
    assert np.array_equal(np.delete(stepped_w, [3, 7]), np.delete(w, [3, 7]))  # only the pair moves
    crept_w, crept_r = w.copy(), r.copy()  # coordinate descent on the two, for as long as it takes
    _cd(colptr, rows, values, np.array([3, 7], np.int64), crept_w, crept_r, col_sq, n, lam, 200_000)
    assert _objective(X, y, stepped_w, lam) <= _objective(X, y, crept_w, lam) + 1e-13
    if abs(c) < 1:  # a unique minimum: the same point
        np.testing.assert_allclose(stepped_w[[3, 7]], crept_w[[3, 7]], atol=1e-7)
    few_w, few_r = w.copy(), r.copy()  # what a few sweeps leave
    _cd(colptr, rows, values, np.array([3, 7], np.int64), few_w, few_r, col_sq, n, lam, 4)
    best, few = _objective(X, y, stepped_w, lam), _objective(X, y, few_w, lam)
    assert best <= few + 1e-14
    if both and abs(c) < 1:  # both non-zero at the minimum: a few sweeps are still far off, the step is there
        assert stepped_w[3] != 0 and stepped_w[7] != 0 and few - best > 1e-6 * best


def test_a_pair_at_its_minimum_does_not_move():
    X, y = _data(0.999)
    n = X.shape[0]
    colptr, rows, values = _csc(X)
    col_sq = (X * X).sum(0)
    lam = 0.05 * np.abs(X.T @ y).max() / n
    w = np.zeros(X.shape[1])
    r = y.copy()
    pair = (np.array([3], np.int64), np.array([7], np.int64))
    pair_steps(colptr, rows, values, *pair, w, r, col_sq, n, lam, np.zeros(n))
    again_w, again_r = w.copy(), r.copy()
    assert pair_steps(colptr, rows, values, *pair, again_w, again_r, col_sq, n, lam, np.zeros(n)) == 0
    assert np.array_equal(again_w, w) and np.array_equal(again_r, r)


def _text_like(seed, n=300, d=120):
    """Word-count-like columns: a few frequent ones (in most rows), many rare ones; twins
    planted at several correlations (a noisy copy of a frequent column, an exact copy,
    a negated copy) and near misses just under 0.95."""
    rng = np.random.default_rng(seed)
    share = np.r_[rng.uniform(0.5, 0.95, 8), rng.uniform(0.01, 0.2, d - 8)]
    X = rng.exponential(1.0, (n, d)) * (rng.random((n, d)) < share)
    for src, dst, noise in ((0, 40, 0.05), (1, 41, 0.0), (2, 42, 0.3), (3, 43, 0.25), (50, 44, 0.02)):
        X[:, dst] = X[:, src] * (1 + noise * rng.standard_normal(n)) * (X[:, src] != 0)
    X[:, 45] = -X[:, 4]
    X[:, 46] = X[:, 1]  # a second exact copy: ties, broken by the order the rows meet them
    return X


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("threshold", [0.95, 0.8, 0.3, 0.0])
def test_twins_sieved_are_the_twins_walked_to_the_bit(seed, threshold):
    """A frequent column's candidates sieved by the mass of its heaviest rows, then exact
    products for the few left: the same twin as walking every row of the column, ties and
    negative correlations included, and each one truly above the threshold and the most
    correlated (cosines from the dense matrix)."""
    X = _text_like(seed)
    colptr, rows, values = _csc(X)
    norm = np.sqrt((X * X).sum(0))
    cand = np.arange(X.shape[1], dtype=np.int64)
    rowwise = by_row(colptr, rows, values, X.shape[0])
    sieved = twins(colptr, rows, values, *rowwise, norm, cand, threshold, 0)
    walked = twins(colptr, rows, values, *rowwise, norm, cand, threshold, 1 << 60)
    assert sieved.tolist() == walked.tolist()
    cos = np.abs(X.T @ X) / np.outer(np.maximum(norm, 1e-300), np.maximum(norm, 1e-300))
    np.fill_diagonal(cos, -1.0)
    for j, k in enumerate(sieved):
        if k < 0:
            assert cos[j].max() <= threshold + 1e-12, (j, cos[j].max())
        else:
            assert cos[j, k] > threshold and cos[j, k] >= cos[j].max() - 1e-12, (j, k)
    if threshold == 0.95:  # the planted pairs are found, both ways
        for a, b in ((0, 40), (1, 41), (4, 45), (50, 44)):
            assert sieved[a] in (b, 46) if a == 1 else sieved[a] == b, (a, sieved[a])
