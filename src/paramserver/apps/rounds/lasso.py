"""``paramserver lasso``: least-squares Lasso, ``1/(2n)·‖y − Xw‖² + λ‖w‖₁`` (no
intercept), by coordinate descent scheduled over the workers as Petuum's STRADS does.

The coefficients live on the servers, in a dense table range-partitioned into blocks.
Every worker holds the data (CSC) and a residual ``r = y − Xw`` kept exactly in step
with the coefficients it pulls.  Each round (``paramserver.apps.rounds.program``):

- **schedule**, run alike on every worker: draw coordinates of the working set with
  probability by how much they moved lately (``--schedule priority``; or ``cyclic``,
  ``random``), then deal them to the workers with an interference check: a coordinate
  goes to the worker whose coordinates it correlates with most (one worker updates
  correlated coordinates one after another, which is exact), and is left for a later
  round if its summed correlation with the other workers' coordinates passes ``ρ``;
- **update**, on each worker: sweeps of coordinate descent over its coordinates, on its
  copy of the residual; push the new values (``assign``);
- **observe**, after the barrier: pull the round's coordinates and move the residual
  by what the other workers changed.

Every few rounds each worker recomputes the residual from the coefficients (so all
agree to the bit), the full gradient ``Xᵀr``, the duality gap, and the working set
(the non-zero coefficients and the worst violators of the optimality conditions, as
celer does).  It stops when the gap is below ``tol`` times the objective: the objective
is then within ``tol`` of the optimum, relatively.

The arithmetic on a worker's own data (the kernels, the gap) is in ``lasso_math``; this
module holds the program (``LassoProgram``), its worker and the driver (``run_lasso``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from paramserver.apps.rounds.job import RoundsJob, check_outputs, write_metrics
from paramserver.apps.rounds.lasso_math import (
    _apply,
    _cd,
    _deal,
    _residual,
    _top,
    _xtr,
    dual_value,
    duality_gap,
    extrapolated,
    lambda_max,
)
from paramserver.apps.rounds.lasso_pairs import by_row, pair_steps, twins
from paramserver.apps.rounds.matrix import Matrix, read_libsvm_matrix
from paramserver.apps.rounds.program import (
    NO_CHECKPOINTS,
    CheckpointOptions,
    RoundCheckpoints,
    RoundResume,
    joined_midway,
)
from paramserver.errors import ConfigError

SCHEDULES = ("priority", "cyclic", "random")
CHECK_PASSES = 8  # a check (exact residual, gap, working set, polish) every this many passes over the working set
POLISH, POLISH_SWEEPS = 512, 8  # at each check: the worst violators, swept serially on every worker alike
PAIRS, TWIN = 64, 0.95  # and the worst 64 solved exactly with their most correlated column, if above 0.95
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


class LassoProgram:
    """One worker's side of the scheduled Lasso (see the module's doc)."""

    def __init__(self, client: Any, m: Matrix, cfg: LassoConfig, rank: int, workers: int):
        self.client, self.m, self.cfg, self.rank, self.workers = client, m, cfg, rank, workers
        self.slot = rank  # this worker's place among the live ones
        n, d = m.shape
        self.n = n
        self.col_sq = np.add.reduceat(np.r_[m.values ** 2, 0.0], m.colptr[:-1]) if m.nnz else np.zeros(d)
        self.col_sq[np.diff(m.colptr) == 0] = 0.0
        self.col_norm = np.sqrt(self.col_sq)
        self.by_row = by_row(m.colptr, m.rows, m.values, n)
        self.scratch = np.zeros(n)
        self.twin = np.full(d, -2, np.int64)  # each column's most correlated one (-1: none above TWIN; -2: not yet)
        self.w = np.zeros(d)
        self.r = m.y.astype(np.float64).copy()
        self.moved = np.zeros(d)  # recent |change| of each coordinate: the priority
        self.acc = np.zeros((n, workers))
        self.working = np.zeros(0, np.int64)
        self.rho = cfg.rho  # the interference bound, tightened whenever the objective goes up
        self.residuals: list[np.ndarray] = []  # at the last checks, for the dual extrapolation
        self.check_seconds = 0.0
        self.best_dual = -math.inf
        self._before = np.zeros(0)
        self.next_check = 0
        self.primal, self.gap, self.updates, self.checks = math.inf, math.inf, 0, 0
        self.history: list[dict[str, float]] = []
        self.started = time.perf_counter()
        self._check(0)

    # -- the full check: exact residual, gradient, gap, working set ---------------------------------------
    def _check(self, round_: int) -> None:
        m, cfg = self.m, self.cfg
        if round_:  # every worker takes the servers' coefficients whole, so that all check the same point;
            everything = np.arange(m.shape[1], dtype=np.uint64)  # nobody pushes again before all have them
            self.w = join64(self.client.pull(TABLE, everything).result(timeout=600))
            self.client.barrier(timeout_s=600)
        pulled = self.w.copy()
        self.r = _residual(m.colptr, m.rows, m.values, m.y, self.w)
        g = _xtr(m.colptr, m.rows, m.values, self.r)
        if round_ and self.workers > 1:
            g = self._polish(g)
        if round_:  # what the polish moved (alike on every worker) goes to the servers,
            moved = np.flatnonzero(self.w != pulled)  # before any round's push (a barrier)
            if self.slot == 0 and moved.size:
                self.client.push(TABLE, moved.astype(np.uint64), split64(self.w[moved]), op="assign",
                                 distinct=True).result(timeout=600)
            if self.workers > 1:
                self.client.barrier(timeout_s=600)
        before = self.primal
        self.primal, self.gap = duality_gap(m, self.w, self.r, g, cfg.lam)
        self.residuals = (self.residuals + [self.r.copy()])[-6:]
        r_acc = extrapolated(self.residuals)
        if r_acc is not None:  # a far better dual point than the residual's, near the optimum
            self.best_dual = max(self.best_dual, dual_value(m, r_acc, _xtr(m.colptr, m.rows, m.values, r_acc),
                                                            cfg.lam))
        self.best_dual = max(self.best_dual, self.primal - self.gap)  # every dual point bounds the optimum
        self.gap = max(self.primal - self.best_dual, 0.0)
        if self.primal > before:  # the workers' concurrent updates interfered: deal more cautiously
            self.rho = max(self.rho / 4, 1e-6)
        self.checks += 1
        self.history.append({"round": round_, "seconds": time.perf_counter() - self.started, "objective": self.primal,
                             "gap": self.gap, "nonzeros": int(np.count_nonzero(self.w)), "updates": self.updates})
        nonzero = np.flatnonzero(self.w)
        violation = np.abs(g) / self.n - cfg.lam
        violation[nonzero] = -np.inf
        size = max(2 * nonzero.size, 2 * cfg.per_round * self.workers, 256)
        order = _top(violation, max(size - nonzero.size, 0))
        order = order[violation[order] > 0]
        self.working = np.sort(np.concatenate([nonzero, order]))
        # a violator's priority is how far it is from optimal, in coefficient units
        self.moved[order] = violation[order] * self.n / np.maximum(self.col_sq[order], 1e-300)
        passes = CHECK_PASSES * max(1, -(-self.working.size // (cfg.per_round * self.workers)))
        self.next_check = round_ + passes

    def _polish(self, g: np.ndarray) -> np.ndarray:
        """Serial coordinate descent over the worst violators of the optimality conditions,
        the same on every worker (same point, same order, same arithmetic: no message), so
        that what concurrent rounds leave behind (small violations on correlated, dense
        columns, which the gap sees and the objective hardly does) is cleared exactly.
        Returns the new ``Xᵀr``."""
        m, cfg = self.m, self.cfg
        target = cfg.lam * np.sign(self.w)
        kkt = np.where(self.w != 0, np.abs(g / self.n - target), np.maximum(np.abs(g) / self.n - cfg.lam, 0.0))
        top = _top(kkt, POLISH)
        top = top[kkt[top] > 0]
        if not top.size:
            return g
        _cd(m.colptr, m.rows, m.values, top, self.w, self.r, self.col_sq, self.n, cfg.lam, POLISH_SWEEPS)
        self.updates += top.size * POLISH_SWEEPS
        worst = top[:PAIRS]
        unknown = worst[self.twin[worst] == -2]  # a column's twin never changes: found once
        self.twin[unknown] = twins(m.colptr, m.rows, m.values, *self.by_row, self.col_norm, unknown, TWIN)
        twin = self.twin[worst]
        paired = twin >= 0
        self.updates += pair_steps(m.colptr, m.rows, m.values, worst[paired], twin[paired], self.w, self.r,
                                   self.col_sq, self.n, cfg.lam, self.scratch)
        xtr: np.ndarray = _xtr(m.colptr, m.rows, m.values, self.r)
        return xtr

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

    def converged(self, round_: int) -> bool:
        if round_ >= self.next_check:
            t = time.perf_counter()
            self._check(round_)
            self.check_seconds += time.perf_counter() - t
        return self.solved or self.stalled

    # -- the three functions of a scheduled program ------------------------------------------------------
    def schedule(self, round_: int, workers: int) -> list[np.ndarray]:
        cfg, ws = self.cfg, self.working
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
        m = self.m
        self._before = self.w[mine].copy()  # the round's change is measured from here, as the others see it
        _cd(m.colptr, m.rows, m.values, mine, self.w, self.r, self.col_sq, self.n, self.cfg.lam, self.cfg.sweeps)
        values = split64(self.w[mine])
        keys = np.r_[mine, mine + (1 + round_ % 2) * self.m.shape[1]].astype(np.uint64)
        return [(TABLE, keys, np.concatenate([values, values]), "assign")]

    def observe(self, round_: int, assignment: Sequence[np.ndarray]) -> None:
        changed = np.concatenate(list(assignment)) if assignment else np.zeros(0, np.int64)
        if not changed.size:
            return
        half = (1 + round_ % 2) * self.m.shape[1]  # this round's half: the next round cannot touch it yet
        pulled = join64(self.client.pull(TABLE, (changed + half).astype(np.uint64)).result(timeout=600))
        delta = pulled - self.w[changed]
        _apply(self.m.colptr, self.m.rows, self.m.values, changed, delta, self.r)
        start = self.w[changed]  # where the round started: this worker's own coordinates moved already
        mine = np.isin(changed, assignment[self.slot])
        start[mine] = self._before
        self.w[changed] = pulled
        # the priorities come from pulled values only, so that every worker computes the same schedule
        self.moved[changed] = np.abs(pulled - start)
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


def lasso_worker(client: Any, path: str, n_features: int, cfg: LassoConfig, workers: int,
                 checkpoints: RoundCheckpoints | None = None, resume: RoundResume | None = None) -> dict[str, Any]:
    """One worker of ``paramserver lasso``: read the data, run the rounds."""
    from paramserver.apps.rounds.program import run_rounds

    if joined_midway(client):
        return {"rank": client.rank, "joined_midway": True}
    m = read_libsvm_matrix(path, n_features)
    program = LassoProgram(client, m, cfg, client.rank, workers)
    stats = run_rounds(client, program, rank=client.rank, workers=workers, max_rounds=cfg.max_rounds,
                       checkpoints=checkpoints, resume=resume)
    return {"rank": client.rank, "rounds": stats.rounds, "regroups": stats.regroups, "scheduled": stats.scheduled,
            "checkpoints": stats.checkpoints,
            "phase_seconds": {**{k: round(v, 3) for k, v in stats.seconds.items()},
                              "check": round(program.check_seconds, 3)},
            "updates": program.updates, "objective": program.primal, "gap": program.gap, "checks": program.checks,
            "converged": program.solved, "stalled": program.stalled,
            "history": program.history}


def run_lasso(data: str, *, lam: float | None, lambda_ratio: float | None, tol: float, schedule: str,
              workers: int, servers: int, save: str | None, metrics_out: str | None,
              max_rounds: int = 200_000, checkpoints: CheckpointOptions = NO_CHECKPOINTS,
              cluster_options: dict[str, Any] | None = None, replicas: int = 1,
              allow_loss: bool = False) -> dict[str, Any]:
    """``paramserver lasso``: solve, write ``save/coef.npy`` and the metrics; the report.
    ``checkpoints.every`` counts rounds.  ``replicas``: copies of every vnode; a server's death
    that loses data fails the run (``DataLossError``) unless ``allow_loss``."""
    check_lasso_flags(lam, lambda_ratio, tol, schedule)
    check_outputs(save, metrics_out)
    checkpoints.check()
    t0 = time.perf_counter()
    # the driver reads the data while the cluster's processes start (the parser releases the GIL)
    with ThreadPoolExecutor(1) as pool:
        reading = pool.submit(read_libsvm_matrix, data)
        with RoundsJob(servers=servers, workers=workers, cluster_options=cluster_options,
                       allow_loss=allow_loss) as job:
            m = reading.result()
            n, d = m.shape
            lmax, cfg = lasso_config(data, m, lam, lambda_ratio, tol, schedule, max_rounds)
            # what the table depends on; the workers, --tol and --schedule may change on a resume
            cps, resume = checkpoints.plan({"app": "lasso", "rows": n, "features": d, "lambda": cfg.lam},
                                           rounds_a_unit=1)
            bits = max(int(3 * d - 1).bit_length(), 1)  # latest values, and the two rounds' halves
            block = min(cfg.block_size, 1 << bits)
            job.tables(resume, lambda client: client.create_table(TABLE, dim=2, optimizer="sgd", key_bits=bits,
                                                                  block_size=block, replicas=replicas))
            ran = job.run(lasso_worker, data, d, cfg, workers, cps, resume)
            keys, values = job.client.export_table(TABLE)
    w = np.zeros(d)
    inside = keys < d
    w[keys[inside].astype(np.int64)] = join64(values[inside])
    seconds = time.perf_counter() - t0
    head = min(ran.per_worker, key=lambda r: r["rank"])
    report = {**solution_report(m, w, cfg, head, seconds), "lambda_max": lmax, "rows": n, "features": d,
              "workers": workers, "servers": servers, "workers_lost": ran.lost, "workers_joined_midway": ran.joined,
              "schedule": schedule, "tol": tol, **job.losses.report(),
              "resumed_at_round": resume.round if resume else None, "checkpoints": head["checkpoints"],
              "history": head["history"]}
    if save:
        import os

        os.makedirs(save, exist_ok=True)
        np.save(os.path.join(save, "coef.npy"), w)
    write_metrics(metrics_out, report)
    return report


def check_lasso_flags(lam: float | None, lambda_ratio: float | None, tol: float, schedule: str) -> None:
    """``--lambda`` or ``--lambda-ratio``, ``--tol`` and ``--schedule``, before any work.

    Raises:
        ConfigError: one out of its range (or both λ flags, or neither)."""
    if (lam is None) == (lambda_ratio is None):
        raise ConfigError("give one of --lambda L or --lambda-ratio R (λ = λ_max / R)")
    if lam is not None and not (math.isfinite(lam) and lam > 0):
        raise ConfigError(f"--lambda must be a positive number, got {lam}")
    if lambda_ratio is not None and not (math.isfinite(lambda_ratio) and lambda_ratio >= 1):
        raise ConfigError(f"--lambda-ratio must be a number >= 1 (λ = λ_max / R), got {lambda_ratio}")
    if not (math.isfinite(tol) and 1e-12 <= tol < 1):
        raise ConfigError(f"--tol must be in [1e-12, 1) (the duality gap relative to the objective; the "
                          f"coefficients travel as float64 to 2^-48), got {tol}")
    if schedule not in SCHEDULES:
        raise ConfigError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")


def lasso_config(data: str, m: Matrix, lam: float | None, lambda_ratio: float | None, tol: float, schedule: str,
                 max_rounds: int) -> tuple[float, LassoConfig]:
    """``λ_max`` of the data read from ``data`` and the solver's settings, λ given or
    ``λ_max / lambda_ratio``.

    Raises:
        ConfigError: ``Xᵀy`` is zero (every λ gives w = 0)."""
    lmax = lambda_max(m)
    if lmax == 0:
        raise ConfigError(f"{data}: Xᵀy is zero, so every λ gives w = 0; check the targets")
    if lam is None:
        assert lambda_ratio is not None
        lam = lmax / lambda_ratio
    return lmax, LassoConfig(lam=float(lam), tol=tol, schedule=schedule, max_rounds=max_rounds)


def solution_report(m: Matrix, w: np.ndarray, cfg: LassoConfig, head: dict[str, Any],
                    seconds: float) -> dict[str, Any]:
    """The report's first lines: the solution ``w`` (objective, duality gap, non-zeros) and
    how the rounds went, as the lowest-ranked worker (``head``) saw them."""
    r = _residual(m.colptr, m.rows, m.values, m.y, w)
    primal, gap = duality_gap(m, w, r, _xtr(m.colptr, m.rows, m.values, r), cfg.lam)
    # the workers' last check saw these coefficients (to the 2^-48 the table keeps): their dual point (an
    # extrapolated one) bounds the optimum from below too, and is the tighter certificate
    gap = min(gap, float(head["gap"]) + max(primal - float(head["objective"]), 0.0))
    return {"objective": primal, "duality_gap": gap, "relative_gap": gap / primal if primal else 0.0,
            "nonzeros": int(np.count_nonzero(w)), "seconds": seconds, "rounds": head["rounds"],
            "coordinate_updates": int(head["updates"]), "converged": bool(head["converged"] or gap <= cfg.tol * primal),
            "stalled": bool(head["stalled"]), "phase_seconds": head["phase_seconds"], "lambda": cfg.lam}
