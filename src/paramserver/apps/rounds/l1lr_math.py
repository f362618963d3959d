"""L1-regularised logistic regression's arithmetic on a worker's own data (no server in
it), for ``paramserver lasso --loss logistic`` (``l1lr``):

    F(w) = (1/n)·Σ log(1 + exp(−y_i x_iᵀw)) + λ‖w‖₁,   y_i = ±1.

A worker keeps the margin ``z = Xw``.  A worker's block of coordinates takes proximal
Newton steps, newGLMNET's (Yuan, Ho and Lin 2012, liblinear's L1 solver): the loss's
quadratic model at ``z`` (one ``exp`` a row), coordinate descent on that model
(multiply-adds only), then an Armijo line search on ``F`` itself along the block's
direction, halving the step until ``F`` falls by 1% of what the model promised.  Against
CDN's steps one coordinate at a time (an ``exp`` a row for each step, and an ``expm1`` and
a ``log1p`` for each trial), the transcendental work is a few passes a round instead of
one a coordinate step.  Each coordinate's part of a step is bounded (``STEP``): where a
column's rows are all classified with great confidence, its curvature vanishes and the
model's step would be unbounded.

The certificate is the duality gap: the dual of ``F`` is ``max (1/n)·Σ H(α_i)`` over
``α ∈ [0, 1]ⁿ`` with ``‖Xᵀ(α∘y)‖∞ <= nλ`` (``H`` the binary entropy); the dual point is
``α_i = σ(−y_i z_i)`` scaled into the feasible set.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from paramserver.apps.rounds.lasso_math import _xtr
from paramserver.apps.rounds.matrix import Matrix

SIGMA, HALVINGS = 0.01, 40  # Armijo: the fraction of the model's decrease to get, and the most halvings
STEP = 4.0  # the trust region: a Newton step moves no row's margin by more than this through one coordinate
INNER, INNER_SHARE = 10, 0.1  # a Newton step's passes on its model at most; done once a pass moves < this share


@njit(nogil=True, cache=True)
def _prox(g, h, wj, lam):  # type: ignore[no-untyped-def]
    """The step ``d`` minimising ``g·d + h·d²/2 + λ|wj + d|``."""
    if g + lam <= h * wj:
        return -(g + lam) / h
    if g - lam >= h * wj:
        return -(g - lam) / h
    return -wj


@njit(nogil=True, cache=True)
def _model(colptr, rows, values, y, z, coords, w, n, lam, g, h, mark, touched, tau, dee):  # type: ignore[no-untyped-def]
    """The loss's quadratic model at ``z`` on ``coords``: each coordinate's gradient ``g`` and
    curvature ``h``, in one pass that also lists the rows the block touches, each once, in
    ``touched`` with ``tau_i = σ(−y_i z_i)`` and ``dee_i = tau_i(1 − tau_i)`` (``mark`` is left
    clear).  Returns how many rows, and the largest ``h·|d|`` of a coordinate's own proximal
    Newton step: how far it is from its optimality condition."""
    count, worst = 0, 0.0
    for t in range(coords.shape[0]):
        j = coords[t]
        gj, hj = 0.0, 0.0
        for k in range(np.uint64(colptr[j]), np.uint64(colptr[j + 1])):
            i = np.uint64(rows[k])
            if not mark[i]:
                mark[i] = True
                touched[count] = i
                count += 1
                a = 1.0 / (1.0 + math.exp(y[i] * z[i]))
                tau[i] = a
                dee[i] = a * (1.0 - a)
            gj -= values[k] * y[i] * tau[i]
            hj += values[k] * values[k] * dee[i]
        g[t] = gj / n
        h[t] = max(hj / n, 1e-12)
        if colptr[j + 1] > colptr[j]:
            worst = max(worst, h[t] * abs(_prox(g[t], h[t], w[j], lam)))
    for c in range(count):
        mark[touched[c]] = False
    return count, worst


@njit(nogil=True, cache=True)
def _inner(colptr, rows, values, coords, w, n, lam, dee, g, h, d, dz, passes, stop, cap):  # type: ignore[no-untyped-def]
    """Coordinate descent on the quadratic model from ``d = 0``, each ``|d_j|`` at most
    ``cap[j]`` (a trust region): the direction ``d`` and its margin change ``dz = X d`` (zero
    on entry), until a pass moves no coordinate by more than ``stop`` (as ``h·|step|``) or
    after ``passes``."""
    for _ in range(passes):
        worst = 0.0
        for t in range(coords.shape[0]):
            j = coords[t]
            if colptr[j + 1] == colptr[j]:
                continue
            acc = 0.0
            for k in range(np.uint64(colptr[j]), np.uint64(colptr[j + 1])):
                i = np.uint64(rows[k])
                acc += values[k] * dee[i] * dz[i]
            step = _prox(g[t] + acc / n, h[t], w[j] + d[t], lam)
            step = min(max(d[t] + step, -cap[j]), cap[j]) - d[t]
            if step != 0.0:
                d[t] += step
                for k in range(np.uint64(colptr[j]), np.uint64(colptr[j + 1])):
                    dz[np.uint64(rows[k])] += step * values[k]
                worst = max(worst, h[t] * abs(step))
        if worst < stop:
            return


@njit(nogil=True, cache=True)
def _softplus(x):  # type: ignore[no-untyped-def]
    """``log(1 + e^x)`` without overflow."""
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


@njit(nogil=True, cache=True)
def _loss_change(u, tau, delta):  # type: ignore[no-untyped-def]
    """``log(1 + e^(−u−δ)) − log(1 + e^(−u))`` (``tau = σ(−u)``): ``log1p(τ·expm1(−δ))``, one
    ``expm1`` and one ``log1p``, exact to rounding while ``1 + τ·expm1(−δ)`` is not near 0; the
    two terms apart where it is (``τ`` rounded to 1 would read a loss below zero: a step
    through a badly misclassified row would look far better than it is) or where it
    overflows."""
    v = tau * math.expm1(-delta)
    if -0.5 < v < math.inf:
        return math.log1p(v)
    return _softplus(-u - delta) - _softplus(-u)


@njit(nogil=True, cache=True)
def _l1_change(wj, step):  # type: ignore[no-untyped-def]
    """``|wj + step| − |wj|``, without cancelling where the sign stays: near the optimum the
    model's promise is the small sum of a gradient's and the penalty's nearly opposite parts."""
    if wj > 0.0 and wj + step >= 0.0:
        return step
    if wj < 0.0 and wj + step <= 0.0:
        return -step
    return abs(wj + step) - abs(wj)


@njit(nogil=True, cache=True)
def _search(y, coords, w, z, n, lam, tau, g, d, dz, touched, count):  # type: ignore[no-untyped-def]
    """Armijo's line search on ``F`` along ``d`` (margin change ``dz``), halving the step until
    ``F`` falls by ``SIGMA`` of what the model promised (``_loss_change`` a row a trial);
    ``w`` and ``z`` moved in place.  Returns whether a step was taken."""
    promised = 0.0
    for t in range(coords.shape[0]):
        promised += g[t] * d[t] + lam * _l1_change(w[coords[t]], d[t])
    beta = 1.0
    for _ in range(HALVINGS):
        change = 0.0
        for c in range(count):
            i = touched[c]
            if dz[i] != 0.0:
                change += _loss_change(y[i] * z[i], tau[i], y[i] * beta * dz[i])
        l1 = 0.0
        for t in range(coords.shape[0]):
            l1 += _l1_change(w[coords[t]], beta * d[t])
        if change / n + lam * l1 <= SIGMA * beta * promised:
            for c in range(count):
                z[touched[c]] += beta * dz[touched[c]]
            for t in range(coords.shape[0]):
                w[coords[t]] += beta * d[t]
            return True
        beta *= 0.5
    return False


@njit(nogil=True, cache=True)
def _glmnet(colptr, rows, values, y, coords, w, z, n, lam, outer, stop, buf, touched, mark, cap):  # type: ignore[no-untyped-def]
    """Up to ``outer`` proximal Newton steps on the block ``coords`` (newGLMNET's, Yuan, Ho and
    Lin 2012, liblinear's L1 solver): the loss's quadratic model at ``z`` (one ``exp`` a row
    the block touches), coordinate descent on it (``INNER`` passes at most: multiply-adds,
    no ``exp``), then a line search on ``F``; ``w`` and the margin ``z`` in place.  Done when
    every coordinate is within ``stop`` of its optimality condition.  ``cap``: each
    coordinate's largest move in a step (``step_caps``).  ``buf``: [3, n] scratch;
    ``touched``, ``mark``: n each, ``mark`` clear.  Returns the steps taken."""
    tau, dee, dz = buf[0], buf[1], buf[2]
    k = coords.shape[0]
    g, h, d = np.empty(k), np.empty(k), np.zeros(k)
    for it in range(outer):
        count, worst = _model(colptr, rows, values, y, z, coords, w, n, lam, g, h, mark, touched, tau, dee)
        if worst < stop:
            return it
        for c in range(count):
            dz[touched[c]] = 0.0
        d[:] = 0.0
        _inner(colptr, rows, values, coords, w, n, lam, dee, g, h, d, dz, INNER, max(INNER_SHARE * worst, stop), cap)
        if not _search(y, coords, w, z, n, lam, tau, g, d, dz, touched, count):
            return it
    return outer


def step_caps(m: Matrix, step: float) -> np.ndarray:
    """Each coordinate's largest move in one Newton step: ``step / max_i |x_ij|`` (infinite for
    an empty column).  Where the rows a column touches are classified with great confidence
    either way, its curvature vanishes and the model's step is unbounded; this bounds it."""
    peak = np.zeros(m.shape[1])
    full = np.flatnonzero(np.diff(m.colptr))
    if full.size:
        peak[full] = np.maximum.reduceat(np.abs(m.values), m.colptr[full])
    with np.errstate(divide="ignore"):
        out: np.ndarray = step / peak
    return out


def _expit_neg(u: np.ndarray) -> np.ndarray:
    """``σ(−u) = 1 / (1 + exp(u))`` without overflow."""
    out: np.ndarray = np.exp(-np.logaddexp(0.0, u))
    return out


def logistic_gradient(m: Matrix, z: np.ndarray) -> np.ndarray:
    """``∇ (1/n)·Σ log(1 + exp(−y_i z_i))`` with respect to ``w`` (``z = Xw``)."""
    out: np.ndarray = _xtr(m.colptr, m.rows, m.values, -m.y * _expit_neg(m.y * z)) / m.shape[0]
    return out


def logistic_objective(y: np.ndarray, z: np.ndarray, w: np.ndarray, lam: float) -> float:
    """``F`` at ``w`` with margin ``z = Xw``."""
    return float(np.logaddexp(0.0, -y * z).mean() + lam * np.abs(w).sum())


def logistic_bound(y: np.ndarray, z: np.ndarray, w: np.ndarray, grad: np.ndarray, lam: float) -> tuple[float, float]:
    """``(F(w), a dual value)`` at ``w`` (margin ``z``, ``grad`` the loss's gradient): the dual
    point ``α = σ(−y∘z)`` scaled by ``min(1, λ / ‖grad‖∞)`` into the feasible set."""
    u = y * z
    scale = min(1.0, lam / max(float(np.abs(grad).max(initial=0.0)), 1e-300))
    a = scale * _expit_neg(u)
    b = _expit_neg(-u) + (1.0 - scale) * _expit_neg(u)  # 1 − a, without cancelling
    entropy = -(a * np.log(np.maximum(a, 1e-300)) + b * np.log(np.maximum(b, 1e-300)))
    return logistic_objective(y, z, w, lam), float(entropy.mean())


def logistic_lambda_max(m: Matrix, intercept: bool = False) -> float:
    """The smallest λ at which every coefficient is zero: ``‖∇f(0)‖∞ = ‖Xᵀy‖∞ / (2n)``;
    with an intercept, ``‖∇_w f(0, b₀)‖∞`` at the intercept ``b₀`` best for ``w = 0``."""
    if not intercept:
        return float(np.abs(_xtr(m.colptr, m.rows, m.values, m.y)).max() / (2 * m.shape[0]))
    _, z = best_intercept(m.y, np.zeros(m.shape[0]), 0.0)
    return float(np.abs(logistic_gradient(m, z)).max())


def best_intercept(y: np.ndarray, xw: np.ndarray, b: float) -> tuple[float, np.ndarray]:
    """The unpenalised intercept best for the margins ``xw`` (``Xw``), by Newton's method
    from ``b`` with backtracking, until its derivative is below 1e-15 (or the step is at
    float64's resolution): ``(b, xw + b)``.  The same arithmetic on every worker."""
    z = xw + b
    for _ in range(100):
        a = _expit_neg(y * z)
        g = -float((y * a).mean())
        h = float((a * _expit_neg(-y * z)).mean())
        if abs(g) <= 1e-15 or h <= 0.0:
            break
        step, t = -g / h, 1.0
        before = float(np.logaddexp(0.0, -y * z).mean())
        while t > 1e-12 and float(np.logaddexp(0.0, -y * (z + t * step)).mean()) > before + 1e-4 * t * g * step:
            t *= 0.5
        if abs(t * step) <= 1e-16 * max(1.0, abs(b)):
            break
        b += t * step
        z = xw + b
    return b, z
