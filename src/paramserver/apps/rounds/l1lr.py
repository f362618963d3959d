"""``paramserver lasso --loss logistic``: L1-regularised logistic regression,
``(1/n)·Σ log(1 + exp(−y_i x_iᵀw)) + λ‖w‖₁`` (labels ±1), by the scheduled
coordinate descent of ``coordinate``: every worker keeps the margin ``z = Xw``; a
worker's coordinates of a round take newGLMNET's proximal Newton steps, each with a line
search (``l1lr_math``); it stops when the duality gap is below ``tol`` times the
objective.  A worker stops stepping in a round once every coordinate of its block is
within ``0.1·λ`` times the last check's relative gap (at least ``tol``) of its optimality
condition, or after ``sweeps`` steps (the report's ``coordinate_updates`` counts the
steps a round allows: an upper bound).

λ_max, the smallest λ with ``w = 0``, is ``‖∇f(0)‖∞ = ‖Xᵀy‖∞ / (2n)``.

With ``--intercept``, an unpenalised intercept ``b`` joins the margin (``z = Xw + b``).
It is not a coordinate of the rounds: every worker sets it alike at each check, at its
best for the coefficients checked (Newton's method in one variable), which is also what
makes the dual point feasible (``Σ α_i y_i = 0``); the driver sets it for the final
coefficients the same way.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from paramserver.apps.rounds.coordinate import LassoConfig, ScheduledCD
from paramserver.apps.rounds.l1lr_math import (
    STEP,
    _glmnet,
    best_intercept,
    logistic_bound,
    logistic_gradient,
    step_caps,
)
from paramserver.apps.rounds.lasso_math import _apply, _residual
from paramserver.apps.rounds.matrix import Matrix
from paramserver.data.whole import bad_line, read_whole

__all__ = ["L1LRProgram", "margin", "signed_labels"]


def signed_labels(m: Matrix, path: str) -> Matrix:
    """``m`` (read from ``path``) with labels ±1: 1 and −1 kept, 0 read as −1 (0/1 labels)
    unless −1 occurs too; 1/2 labels (LIBSVM's two classes numbered so) as −1/1.

    Raises:
        DataError: another label, or 0 beside −1: the file's line named, with the fix."""
    y = m.y
    if (y == 2).any() and np.isin(y, (1.0, 2.0)).all():  # 1/2 labels, as train's --label-format 12: 2 positive
        return replace(m, y=np.where(y == 2, 1.0, -1.0))
    bad = np.flatnonzero((y != 1) & (y != -1) & ((y != 0) | (y == -1).any()))
    if bad.size:
        raw, buf = read_whole(path)  # only now: the line's number and text, blank lines counted
        at, seen = 0, -1
        for line in raw.split(b"\n"):
            seen += bool(line.split(b"#", 1)[0].strip(b" \t\r"))  # a row: not blank, not a comment alone
            if seen == bad[0]:
                break
            at += len(line) + 1
        raise bad_line(path, raw, buf, at, f"the label {y[bad[0]]:g} is not 1, -1 (or 0, read as -1, where there is "
                       "no -1)", "--loss logistic takes two classes, 1 and -1 (or 1 and 0, or 2 and 1): map the labels "
                       "to them, or use --loss squared")
    return replace(m, y=np.where(y == 0, -1.0, y))


def margin(m: Matrix, w: np.ndarray) -> np.ndarray:
    """``Xw``."""
    z: np.ndarray = _residual(m.colptr, m.rows, m.values, np.zeros(m.shape[0]), -np.asarray(w, np.float64))
    return z


class L1LRProgram(ScheduledCD):
    """One worker's side of the scheduled L1 logistic regression: the logistic loss's part
    (see ``coordinate``); the vector is the margin ``z = Xw``.  ``m``'s labels are ±1."""

    check_passes = 1  # a check after each pass: a block's Newton steps settle it in a pass or two
    # a check every round: 512 violators' Newton steps, on every worker alike, cost as much as a round's own
    # (news20, λ_max/1000: 128 reach the tolerance in the same 8 rounds, the command's median 3.59 -> 2.71 s
    # in four pairs; at λ_max/100 one more round, the same time)
    polish = 128

    def __init__(self, client: Any, m: Matrix, cfg: LassoConfig, rank: int, workers: int):
        super().__init__(client, m, cfg, rank, workers, curvature=0.25 / m.shape[0])
        self.z = np.zeros(self.n)
        self.b = 0.0  # the intercept (cfg.intercept): the same on every worker, set at each check
        self.buf = np.zeros((3, self.n))  # a Newton step's scratch: σ(−y_i z_i), its curvature, the margin's change
        self.touched, self.mark = np.zeros(self.n, np.int64), np.zeros(self.n, np.bool_)
        self.cap = step_caps(m, STEP)
        self._check(0)

    def _refresh(self) -> np.ndarray:
        self.z = margin(self.m, self.w)
        if self.cfg.intercept:  # at its best for w, so that the dual point meets Σ α_i y_i = 0
            self.b, self.z = best_intercept(self.m.y, self.z, self.b)
        return logistic_gradient(self.m, self.z)

    def _sweep(self, coords: np.ndarray, sweeps: int) -> None:
        m = self.m
        # a step whose coordinates all violate their optimality conditions by less than this is the last: the
        # duality gap's scaling of the dual point falls short of 1 by about the largest violation over λ, so
        # that 0.1·tol·λ is enough at the end, and 0.1 of the last check's relative gap before it
        cfg = self.cfg
        stop = 0.1 * cfg.lam * max(cfg.tol, min(self.gap / max(self.primal, 1e-300), 1.0))
        _glmnet(m.colptr, m.rows, m.values, m.y, coords, self.w, self.z, self.n, cfg.lam, sweeps, stop, self.buf,
                self.touched, self.mark, self.cap)

    def _shift(self, coords: np.ndarray, delta: np.ndarray) -> None:
        _apply(self.m.colptr, self.m.rows, self.m.values, coords, -delta, self.z)

    def _bound(self, grad: np.ndarray) -> tuple[float, float]:
        return logistic_bound(self.m.y, self.z, self.w, grad, self.cfg.lam)
