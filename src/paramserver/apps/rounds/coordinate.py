"""Scheduled coordinate descent for ``f(w) + λ‖w‖₁``, the part of ``paramserver lasso`` that
does not depend on the loss (``--loss squared``: ``lasso.LassoProgram``; ``--loss
logistic``: ``l1lr.L1LRProgram``).

The coefficients live on the servers, in a dense table range-partitioned into blocks.
Every worker holds the data (CSC) and a vector kept exactly in step with the coefficients
it pulls (the residual ``y − Xw``, or the margin ``Xw``).  Each round
(``paramserver.apps.rounds.program``):

- **schedule**, run alike on every worker: draw coordinates of the working set with
  probability by how much they moved lately (``--schedule priority``; or ``cyclic``,
  ``random``), then deal them to the workers with an interference check: a coordinate
  goes to the worker whose coordinates it correlates with most (one worker updates
  correlated coordinates one after another, which is exact), and is left for a later
  round if its summed correlation with the other workers' coordinates passes ``ρ``;
- **update**, on each worker: sweeps of coordinate descent over its coordinates, on its
  copy of the vector; push the new values (``assign``);
- **observe**, after the barrier: pull the round's coordinates and move the vector by
  what the other workers changed.

Every few passes each worker recomputes the vector from the coefficients (so all agree
to the bit), the full gradient, the duality gap, and the working set: the KKT filter
(``kkt``) drops the coordinates at zero whose gradient is inside ``[−λ, λ]``, and of the
rest the non-zero coefficients and the worst violators are kept (as celer does).  It
stops when the gap is below ``tol`` times the objective: the objective is then within
``tol`` of the optimum, relatively.

A loss supplies five methods: ``_refresh`` (the vector from ``w``, and the gradient),
``_sweep`` (coordinate steps), ``_shift`` (move the vector by others' changes),
``_bound`` (the objective and a dual lower bound) and optionally ``_after_polish``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from paramserver.apps.rounds.kkt import kkt_filter, kkt_violation
from paramserver.apps.rounds.lasso_math import _deal, _top
from paramserver.apps.rounds.matrix import Matrix

SCHEDULES = ("priority", "cyclic", "random")
LOSSES = ("squared", "logistic")
#: a check (exact vector, gap, working set, polish) every this many passes over the working set.  A
#: check's polish and fresh working set are progress too, and since the support's dual point takes the
#: violators at zero (``lasso_support``) the gap certifies soon after the support settles: news20 (2
#: workers, four whole commands each, in turn) at λ_max/1000 28 rounds against 40 at 8 passes (1.87-1.97 s
#: against 2.12-2.40), at λ_max/2000 72 against 96 (3.15-3.55 s against 3.83-4.22), at λ_max/100 8
#: against 16 (level); a9a at λ_max/1000 36 against 40 (level)
CHECK_PASSES = 4
POLISH, POLISH_SWEEPS = 512, 8  # at each check: the worst violators, swept serially on every worker alike
# the coefficients: a row is two float32s, hi + lo (float64 to 2^-48, so the gap can close).  Key j holds
# coefficient j's latest value (read whole at checks, and at the end); a round r also writes its values at
# (1 + r mod 2)·d + j, which is what observe reads: the next round writes the other half, so a fast worker
# cannot overwrite what a slow one has still to read, and no barrier is needed between them
TABLE = "lasso/w"


def split64(w: np.ndarray) -> np.ndarray:
    """float64 values → ``[n, 2]`` float32 rows ``hi, lo`` with ``hi + lo`` = w to 2^-48."""
    hi = np.asarray(w, np.float64).astype(np.float32)
    return np.stack([hi, (np.asarray(w, np.float64) - hi).astype(np.float32)], axis=1)


def join64(rows: np.ndarray) -> np.ndarray:
    return np.asarray(rows[:, 0], np.float64) + np.asarray(rows[:, 1], np.float64)


@dataclass(frozen=True)
class LassoConfig:
    lam: float
    tol: float = 1e-4
    schedule: str = "priority"
    per_round: int = 2048  # coordinates a worker updates a round
    sweeps: int = 32  # passes over them (few rounds: a round's barrier and messages cost more than its sweeps)
    rho: float = 0.05  # interference: mean |correlation| with the other workers' coordinates
    max_rounds: int = 200_000
    block_size: int = 1024
    loss: str = "squared"  # or "logistic" (labels ±1)
    kkt_filter: bool = True  # skip the coordinates at zero whose gradient is inside [−λ, λ] (``kkt``)
    intercept: bool = False  # the logistic loss's unpenalised intercept (``l1lr``)


class ScheduledCD:
    """One worker's side of scheduled coordinate descent (see the module's doc)."""

    check_passes = CHECK_PASSES  # passes over the working set between two checks
    polish = POLISH  # the worst violators swept at each check

    def __init__(self, client: Any, m: Matrix, cfg: LassoConfig, rank: int, workers: int, curvature: float):
        """``curvature``: the smooth part's second derivative along column j is at most
        ``curvature · ‖x_j‖²`` (1/n for the squared loss): a violator's priority is its
        violation over it, in coefficient units."""
        self.client, self.m, self.cfg, self.rank, self.workers = client, m, cfg, rank, workers
        self.slot = rank  # this worker's place among the live ones
        n, d = m.shape
        self.n = n
        self.col_sq = np.add.reduceat(np.r_[m.values ** 2, 0.0], m.colptr[:-1]) if m.nnz else np.zeros(d)
        self.col_sq[np.diff(m.colptr) == 0] = 0.0
        self.col_norm = np.sqrt(self.col_sq)
        self.curvature = np.maximum(self.col_sq, 1e-300) * curvature
        self.w = np.zeros(d)
        self.moved = np.zeros(d)  # recent |change| of each coordinate: the priority
        self.acc = np.zeros((n, workers))
        self.working = np.zeros(0, np.int64)
        self.rho = cfg.rho  # the interference bound, tightened whenever the objective goes up
        self.check_seconds = 0.0
        self.best_dual = -math.inf
        self._before = np.zeros(0)
        self.next_check = self.checked_at = self.pass_rounds = 0
        self.filtered = self.kkt_skipped = 0  # coordinates the filter left out now; updates it saved so far
        self.primal, self.gap, self.updates, self.checks = math.inf, math.inf, 0, 0
        self.pass_moved = 0.0  # the largest move of a coordinate this pass (``converged``)
        self.history: list[dict[str, float]] = []
        self.started = time.perf_counter()
        self.gated = False  # the table is BSP on the servers: run_rounds then needs no barrier before a pull

    # -- what a loss supplies ------------------------------------------------------------------------------
    def _refresh(self) -> np.ndarray:
        """Recompute the vector from ``self.w``; return the smooth part's gradient."""
        raise NotImplementedError

    def _sweep(self, coords: np.ndarray, sweeps: int) -> None:
        """``sweeps`` passes of coordinate steps over ``coords``, ``w`` and the vector in place."""
        raise NotImplementedError

    def _shift(self, coords: np.ndarray, delta: np.ndarray) -> None:
        """Move the vector by ``delta`` on ``coords`` (what others changed)."""
        raise NotImplementedError

    def _bound(self, grad: np.ndarray) -> tuple[float, float]:
        """The objective at ``self.w`` and a lower bound on the optimum (a dual value)."""
        raise NotImplementedError

    def _after_polish(self, top: np.ndarray) -> None:
        """More exact steps on the worst violators ``top``, after the polish's sweeps."""

    # -- the full check: exact vector, gradient, gap, working set -----------------------------------------
    def _check(self, round_: int) -> None:
        m = self.m
        if round_:  # every worker takes the servers' coefficients whole, so that all check the same point;
            everything = np.arange(m.shape[1], dtype=np.uint64)  # nobody pushes again before all have them
            self.w = join64(self.client.pull(TABLE, everything).result(timeout=600))
            self.client.barrier(timeout_s=600)
        pulled = self.w.copy()
        grad = self._refresh()
        if round_ and self.workers > 1:
            grad = self._polish(grad)
        if round_:  # what the polish moved (alike on every worker) goes to the servers,
            moved = np.flatnonzero(self.w != pulled)  # before any round's push (a barrier)
            if self.slot == 0 and moved.size:
                self.client.push(TABLE, moved.astype(np.uint64), split64(self.w[moved]), op="assign",
                                 distinct=True).result(timeout=600)
            if self.workers > 1:
                self.client.barrier(timeout_s=600)
        before = self.primal
        self.primal, dual = self._bound(grad)
        self.best_dual = max(self.best_dual, dual)  # every dual point bounds the optimum
        self.gap = max(self.primal - self.best_dual, 0.0)
        if self.primal > before:  # the workers' concurrent updates interfered: deal more cautiously
            self.rho = max(self.rho / 4, 1e-6)
        self.checks += 1
        self._working_set(grad, round_)

    def _working_set(self, grad: np.ndarray, round_: int) -> None:
        """The KKT filter, then the non-zeros and the worst violators of what it left; the
        rounds to the next check, and the check's line in the history."""
        cfg = self.cfg
        kept = kkt_filter(self.w, grad, cfg.lam, cfg.kkt_filter)
        self.filtered = kept.skipped
        nonzero = np.flatnonzero(self.w)
        violation = kept.violation
        size = max(2 * nonzero.size, 2 * cfg.per_round * self.workers, 256)
        order = _top(violation, max(size - nonzero.size, 0))
        order = order[violation[order] > 0]
        self.working = np.sort(np.concatenate([nonzero, order])) if cfg.kkt_filter else kept.active
        # a violator's priority is how far it is from optimal, in coefficient units
        self.moved[order] = violation[order] / self.curvature[order]
        self.pass_rounds = max(1, -(-self.working.size // (cfg.per_round * self.workers)))
        self.checked_at, self.next_check = round_, round_ + self.check_passes * self.pass_rounds
        self.pass_moved = 0.0
        self.history.append({"round": round_, "seconds": time.perf_counter() - self.started, "objective": self.primal,
                             "gap": self.gap, "nonzeros": int(nonzero.size), "updates": self.updates,
                             "active_set": int(kept.active.size), "kkt_filtered": kept.skipped,
                             "kkt_skipped": self.kkt_skipped})

    def _polish(self, grad: np.ndarray) -> np.ndarray:
        """Serial coordinate steps over the worst violators of the optimality conditions,
        the same on every worker (same point, same order, same arithmetic: no message), so
        that what concurrent rounds leave behind (small violations on correlated, dense
        columns, which the gap sees and the objective hardly does) is cleared exactly.
        Returns the new gradient."""
        kkt = kkt_violation(self.w, grad, self.cfg.lam)
        top = _top(kkt, self.polish)
        top = top[kkt[top] > 0]
        if not top.size:
            return grad
        self._sweep(top, POLISH_SWEEPS)
        self.updates += top.size * POLISH_SWEEPS
        self._after_polish(top)
        return self._refresh()

    @property
    def solved(self) -> bool:
        return self.gap <= self.cfg.tol * max(self.primal, 1e-300) or self.working.size == 0

    @property
    def stalled(self) -> bool:
        """The objective moved by less than 1e-9 of itself over the last 10 checks with the
        gap within 100 tol.  Near the optimum the gap is a loose bound: with two workers on
        news20 at λ_max/2000 it sat at 7e-4 of the objective while the objective was
        within 1e-8 of celer's optimum (small violations of the optimality conditions that
        concurrent updates leave, and the objective no longer feels)."""
        h = self.history
        return (len(h) > 10 and h[-1]["objective"] >= h[-11]["objective"] * (1 - 1e-9)
                and h[-1]["gap"] >= 0.5 * h[-11]["gap"] and self.gap <= 100 * self.cfg.tol * self.primal)

    @property
    def stuck(self) -> bool:
        """Nothing moved over the last 10 checks, the objective nor the gap, whatever the gap:
        the rounds to come would find the same point.  A λ at float64's resolution of the loss
        (news20's λ_max / 10^300) left the gap at the objective itself for 10^6 rounds."""
        h = self.history
        return len(h) > 10 and all(x["objective"] == h[-1]["objective"] and x["gap"] == h[-1]["gap"]
                                   for x in h[-11:])

    def converged(self, round_: int) -> bool:
        """Check every ``check_passes`` passes over the working set, and at once after a pass
        that moved no coordinate (every worker sees the same pulled values, so all agree):
        the rounds to come would find the same point."""
        if round_ > self.checked_at and (round_ - self.checked_at) % self.pass_rounds == 0:
            if self.pass_moved == 0.0:
                self.next_check = round_
            self.pass_moved = 0.0
        if round_ >= self.next_check:
            t = time.perf_counter()
            self._check(round_)
            self.check_seconds += time.perf_counter() - t
        return self.solved or self.stalled or self.stuck

    # -- the three functions of a scheduled program ------------------------------------------------------
    def schedule(self, round_: int, workers: int) -> list[np.ndarray]:
        cfg, ws = self.cfg, self.working
        if (round_ - self.checked_at) % self.pass_rounds == 0:  # a pass begins: the filter spares these
            self.kkt_skipped += self.filtered
        want = min(ws.size, cfg.per_round * workers)
        rng = np.random.default_rng([round_, 0x1A550])
        if cfg.schedule == "cyclic":
            start = (round_ * want) % max(ws.size, 1)
            cand = np.roll(ws, -start)[:want]
        elif cfg.schedule == "random":
            cand = rng.choice(ws, want, replace=False) if want else ws[:0]
        else:  # priority: sample by recent change (Efraimidis-Spirakis keys), a floor so none starves
            p = self.moved[ws] + 1e-3 * (self.moved[ws].max() if ws.size else 0.0) + 1e-12
            keys = np.log(rng.random(ws.size)) / p
            cand = ws[np.argsort(-keys, kind="stable")[:want]]
        owner = _deal(self.m.colptr, self.m.rows, self.m.values, self.col_norm, cand.astype(np.int64), workers,
                      cfg.per_round, self.rho if workers > 1 else math.inf, self.acc)
        return [np.sort(cand[owner == q]) for q in range(workers)]

    def update(self, round_: int, mine: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray, str]]:
        self._before = self.w[mine].copy()  # the round's change is measured from here, as the others see it
        self._sweep(mine, self.cfg.sweeps)
        values = split64(self.w[mine])
        keys = np.r_[mine, mine + (1 + round_ % 2) * self.m.shape[1]].astype(np.uint64)
        return [(TABLE, keys, np.concatenate([values, values]), "assign")]

    def observe(self, round_: int, assignment: Sequence[np.ndarray]) -> None:
        changed = np.concatenate(list(assignment)) if assignment else np.zeros(0, np.int64)
        if not changed.size:
            return
        half = (1 + round_ % 2) * self.m.shape[1]  # this round's half: the next round cannot touch it yet
        pulled = join64(self.client.pull(TABLE, (changed + half).astype(np.uint64)).result(timeout=600))
        self._shift(changed, pulled - self.w[changed])
        start = self.w[changed]  # where the round started: this worker's own coordinates moved already
        first = sum(len(a) for a in assignment[:self.slot])  # ``changed`` holds the workers' lists in turn
        start[first:first + len(assignment[self.slot])] = self._before
        self.w[changed] = pulled
        # the priorities come from pulled values only, so that every worker computes the same schedule
        self.moved[changed] = np.abs(pulled - start)
        self.pass_moved = max(self.pass_moved, float(self.moved[changed].max()))
        self.updates += changed.size * self.cfg.sweeps

    def regroup(self, round_: int, live: list[int]) -> None:
        """Workers died: deal to the survivors from now on, and check at once (every worker
        takes the servers' coefficients whole, whatever the dead one pushed last)."""
        self.workers, self.slot = len(live), live.index(self.rank)
        self.acc = np.zeros((self.n, self.workers))
        self.next_check = round_ + 1

    def resume(self, round_: int, step: str) -> None:
        """Go on from a round checkpoint (the table restored): check at once, which takes
        the coefficients whole from the servers and recomputes everything else from them."""
        self.next_check = round_
