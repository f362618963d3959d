"""L1-regularised logistic regression's arithmetic on a worker's own data (no server in
it), for ``paramserver lasso --loss logistic`` (``l1lr``):

    F(w) = (1/n)·Σ log(1 + exp(−y_i x_iᵀw)) + λ‖w‖₁,   y_i = ±1.

A worker keeps the margin ``z = Xw``.  A coordinate step is CDN's (Yuan, Chang, Hsieh and
Lin 2010, liblinear's L1 solver before newGLMNET): the proximal Newton step on the
coordinate's quadratic model (gradient and exact second derivative), then an Armijo line
search on ``F`` itself, halving the step until ``F`` falls by 1% of what the model
promised.

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


@njit(nogil=True, cache=True)
def _newton(colptr, rows, values, y, z, j, wj, n, lam, tau):  # type: ignore[no-untyped-def]
    """The proximal Newton direction of coordinate ``j`` (at ``wj``), the model's decrease
    ``g·d + λ(|wj + d| − |wj|)`` and the curvature ``h``; ``tau`` gets ``σ(−y_i z_i)`` of the
    column's rows."""
    g, h = 0.0, 0.0
    for k in range(colptr[j], colptr[j + 1]):
        i = rows[k]
        t = 1.0 / (1.0 + math.exp(y[i] * z[i]))
        tau[k - colptr[j]] = t
        g -= values[k] * y[i] * t
        h += values[k] * values[k] * t * (1.0 - t)
    g /= n
    h = max(h / n, 1e-12)
    if g + lam <= h * wj:
        d = -(g + lam) / h
    elif g - lam >= h * wj:
        d = -(g - lam) / h
    else:
        d = -wj
    return d, g * d + lam * (abs(wj + d) - abs(wj)), h


@njit(nogil=True, cache=True)
def _step(colptr, rows, values, y, z, j, w, n, lam, tau):  # type: ignore[no-untyped-def]
    """One CDN step on coordinate ``j``: ``w`` and ``z`` in place.  Returns ``h·|d|``, how far
    the coordinate was from its optimality condition (its gradient's distance to ``−λ·sign``).
    ``log(1 + e^(−u−δ)) − log(1 + e^(−u)) = log1p(σ(−u)·expm1(−δ))``: a line search trial
    costs one ``expm1`` and one ``log1p`` a row."""
    d, model, h = _newton(colptr, rows, values, y, z, j, w[j], n, lam, tau)
    if d == 0.0:
        return 0.0
    beta = 1.0
    for _ in range(HALVINGS):
        change = 0.0
        for k in range(colptr[j], colptr[j + 1]):
            change += math.log1p(tau[k - colptr[j]] * math.expm1(-y[rows[k]] * beta * d * values[k]))
        change = change / n + lam * (abs(w[j] + beta * d) - abs(w[j]))
        if change <= SIGMA * beta * model:
            step = beta * d
            for k in range(colptr[j], colptr[j + 1]):
                z[rows[k]] += step * values[k]
            w[j] += step
            break
        beta *= 0.5
    return h * abs(d)


@njit(nogil=True, cache=True)
def _cdn(colptr, rows, values, y, coords, w, z, n, lam, sweeps, stop, tau):  # type: ignore[no-untyped-def]
    """Up to ``sweeps`` passes of CDN steps over ``coords`` in order, updating ``w`` and the
    margin ``z`` in place; done after a pass where every coordinate was within ``stop`` of
    its optimality condition (``tau``: scratch, the longest column's length).  Returns the
    passes made."""
    for sweep in range(sweeps):
        worst = 0.0
        for t in range(coords.shape[0]):
            j = coords[t]
            if colptr[j + 1] > colptr[j]:
                worst = max(worst, _step(colptr, rows, values, y, z, j, w, n, lam, tau))
        if worst < stop:
            return sweep + 1
    return sweeps


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
