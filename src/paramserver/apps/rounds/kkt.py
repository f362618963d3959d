"""The KKT filter of ``paramserver lasso`` (both losses): which coordinates a pass over the
working set may skip.

For ``f(w) + λ‖w‖₁`` with ``f`` smooth, a coordinate at zero whose gradient ``∂_j f`` lies
inside ``[−λ, λ]`` stays at zero after a proximal step, whatever the step size
(``soft(0 − g/h, λ/h) = 0`` iff ``|g| <= λ``): its update need not be computed, pushed,
or pulled.  The filter is applied at each check, where every worker holds the same point
to the bit, so every worker filters alike and the schedules still agree; until the next
check the passes go over what it left (the *active set*).  It is exact because the check
that stops the solver (the duality gap, or the violations of these same conditions)
looks at every coordinate: one that starts to violate its condition later is active
again at the next check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Filtered:
    """What the filter left at a point: ``active`` (sorted indices: non-zero, or at zero
    with ``|∂_j f| > λ``), ``violation`` (``|∂_j f| − λ`` at the zero coordinates,
    ``−inf`` at the non-zero ones) and ``skipped``, how many coordinates it filtered out."""

    active: np.ndarray
    violation: np.ndarray
    skipped: int


def kkt_filter(w: np.ndarray, grad: np.ndarray, lam: float, enabled: bool = True) -> Filtered:
    """The KKT filter at ``w`` with the smooth part's gradient ``grad``; with ``enabled``
    False every coordinate stays active (nothing skipped)."""
    nonzero = w != 0
    violation = np.abs(grad) - lam
    violation[nonzero] = -np.inf
    if not enabled:
        return Filtered(np.arange(w.size, dtype=np.int64), violation, 0)
    active = np.flatnonzero(nonzero | (violation > 0))
    return Filtered(active, violation, int(w.size - active.size))


def kkt_violation(w: np.ndarray, grad: np.ndarray, lam: float) -> np.ndarray:
    """How far each coordinate is from its optimality condition: ``|∂_j f + λ·sign(w_j)|``
    where ``w_j ≠ 0``, ``max(|∂_j f| − λ, 0)`` where it is zero."""
    out: np.ndarray = np.where(w != 0, np.abs(grad + lam * np.sign(w)), np.maximum(np.abs(grad) - lam, 0.0))
    return out
