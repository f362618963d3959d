"""A dual point for the Lasso's certificate from its support's own least squares.

Near the optimum of ``1/(2n)·‖y − Xw‖² + λ‖w‖₁`` the objective runs far ahead of its
certificate.  The duality gap's dual point is the residual scaled into the feasible set
``‖Xᵀθ‖∞ <= nλ``, so it loses what the worst column's ``|x_jᵀr|`` passes ``nλ`` by, and a
non-zero coefficient's ``|x_jᵀr|`` equals ``nλ`` only once every coordinate correlated with
it has settled: on news20 at λ_max/1000 the objective is within 9e-6 of the optimum at
round 32, when the non-zeros' ``|x_jᵀr|/n`` still spread from 0.63λ to 1.36λ and the gap
reads 0.12 of the objective; coordinate descent closes it no faster than the rounds do.

Once the support ``S`` and its signs ``s`` have settled, the optimum restricted to them
solves ``X_SᵀX_S·w_S = X_Sᵀy − nλ·s``, where every non-zero meets its condition exactly.
The support guessed is the non-zeros and the coordinates at zero that violate their
condition (``|x_jᵀr| > nλ``), each signed as its gradient pulls it: near the optimum the
rounds have yet to move the last few of those, and a support without them gives a dual
point their columns leave infeasible.  On news20 at λ_max/1000 (2 workers, the points
of the checks at rounds 32 and 40): 1.7e-2 and 4.7e-5 of the objective with the non-zeros
alone, 1.5e-3 and 2.0e-5 with the 18 and 2 violators; a point of another run of the
rounds at round 40 with 4 violators left, 4.2e-4 against 1.6e-5, below the tolerance's 1e-4.
Conjugate gradients on those normal equations, from the coefficients at hand (close to
the solution), reach in a few hundred products with ``X_S`` and ``X_Sᵀ`` what the rounds
reach in tens of rounds.  Their residual, scaled like any other, is a dual point: a lower
bound on the optimum whatever the support, so a wrong guess costs time, never
correctness.  The coefficients themselves are not taken: the certificate is for the
coefficients the rounds found.  Every worker computes it from the same point in the same
order, so all agree without a message (``coordinate.ScheduledCD._check``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from paramserver.apps.rounds.lasso_math import _residual, _xtr, dual_value
from paramserver.apps.rounds.lasso_pairs import by_row
from paramserver.apps.rounds.matrix import Matrix

#: try once the gap is within this many times the tolerance: 200 steps take it down 10-30x
#: where the support has settled (a try costs as much as 4-8 rounds on news20); and never
#: before it is within this share of the objective, whatever the tolerance (the support
#: still moves there: a try from 3e-2 at λ_max/2000 failed and gave back what it saved)
SUPPORT_AT, SUPPORT_FROM = 30, 1e-2
#: conjugate-gradient steps a check at most, and how often the dual point is looked at
STEPS, LOOK = 200, 25
#: the violators at zero join the support when they are at most this share of the non-zeros (or
#: this many): a support settled but for its last few.  Many violators mean a point far from the
#: optimum, where their signs and their place in the support are guesses (a point of the
#: optimum's support shrunk by a tenth, 18 violators beside 19 non-zeros: they made the bound
#: looser)
LATE_SHARE, LATE_FEW = 1 / 8, 2
#: the least squares solved once their residual is this small against the right-hand side:
#: further steps only move the point by rounding (news20 at λ_max/10, a support of 19
#: columns: 1e-12 at step 21, then 180 more steps at the same dual value, 0.12 s a check)
SOLVED = 1e-12


def worth_trying(gap: float, primal: float, tol: float) -> bool:
    """Whether a check with duality gap ``gap`` at objective ``primal`` tries the support's
    dual point: not yet certified to ``tol``, and near enough for 200 steps to finish it."""
    return tol * primal < gap <= min(SUPPORT_AT * tol, SUPPORT_FROM) * primal


@njit(nogil=True, cache=True)
def _columns_dot(colptr, rows, values, cols, u, out):  # type: ignore[no-untyped-def]
    """``out = X[:, cols]ᵀ @ u``."""
    for t in range(cols.shape[0]):
        j = cols[t]
        g = 0.0
        for k in range(np.uint64(colptr[j]), np.uint64(colptr[j + 1])):
            g += values[k] * u[np.uint64(rows[k])]
        out[t] = g


@njit(nogil=True, cache=True)
def _gram(rowptr, at, vals, x, out):  # type: ignore[no-untyped-def]
    """``out = X_SᵀX_S·x`` in one pass over ``X_S`` by row (``lasso_pairs.by_row`` of the
    support: ``at`` each entry's place in it): each row's
    ``x_i·x`` read from ``x`` and added back along the row into ``out``, both the support's
    length (in L1).  By column it took two passes, one a scatter into an ``n``-vector:
    1.2-1.3x the time on news20's 2 593-column support at λ_max/1 000.  The sums run in the
    same order as the two passes', so the products are the same to the bit."""
    out[:] = 0.0
    for i in range(rowptr.shape[0] - 1):
        d = 0.0
        for k in range(np.uint64(rowptr[i]), np.uint64(rowptr[i + 1])):
            d += vals[k] * x[np.uint64(at[k])]
        if d != 0.0:
            for k in range(np.uint64(rowptr[i]), np.uint64(rowptr[i + 1])):
                out[np.uint64(at[k])] += vals[k] * d


@njit(nogil=True, cache=True)
def _cg_start(rowptr, at, vals, rhs, x, res, p):  # type: ignore[no-untyped-def]
    """The residual ``res = rhs − X_SᵀX_S·x`` and the first direction ``p = res``; returns
    ``res·res``."""
    _gram(rowptr, at, vals, x, res)
    rs = 0.0
    for t in range(x.shape[0]):
        res[t] = rhs[t] - res[t]
        p[t] = res[t]
        rs += res[t] * res[t]
    return rs


@njit(nogil=True, cache=True)
def _cg_steps(rowptr, at, vals, x, res, p, ap, rs, steps, solved):  # type: ignore[no-untyped-def]
    """``steps`` conjugate-gradient steps on ``X_SᵀX_S·x = rhs`` (state ``res``, ``p``,
    ``rs`` from ``_cg_start`` or the last call), fewer once ``rs`` is at most ``solved``;
    returns the new ``rs`` and the steps taken."""
    taken = 0
    for _ in range(steps):
        if rs <= solved:
            break
        taken += 1
        _gram(rowptr, at, vals, p, ap)
        pap = 0.0
        for t in range(x.shape[0]):
            pap += p[t] * ap[t]
        if pap <= 0.0:
            break
        a = rs / pap
        new = 0.0
        for t in range(x.shape[0]):
            x[t] += a * p[t]
            res[t] -= a * ap[t]
            new += res[t] * res[t]
        beta = new / rs
        for t in range(x.shape[0]):
            p[t] = res[t] + beta * p[t]
        rs = new
    return rs, taken


def support_dual(m: Matrix, w: np.ndarray, grad: np.ndarray, lam: float, primal: float, tol: float) -> float:
    """The best dual value (a lower bound on the optimum) from the least squares of ``w``'s
    support and signs, with the coordinates at zero whose gradient ``grad`` passes ``λ``
    (signed against it) where they are few (``LATE_SHARE``), ``STEPS`` conjugate-gradient
    steps at most from ``w``; stops early once the gap to ``primal`` is below ``tol`` of it,
    or once the least squares are solved (``SOLVED``).  ``-inf`` without a support."""
    nonzero = w != 0
    late = ~nonzero & (np.abs(grad) > lam)
    if np.count_nonzero(late) > max(LATE_FEW, LATE_SHARE * np.count_nonzero(nonzero)):
        late[:] = False  # not a support that has settled but for its last few: the non-zeros alone
    cols = np.flatnonzero(nonzero | late)
    if not cols.size:
        return -np.inf
    n = m.shape[0]
    y = np.asarray(m.y, np.float64)
    rhs = np.empty(cols.size)
    _columns_dot(m.colptr, m.rows, m.values, cols, y, rhs)
    rhs -= n * lam * np.where(w[cols] != 0, np.sign(w[cols]), -np.sign(grad[cols]))
    x = w[cols].copy()
    res, p, ap = np.empty(cols.size), np.empty(cols.size), np.empty(cols.size)
    rowptr, at, vals = by_row(m.colptr, m.rows, m.values, n, cols.astype(np.int64))
    rs = _cg_start(rowptr, at, vals, rhs, x, res, p)
    solved = (SOLVED * SOLVED) * float(rhs @ rhs)
    best = -np.inf
    w2 = np.zeros_like(w)
    for _ in range(STEPS // LOOK):
        rs, _ = _cg_steps(rowptr, at, vals, x, res, p, ap, rs, LOOK, solved)
        w2[cols] = x
        r2 = _residual(m.colptr, m.rows, m.values, y, w2)
        best = max(best, dual_value(m, r2, _xtr(m.colptr, m.rows, m.values, r2), lam))
        if primal - best <= tol * primal or rs <= solved:
            break
    return best
