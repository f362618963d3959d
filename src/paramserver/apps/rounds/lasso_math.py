"""The Lasso's arithmetic on a worker's own data (no server in it), for
``paramserver lasso`` (``paramserver.apps.rounds.lasso``): coordinate descent over a CSC
matrix and the residual kept in step with it, the dealing of coordinates to workers
with the interference check, and the certificate of optimality, the duality gap
(with celer's dual extrapolation for a tighter dual point).

The numba kernels take the matrix's arrays (``colptr``, ``rows``, ``values``) rather than
the ``Matrix``, and update ``w`` and the residual in place.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from paramserver.apps.rounds.matrix import Matrix

#: ``_cd``'s shrinking: a coordinate that a sweep left at zero rests until every this many sweeps
#: (and the last), when it is tried again
REVISIT = 8


@njit(nogil=True, cache=True)
def _cd(colptr, rows, values, coords, w, r, col_sq, n, lam, sweeps):  # type: ignore[no-untyped-def]
    """``sweeps`` passes of coordinate descent over ``coords`` in order, updating ``w``
    and the residual ``r`` in place.

    Shrinking, as liblinear's and glmnet's solvers do: a coordinate at zero that a sweep
    (after the first) leaves at zero meets its optimality condition ``|x_jᵀr| <= nλ`` at
    that point, and the next sweeps skip it (its column's product with the residual is
    most of a step's cost) until a sweep of every ``REVISIT``-th and the last try it again;
    one that moves then is swept again.  A round's working set is mostly such zeros (the
    non-zeros and as many violators again): on news20 with 2 workers at λ_max/2000 the
    rounds' sweeps took 19-24 ms a round against 30, and 96 rounds against 112, to the same
    optimum.

    A column's entries are walked at unsigned indices (``np.uint64``), as the Lasso's and
    L1-LR's other column loops walk them: numba adds an array's length to a signed index it cannot prove
    non-negative, a select on every read of ``values``, ``rows`` and ``r`` (news20's 6 000
    most correlated columns at λ_max/1 000, 16 sweeps, the two in turn: 52.5 -> 34.4 ms, the
    same ``w`` and ``r`` to the bit)."""
    resting = np.zeros(coords.shape[0], np.bool_)
    for s in range(sweeps):
        wake = s % REVISIT == REVISIT - 1 or s == sweeps - 1
        for t in range(coords.shape[0]):
            if resting[t] and not wake:
                continue
            j = coords[t]
            a = col_sq[j]
            if a == 0.0:
                continue
            g = 0.0
            for k in range(np.uint64(colptr[j]), np.uint64(colptr[j + 1])):
                g += values[k] * r[np.uint64(rows[k])]
            z = w[j] + g / a
            thr = n * lam / a
            new = z - thr if z > thr else (z + thr if z < -thr else 0.0)
            d = new - w[j]
            if d != 0.0:
                for k in range(np.uint64(colptr[j]), np.uint64(colptr[j + 1])):
                    r[np.uint64(rows[k])] -= d * values[k]
                w[j] = new
                resting[t] = False
            elif new == 0.0 and s > 0:
                resting[t] = True


@njit(nogil=True, cache=True)
def _apply(colptr, rows, values, coords, delta, r):  # type: ignore[no-untyped-def]
    """``r -= X[:, coords] @ delta``."""
    for t in range(coords.shape[0]):
        d = delta[t]
        if d != 0.0:
            j = coords[t]
            for k in range(np.uint64(colptr[j]), np.uint64(colptr[j + 1])):
                r[np.uint64(rows[k])] -= d * values[k]


@njit(nogil=True, cache=True)
def _xtr(colptr, rows, values, r):  # type: ignore[no-untyped-def]
    out = np.empty(colptr.shape[0] - 1)
    for j in range(out.shape[0]):
        g = 0.0
        for k in range(np.uint64(colptr[j]), np.uint64(colptr[j + 1])):
            g += values[k] * r[np.uint64(rows[k])]
        out[j] = g
    return out


@njit(nogil=True, cache=True)
def _residual(colptr, rows, values, y, w):  # type: ignore[no-untyped-def]
    r = y.copy()
    for j in range(w.shape[0]):
        if w[j] != 0.0:
            for k in range(np.uint64(colptr[j]), np.uint64(colptr[j + 1])):
                r[np.uint64(rows[k])] -= w[j] * values[k]
    return r


@njit(inline="always", nogil=True, cache=True)
def _correlations(rows, values, lo, hi, acc, c):  # type: ignore[no-untyped-def]
    """``c[q]`` = Σ |x_k| · ``acc[k, q]`` over the non-zeros ``lo:hi`` of a column (two
    workers, the common case, in two registers)."""
    if c.shape[0] == 2:
        c0 = c1 = 0.0
        for k in range(np.uint64(lo), np.uint64(hi)):
            a, i = abs(values[k]), np.uint64(rows[k])
            c0 += a * acc[i, 0]
            c1 += a * acc[i, 1]
        c[0], c[1] = c0, c1
        return
    c[:] = 0.0
    for k in range(np.uint64(lo), np.uint64(hi)):
        a, i = abs(values[k]), np.uint64(rows[k])
        for q in range(c.shape[0]):
            c[q] += a * acc[i, q]


@njit(nogil=True, cache=True)
def _deal(colptr, rows, values, col_norm, candidates, workers, cap, rho, acc):  # type: ignore[no-untyped-def]
    """Deal ``candidates`` (in priority order) to ``workers``: each to the worker whose
    coordinates it correlates with most, at most ``cap`` a worker, none whose mean
    |correlation| with the other workers' coordinates passes ``rho``; between workers it
    correlates with alike (the uncorrelated), the one whose columns have the fewest
    non-zeros so far (a round lasts as long as its busiest worker's sweeps, whose cost
    goes by the non-zeros, not by the coordinates).
    ``acc[:, q]`` (zeros on entry and on exit) sums |x_k| / ‖x_k‖ over worker q's
    coordinates (a row per example, so one pass over a column reads every worker's sum).
    Returns the worker of each candidate, -1 for those left out."""
    owner = np.full(candidates.shape[0], -1, np.int64)
    load = np.zeros(workers, np.int64)
    work = np.zeros(workers, np.int64)  # the non-zeros of each worker's columns: what its sweeps cost
    c = np.zeros(workers)
    for t in range(candidates.shape[0]):
        j = candidates[t]
        if col_norm[j] == 0.0:
            continue
        lo, hi = colptr[j], colptr[j + 1]
        _correlations(rows, values, lo, hi, acc, c)
        total = 0.0
        for q in range(workers):
            c[q] /= col_norm[j]
            total += c[q]
        best = -1
        placed = load.sum()
        for q in range(workers):
            others = placed - load[q]
            if load[q] < cap and total - c[q] <= rho * max(others, 1) and (
                    best < 0 or c[q] > c[best] or (c[q] == c[best] and work[q] < work[best])):
                best = q
        if best < 0:
            continue
        owner[t] = best
        load[best] += 1
        work[best] += hi - lo
        for k in range(np.uint64(lo), np.uint64(hi)):
            acc[np.uint64(rows[k]), best] += abs(values[k]) / col_norm[j]
    acc[:] = 0.0  # leave acc as it came: zeros (one pass over it, not over the dealt columns again)
    return owner


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` largest ``values``, largest first (ties: lower index
    first), without sorting them all."""
    k = min(k, values.size)
    if k <= 0:
        return np.zeros(0, np.int64)
    if k < values.size:  # every index tied with the k-th largest stays in, so that ties go by index
        kth = values[np.argpartition(-values, k - 1)[k - 1]]
        part = np.flatnonzero(values >= kth)
    else:
        part = np.arange(values.size)
    return part[np.lexsort((part, -values[part]))][:k]


def objective(m: Matrix, w: np.ndarray, lam: float) -> float:
    """``1/(2n)·‖y − Xw‖² + λ‖w‖₁``."""
    r = _residual(m.colptr, m.rows, m.values, m.y, np.asarray(w, np.float64))
    return float(r @ r / (2 * m.shape[0]) + lam * np.abs(w).sum())


def lambda_max(m: Matrix) -> float:
    """The smallest λ at which every coefficient is zero: ``‖Xᵀy‖∞ / n``."""
    return float(np.abs(_xtr(m.colptr, m.rows, m.values, m.y)).max() / m.shape[0])


def dual_value(m: Matrix, v: np.ndarray, g: np.ndarray, lam: float) -> float:
    """The dual objective at ``v`` (a residual, or an extrapolated one; ``g = Xᵀv``)
    scaled into the dual's feasible set ``‖Xᵀθ‖∞ <= nλ``: a lower bound on the optimum."""
    n = m.shape[0]
    scale = min(1.0, n * lam / max(float(np.abs(g).max()), 1e-300))
    return float((v @ m.y) * scale / n - (scale * scale) * (v @ v) / (2 * n))


def duality_gap(m: Matrix, w: np.ndarray, r: np.ndarray, g: np.ndarray, lam: float) -> tuple[float, float]:
    """``(primal, gap)`` at ``w`` with residual ``r`` and ``g = Xᵀr``: the dual point is
    ``r`` scaled into the dual's feasible set."""
    primal = float(r @ r / (2 * m.shape[0]) + lam * np.abs(w).sum())
    return primal, max(primal - dual_value(m, r, g, lam), 0.0)


def extrapolated(residuals: list[np.ndarray]) -> np.ndarray | None:
    """celer's dual extrapolation: the affine combination of the last residuals that an
    Anderson step takes them to (``Σ c_k r_k``, ``Σ c_k = 1``, ``c`` minimising the
    combination of their differences); None if the system is singular."""
    if len(residuals) < 3:
        return None
    diffs = np.diff(np.stack(residuals), axis=0)
    gram = diffs @ diffs.T
    try:
        z = np.linalg.solve(gram + 1e-12 * np.trace(gram) * np.eye(gram.shape[0]), np.ones(gram.shape[0]))
    except np.linalg.LinAlgError:
        return None
    if not np.isfinite(z).all() or abs(z.sum()) < 1e-300:
        return None
    c = z / z.sum()
    return np.asarray(c @ np.stack(residuals[1:]), np.float64)
