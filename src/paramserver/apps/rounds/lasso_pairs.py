"""Exact steps on pairs of nearly collinear columns, for ``paramserver lasso``.

Coordinate descent creeps along two columns whose correlation c is close to 1: a sweep
moves the pair only 1 − c² of the way to its optimum.  news20 has such pairs (0.9997:
6e-4 a sweep), and at λ_max/2000 one of them held the duality gap at 1e-2 of the
objective for half the run while the objective was within 1e-6 of the optimum.  The
fix is to solve the pair's two-variable Lasso exactly: ``twins`` finds each candidate's
most correlated column (through the data by row), ``pair_steps`` minimises over both
coefficients at once (every sign pattern, the best taken).
"""

from __future__ import annotations

import numpy as np
from numba import njit


def by_row(colptr: np.ndarray, rows: np.ndarray, values: np.ndarray, n_rows: int,
           columns: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSC data by row: (rowptr, cols, values), each row's entries in column order.
    With ``columns`` (int64), only those columns, and each entry's column given as its
    place in ``columns`` (the Lasso's support, ``lasso_support``).

    A counting sort in one pass over the entries (a stable argsort of the row indices took
    0.1-0.34 s of a news20 worker's start-up, more than its first rounds)."""
    rowptr = np.zeros(n_rows + 1, np.int64)
    if columns is None:
        columns = np.arange(colptr.shape[0] - 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=n_rows), out=rowptr[1:])
    else:
        _count_rows(colptr, rows, columns, rowptr[1:])
        np.cumsum(rowptr, out=rowptr)
    cols, out = np.empty(rowptr[-1], np.int64), np.empty(rowptr[-1], values.dtype)
    _scatter_rows(colptr, rows, values, columns, rowptr[:-1].copy(), cols, out)
    return rowptr, cols, out


@njit(nogil=True, cache=True)
def _count_rows(colptr, rows, columns, counts):  # type: ignore[no-untyped-def]
    """Each row's entries among ``columns``, added to ``counts``."""
    for j in columns:
        for p in range(colptr[j], colptr[j + 1]):
            counts[rows[p]] += 1


@njit(nogil=True, cache=True)
def _scatter_rows(colptr, rows, values, columns, at, cols, out):  # type: ignore[no-untyped-def]
    """Each entry of ``columns`` to the next place of its row (``at``: each row's next place),
    column by column, its column given as its place in ``columns``."""
    for t in range(columns.shape[0]):
        j = columns[t]
        for p in range(colptr[j], colptr[j + 1]):
            q = at[rows[p]]
            at[rows[p]] = q + 1
            cols[q] = t
            out[q] = values[p]


#: a column whose rows hold fewer entries than this is walked whole (``_walk``), a larger one
#: sieved (``_sieve``) over its heaviest rows until they hold this share of its squared norm
WALK_BELOW, SIEVE_SHARE = 100_000, 0.5


@njit(nogil=True, cache=True)
def twins(colptr, rows, values, rowptr, cols, rvalues, col_norm, cand, threshold,  # type: ignore[no-untyped-def]
          walk_below=WALK_BELOW):
    """For each column of ``cand``: the other column most correlated with it (|cosine|),
    if above ``threshold``, else -1 (of equals, the one met first through the column's rows).

    A column whose rows are short is walked whole, every column met on them summed
    (``_walk``).  A frequent one's rows held 10^5-10^6 entries on news20 (1-3 ms a
    column, 64 columns a check), so its candidates are sieved first (``_sieve``), and
    only the few left get an exact product (``_twin_dot``): the same twins, to the bit.
    ``walk_below``: the entries under which a column is walked (``WALK_BELOW``)."""
    d = colptr.shape[0] - 1
    peak = np.zeros(0)  # each column's largest squared entry, once a column is sieved
    state = np.zeros(d, np.int64)  # a column's state for the column at hand: 0 unmet, 1 a candidate, 2 out
    acc = np.zeros(d)
    seen = np.empty(d, np.int64)
    at = np.full(rowptr.shape[0] - 1, -1, np.int64)  # a row's first entry in the column at hand
    out = np.full(cand.shape[0], -1, np.int64)
    for t in range(cand.shape[0]):
        j = cand[t]
        lo, hi = colptr[j], colptr[j + 1]
        if hi == lo or col_norm[j] == 0.0:
            continue
        cost = 0
        for p in range(lo, hi):
            cost += rowptr[rows[p] + 1] - rowptr[rows[p]]
        if cost < walk_below or threshold <= 0.0:  # (at or below 0 the sieve's bound rules nothing out)
            out[t] = _walk(j, lo, hi, rows, values, rowptr, cols, rvalues, col_norm, threshold, acc, state, seen)
            continue
        if peak.shape[0] == 0:
            peak = _peaks(colptr, values)
        listed = _sieve(values, rows, lo, hi, rowptr, cols, threshold, state, acc, seen)
        for p in range(hi - 1, lo - 1, -1):
            at[rows[p]] = p
        best, first = threshold, hi
        for s in range(listed):
            k = seen[s]
            if state[k] == 1 and k != j and col_norm[k] > 0.0 and _may_twin(j, k, colptr, peak, col_norm, threshold):
                dot, p = _twin_dot(colptr, rows, values, at, hi, k)
                c = abs(dot) / (col_norm[j] * col_norm[k])
                if c > best or (c == best and out[t] >= 0 and (p < first or (p == first and k < out[t]))):
                    best, first, out[t] = c, p, k
            state[k] = 0
        for p in range(lo, hi):
            at[rows[p]] = -1
    return out


@njit(nogil=True, cache=True)
def _peaks(colptr, values):  # type: ignore[no-untyped-def]
    """Each column's largest squared entry (``_may_twin``)."""
    peak = np.zeros(colptr.shape[0] - 1)
    for k in range(peak.shape[0]):
        for r in range(colptr[k], colptr[k + 1]):
            peak[k] = max(peak[k], values[r] * values[r])
    return peak


@njit(nogil=True, cache=True)
def _walk(j, lo, hi, rows, values, rowptr, cols, rvalues, col_norm, threshold,  # type: ignore[no-untyped-def]
          acc, state, seen):
    """Column ``j`` (entries ``lo:hi``) against every column its rows meet, each product
    summed in ``acc``: the most correlated above ``threshold``, or -1."""
    listed = 0
    for p in range(np.uint64(lo), np.uint64(hi)):  # unsigned indices: as ``lasso_math._cd``
        i, v = np.uint64(rows[p]), values[p]
        for q in range(np.uint64(rowptr[i]), np.uint64(rowptr[i + np.uint64(1)])):
            k = np.uint64(cols[q])
            if state[k] == 0:
                state[k] = 1
                acc[k] = 0.0
                seen[listed] = k
                listed += 1
            acc[k] += v * rvalues[q]
    best, out = threshold, -1
    for s in range(listed):
        k = seen[s]
        if k != j and col_norm[k] > 0.0:
            c = abs(acc[k]) / (col_norm[j] * col_norm[k])
            if c > best:
                best, out = c, k
        state[k] = 0
    return out


@njit(nogil=True, cache=True)
def _sieve(values, rows, lo, hi, rowptr, cols, threshold, state, hit, seen):  # type: ignore[no-untyped-def]
    """The candidates for twin of a column (entries ``lo:hi``, squared norm ``M``): its rows
    are read heaviest first, each column met summing in ``hit`` the squares of the rows it
    meets.  A column that misses rows holding more than ``(1 − threshold²)·M`` correlates
    below ``threshold`` (``|x_jᵀx_k| ≤ ‖x_j‖ on k's rows · ‖x_k‖``): it is out (``state``
    2), and a column first met past that much mass is not listed at all.  Stops once the
    rows read hold ``SIEVE_SHARE`` of ``M``.  Returns how many were listed in ``seen``
    (``state`` 1: still a candidate)."""
    sq = values[lo:hi] * values[lo:hi]
    total = sq.sum()
    need = (1.0 - threshold * threshold) * total * (1.0 + 1e-6)  # a margin far above rounding
    order = np.argsort(-sq)
    listed, done = 0, 0.0
    for e in range(order.shape[0]):
        if done > need and done >= SIEVE_SHARE * total:
            break
        w, i = sq[order[e]], rows[lo + order[e]]
        for r in range(rowptr[i], rowptr[i + 1]):
            k = cols[r]
            if state[k] == 0:
                if done > need:
                    continue  # it missed too much already
                state[k] = 1
                hit[k] = 0.0
                seen[listed] = k
                listed += 1
            hit[k] += w
        done += w
    for s in range(listed):
        if done - hit[seen[s]] > need:
            state[seen[s]] = 2
    return listed


@njit(inline="always", nogil=True, cache=True)
def _may_twin(j, k, colptr, peak, col_norm, threshold):  # type: ignore[no-untyped-def]
    """Whether each of columns ``j`` and ``k`` can hold more than ``threshold²`` of its squared
    norm on rows the other has: at most its largest squared entry on each of the other's
    rows (a rare column cannot twin a frequent one whose mass is spread)."""
    bound = threshold * threshold * (1.0 - 1e-6)  # (``threshold`` > 0) a margin far above rounding
    return ((colptr[k + 1] - colptr[k]) * peak[j] > bound * col_norm[j] * col_norm[j]
            and (colptr[j + 1] - colptr[j]) * peak[k] > bound * col_norm[k] * col_norm[k])


@njit(nogil=True, cache=True)
def _twin_dot(colptr, rows, values, at, end, k):  # type: ignore[no-untyped-def]
    """``x_jᵀx_k`` for column ``k``, column ``j``'s rows marked in ``at`` (each one's first
    entry; ``end``: where ``j``'s entries end), summed in row order as ``_walk`` would; and
    the first entry of ``j`` whose row ``k`` meets (the order ``_walk`` meets ``k`` in)."""
    dot, first = 0.0, -1
    for r in range(colptr[k], colptr[k + 1]):
        p = at[rows[r]]
        if p >= 0:
            if first < 0:
                first = p
            while p < end and rows[p] == rows[r]:
                dot += values[p] * values[r]
                p += 1
    return dot, first


@njit(nogil=True, cache=True)
def _objective2(A, B, C, pj, pk, lam, u, v):  # type: ignore[no-untyped-def]
    return 0.5 * (A * u * u + 2.0 * C * u * v + B * v * v) - pj * u - pk * v + lam * (abs(u) + abs(v))


@njit(inline="always", nogil=True, cache=True)
def _pair_products(colptr, rows, values, j, k, r, scratch):  # type: ignore[no-untyped-def]
    """``x_jᵀr``, ``x_kᵀr`` and ``x_jᵀx_k`` (``scratch``: n zeros, left zero), the columns read
    at unsigned indices, as ``lasso_math._cd`` reads them."""
    xr_j = 0.0
    for p in range(np.uint64(colptr[j]), np.uint64(colptr[j + 1])):
        i = np.uint64(rows[p])
        scratch[i] = values[p]
        xr_j += values[p] * r[i]
    xr_k, xjk = 0.0, 0.0
    for p in range(np.uint64(colptr[k]), np.uint64(colptr[k + 1])):
        i = np.uint64(rows[p])
        xr_k += values[p] * r[i]
        xjk += values[p] * scratch[i]
    for p in range(np.uint64(colptr[j]), np.uint64(colptr[j + 1])):
        scratch[np.uint64(rows[p])] = 0.0
    return xr_j, xr_k, xjk


@njit(nogil=True, cache=True)
def pair_steps(colptr, rows, values, first, second, w, r, col_sq, n, lam, scratch):  # type: ignore[no-untyped-def]  # noqa: C901  (a numba byte loop)
    """For each pair (first[t], second[t]) in turn: the exact minimum of the objective
    over those two coefficients, the others fixed; ``w`` and the residual ``r`` updated
    in place (``scratch``: n zeros, left zero).  Returns the coefficients changed."""
    changed = 0
    for t in range(first.shape[0]):
        j, k = first[t], second[t]
        if j == k or col_sq[j] == 0.0 or col_sq[k] == 0.0:
            continue
        xr_j, xr_k, xjk = _pair_products(colptr, rows, values, j, k, r, scratch)
        a, b = w[j], w[k]
        A, B, C = col_sq[j] / n, col_sq[k] / n, xjk / n
        # the pair's part of the objective is ½[u v]G[u v]ᵀ − p·[u v] + λ(|u| + |v|) + const
        pj = xr_j / n + A * a + C * b
        pk = xr_k / n + B * b + C * a
        best_u, best_v = 0.0, 0.0
        best = 0.0  # the objective's pair part at (0, 0)
        u = (pj - lam) / A if pj > lam else ((pj + lam) / A if pj < -lam else 0.0)  # v = 0
        f = _objective2(A, B, C, pj, pk, lam, u, 0.0)
        if f < best:
            best, best_u, best_v = f, u, 0.0
        v = (pk - lam) / B if pk > lam else ((pk + lam) / B if pk < -lam else 0.0)  # u = 0
        f = _objective2(A, B, C, pj, pk, lam, 0.0, v)
        if f < best:
            best, best_u, best_v = f, 0.0, v
        det = A * B - C * C
        if det > 1e-12 * A * B:  # both non-zero, each sign pattern: G[u v] = p − λ[su sv]
            for su in (-1.0, 1.0):
                for sv in (-1.0, 1.0):
                    qj, qk = pj - lam * su, pk - lam * sv
                    u = (B * qj - C * qk) / det
                    v = (A * qk - C * qj) / det
                    if u * su > 0.0 and v * sv > 0.0:
                        f = _objective2(A, B, C, pj, pk, lam, u, v)
                        if f < best:
                            best, best_u, best_v = f, u, v
        # keep the current point unless the step is strictly better (ties: no move)
        if best < _objective2(A, B, C, pj, pk, lam, a, b):
            du, dv = best_u - a, best_v - b
            if du != 0.0:
                for p in range(np.uint64(colptr[j]), np.uint64(colptr[j + 1])):
                    r[np.uint64(rows[p])] -= du * values[p]
                w[j] = best_u
                changed += 1
            if dv != 0.0:
                for p in range(np.uint64(colptr[k]), np.uint64(colptr[k + 1])):
                    r[np.uint64(rows[p])] -= dv * values[p]
                w[k] = best_v
                changed += 1
    return changed
