"""``paramserver lasso``: ``f(w) + λ‖w‖₁`` by coordinate descent scheduled over the workers as
Petuum's STRADS does (``coordinate``), ``f`` the least-squares loss ``1/(2n)·‖y − Xw‖²``
(``--loss squared``, here; no intercept) or the logistic loss (``--loss logistic``, ``l1lr``;
an unpenalised intercept with ``--intercept``).

For the squared loss every worker keeps the residual ``r = y − Xw``; each check also
takes celer's dual extrapolation for a tighter dual point, and solves the worst
violators' pairs with their most correlated column exactly (``lasso_pairs``).

The arithmetic on a worker's own data (the kernels, the gap) is in ``lasso_math``; this
module holds the squared loss's program (``LassoProgram``), the worker and the driver of
both losses (``run_lasso``).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import numpy as np

from paramserver._runtime.handed import handed, handed_down
from paramserver.apps.rounds.coordinate import (
    LOSSES,
    SCHEDULES,
    TABLE,
    LassoConfig,
    ScheduledCD,
    join64,
    split64,
)
from paramserver.apps.rounds.job import RoundsJob, Watch, check_outputs, write_metrics
from paramserver.apps.rounds.l1lr import L1LRProgram, margin, signed_labels
from paramserver.apps.rounds.l1lr_math import (
    best_intercept,
    logistic_bound,
    logistic_gradient,
    logistic_lambda_max,
)
from paramserver.apps.rounds.lasso_math import (
    _apply,
    _cd,
    _residual,
    _xtr,
    dual_value,
    duality_gap,
    extrapolated,
    lambda_max,
)
from paramserver.apps.rounds.lasso_pairs import by_row, pair_steps, twins
from paramserver.apps.rounds.lasso_support import support_dual, worth_trying
from paramserver.apps.rounds.matrix import Matrix, check_job_fits, read_libsvm_matrix
from paramserver.apps.rounds.program import (
    NO_CHECKPOINTS,
    CheckpointOptions,
    RoundCheckpoints,
    RoundResume,
    gated,
    joined_midway,
)
from paramserver.errors import ConfigError

__all__ = ["SCHEDULES", "TABLE", "LassoConfig", "LassoProgram", "check_lasso_flags", "join64", "lasso_config",
           "lasso_worker", "run_lasso", "solution_report", "split64"]
PAIRS, TWIN = 64, 0.95  # at each check the worst 64 are solved exactly with their most correlated column, if above 0.95


def interference_bound(rho: float, workers: int) -> float:
    """The deal's bound on a coordinate's mean |correlation| with the other workers' ones, for
    the squared loss at ``workers``: ``rho`` at two, ``rho / (workers − 1)³`` beyond.  Each
    worker's sweeps are exact on its own coordinates and blind to the others' moves in the
    round, and with more workers a coordinate meets more of those moves and each of them more
    others': news20 at λ_max/1000 diverged at three workers with ``rho`` (the objective from 0.5
    to 1.3e8 by round 40), did not converge in 60-80 rounds at ``rho``/2, /3.3 and /5, and
    converged at /8 (32 rounds; at four workers /27, 36 rounds), as two do with ``rho`` (28).
    The logistic loss's Newton steps took three workers at ``rho`` (9 rounds, against 8 at
    two)."""
    return rho if workers <= 2 else rho / (workers - 1) ** 3


class LassoProgram(ScheduledCD):
    """One worker's side of the scheduled Lasso: the squared loss's part (see the module's
    doc); the vector is the residual ``r = y − Xw``."""

    def __init__(self, client: Any, m: Matrix, cfg: LassoConfig, rank: int, workers: int):
        super().__init__(client, m, cfg, rank, workers, curvature=1.0 / m.shape[0])
        self.rho = interference_bound(cfg.rho, workers)
        self.scratch = np.zeros(self.n)
        # each column's most correlated one (-1: none above TWIN; -2: not yet)
        self.twin = np.full(m.shape[1], -2, np.int64)
        self.r = m.y.astype(np.float64).copy()
        self.xtr = np.zeros(m.shape[1])  # Xᵀr at the last refresh
        self.residuals: list[np.ndarray] = []  # at the last checks, for the dual extrapolation
        self._check(0)

    @functools.cached_property
    def by_row(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The worker's columns by row, for ``twins`` (made when a polish first needs them)."""
        m = self.m
        return by_row(m.colptr, m.rows, m.values, self.n)

    def _refresh(self) -> np.ndarray:
        m = self.m
        self.r = _residual(m.colptr, m.rows, m.values, m.y, self.w)
        self.xtr = _xtr(m.colptr, m.rows, m.values, self.r)
        grad: np.ndarray = -self.xtr / self.n
        return grad

    def _sweep(self, coords: np.ndarray, sweeps: int) -> None:
        m = self.m
        _cd(m.colptr, m.rows, m.values, coords, self.w, self.r, self.col_sq, self.n, self.cfg.lam, sweeps)

    def _shift(self, coords: np.ndarray, delta: np.ndarray) -> None:
        _apply(self.m.colptr, self.m.rows, self.m.values, coords, delta, self.r)

    def _after_polish(self, top: np.ndarray) -> None:
        """The worst 64 solved exactly with their most correlated column, if above 0.95."""
        m = self.m
        worst = top[:PAIRS]
        unknown = worst[self.twin[worst] == -2]  # a column's twin never changes: found once
        self.twin[unknown] = twins(m.colptr, m.rows, m.values, *self.by_row, self.col_norm, unknown, TWIN)
        twin = self.twin[worst]
        paired = twin >= 0
        self.updates += pair_steps(m.colptr, m.rows, m.values, worst[paired], twin[paired], self.w, self.r,
                                   self.col_sq, self.n, self.cfg.lam, self.scratch)

    def _bound(self, grad: np.ndarray) -> tuple[float, float]:
        m, lam = self.m, self.cfg.lam
        primal, gap = duality_gap(m, self.w, self.r, self.xtr, lam)
        self.residuals = (self.residuals + [self.r.copy()])[-6:]
        dual = primal - gap
        r_acc = extrapolated(self.residuals)
        if r_acc is not None:  # a far better dual point than the residual's, near the optimum
            dual = max(dual, dual_value(m, r_acc, _xtr(m.colptr, m.rows, m.values, r_acc), lam))
        gap = primal - max(dual, self.best_dual)
        if worth_trying(gap, primal, self.cfg.tol):  # the support's own least squares
            dual = max(dual, support_dual(m, self.w, grad, lam, primal, self.cfg.tol))
        return primal, dual


def read_problem(path: str, loss: str, n_features: int | None = None) -> Matrix:
    """The data of ``paramserver lasso`` for ``loss``: the logistic loss's labels as ±1.  A
    worker forked by the driver takes the driver's copy (``handed``)."""
    m: Matrix | None = handed(path, loss)
    if m is not None and n_features in (None, m.shape[1]):
        return m
    m = read_libsvm_matrix(path, n_features)
    return signed_labels(m, path) if loss == "logistic" else m


def lasso_worker(client: Any, path: str, n_features: int, cfg: LassoConfig, workers: int,
                 checkpoints: RoundCheckpoints | None = None, resume: RoundResume | None = None) -> dict[str, Any]:
    """One worker of ``paramserver lasso``: read the data, run the rounds."""
    from paramserver.apps.rounds.program import run_rounds

    if joined_midway(client):
        return {"rank": client.rank, "joined_midway": True}
    m = read_problem(path, cfg.loss, n_features)
    program: ScheduledCD = (L1LRProgram if cfg.loss == "logistic" else LassoProgram)(client, m, cfg, client.rank,
                                                                                       workers)
    program.gated = gated(client, TABLE)  # BSP rounds gated on the servers (run_rounds)
    stats = run_rounds(client, program, rank=client.rank, workers=workers, max_rounds=cfg.max_rounds,
                       checkpoints=checkpoints, resume=resume)
    return {"rank": client.rank, "rounds": stats.rounds, "regroups": stats.regroups, "scheduled": stats.scheduled,
            "gated": program.gated,
            "checkpoints": stats.checkpoints,
            "phase_seconds": {**{k: round(v, 3) for k, v in stats.seconds.items()},
                              "check": round(program.check_seconds, 3)},
            "updates": program.updates, "objective": program.primal, "gap": program.gap, "checks": program.checks,
            "converged": program.solved, "stalled": program.stalled, "stuck": program.stuck,
            "kkt_skipped": program.kkt_skipped,
            "history": program.history}


def run_lasso(data: str, *, lam: float | None, lambda_ratio: float | None, tol: float, schedule: str,
              workers: int, servers: int, save: str | None, metrics_out: str | None,
              max_rounds: int = 200_000, checkpoints: CheckpointOptions = NO_CHECKPOINTS,
              cluster_options: dict[str, Any] | None = None, replicas: int = 1,
              allow_loss: bool = False, loss: str = "squared", kkt_filter: bool = True,
              intercept: bool = False, filters: Any = None, watch: Watch | None = None) -> dict[str, Any]:
    """``paramserver lasso``: solve, write ``save/coef.npy`` and the metrics; the report.
    ``checkpoints.every`` counts rounds.  ``replicas``: copies of every vnode; a server's death
    that loses data fails the run (``DataLossError``) unless ``allow_loss``."""
    check_lasso_flags(lam, lambda_ratio, tol, schedule, loss, intercept)
    check_outputs(save, metrics_out)
    checkpoints.check()
    t0 = time.perf_counter()
    # the data first, then the cluster: a driver with a second thread alive cannot fork its nodes
    # (``fork_safe``) and spawns fresh interpreters instead, which costs ~2 s of start-up here
    m = read_problem(data, loss)
    n, d = m.shape
    lmax, cfg = lasso_config(data, m, lam, lambda_ratio, tol, schedule, max_rounds, loss, kkt_filter, intercept)
    bits = max(int(3 * d - 1).bit_length(), 1)  # the table: latest values, and the two rounds' halves
    check_job_fits(data, d, workers, (1 << bits) * 16)
    with handed_down(data, loss, m), RoundsJob(servers=servers, workers=workers, cluster_options=cluster_options,
                                                allow_loss=allow_loss, replicas=replicas, filters=filters,
                                                watch=watch) as job:
        # what the table depends on; the workers, --tol and --schedule may change on a resume.  None for the
        # squared loss and no intercept: what a checkpoint written before --loss lacks, so it still resumes
        meta = {"app": "lasso", "rows": n, "features": d, "lambda": cfg.lam,
                "loss": loss if loss != "squared" else None, "intercept": True if intercept else None}
        cps, resume = checkpoints.plan(meta, rounds_a_unit=1)
        block = min(cfg.block_size, 1 << bits)
        job.tables(resume, lambda client: client.create_table(TABLE, dim=2, optimizer="sgd", key_bits=bits,
                                                              block_size=block, consistency="bsp",
                                                              **job.table_options))
        ran = job.run(lasso_worker, data, d, cfg, workers, cps, resume)
        keys, values = job.client.export_table(TABLE)
    w = np.zeros(d)
    inside = keys < d
    w[keys[inside].astype(np.int64)] = join64(values[inside])
    seconds = time.perf_counter() - t0
    head = min(ran.per_worker, key=lambda r: r["rank"])
    report = {**solution_report(m, w, cfg, head, seconds), "lambda_max": lmax, "rows": n, "features": d,
              "first_index": m.base, "workers": workers, "servers": servers, "workers_lost": ran.lost,
              "workers_joined_midway": ran.joined,
              "schedule": schedule, "tol": tol, **job.losses.report(), **job.wire(ran),
              "resumed_at_round": resume.round if resume else None, "checkpoints": head["checkpoints"],
              "history": head["history"]}
    if save:
        import os

        os.makedirs(save, exist_ok=True)
        np.save(os.path.join(save, "coef.npy"), w)
        if intercept:
            np.save(os.path.join(save, "intercept.npy"), np.array([report["intercept"]]))
    write_metrics(metrics_out, report)
    return report


def check_lasso_flags(lam: float | None, lambda_ratio: float | None, tol: float, schedule: str,
                      loss: str = "squared", intercept: bool = False) -> None:
    """``--lambda`` or ``--lambda-ratio``, ``--tol``, ``--schedule``, ``--loss`` and ``--intercept``,
    before any work.

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
    if loss not in LOSSES:
        raise ConfigError(f"--loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    if intercept and loss != "logistic":
        raise ConfigError("--intercept is for --loss logistic; for the squared loss centre y and the columns instead")


def lasso_config(data: str, m: Matrix, lam: float | None, lambda_ratio: float | None, tol: float, schedule: str,
                 max_rounds: int, loss: str = "squared", kkt_filter: bool = True,
                 intercept: bool = False) -> tuple[float, LassoConfig]:
    """``λ_max`` of the data read from ``data`` for ``loss`` and the solver's settings, λ
    given or ``λ_max / lambda_ratio``.

    Raises:
        ConfigError: ``Xᵀy`` is zero (every λ gives w = 0)."""
    lmax = logistic_lambda_max(m, intercept) if loss == "logistic" else lambda_max(m)
    if lmax == 0:
        raise ConfigError(f"{data}: Xᵀy is zero, so every λ gives w = 0; check the targets")
    if lam is None:
        assert lambda_ratio is not None
        lam = lmax / lambda_ratio
    return lmax, LassoConfig(lam=float(lam), tol=tol, schedule=schedule, max_rounds=max_rounds, loss=loss,
                             kkt_filter=kkt_filter, intercept=intercept)


def certificate(m: Matrix, w: np.ndarray, cfg: LassoConfig) -> tuple[float, float, float | None]:
    """``(objective, duality gap, intercept)`` at ``w``, for ``cfg.loss``; the intercept (None
    without one) at its best for ``w``."""
    if cfg.loss == "logistic":
        b, z = best_intercept(m.y, margin(m, w), 0.0) if cfg.intercept else (None, margin(m, w))
        primal, dual = logistic_bound(m.y, z, w, logistic_gradient(m, z), cfg.lam)
        return primal, max(primal - dual, 0.0), b
    r = _residual(m.colptr, m.rows, m.values, m.y, w)
    return *duality_gap(m, w, r, _xtr(m.colptr, m.rows, m.values, r), cfg.lam), None


def proven(primal: float, gap: float, tol: float) -> bool:
    """Whether the certificate proves the solution within ``tol`` of the optimum, relative
    (to the 2^-48 the table keeps a coefficient to): the report's ``converged``, never the
    workers' word alone (a job that lost a worker, or whose objective overflowed, is not)."""
    return bool(math.isfinite(primal) and gap <= (tol + 1e-12) * primal)


def solution_report(m: Matrix, w: np.ndarray, cfg: LassoConfig, head: dict[str, Any],
                    seconds: float) -> dict[str, Any]:
    """The report's first lines: the solution ``w`` (objective, duality gap, non-zeros) and
    how the rounds went, as the lowest-ranked worker (``head``) saw them: the active set
    after each check and the coordinate updates the KKT filter skipped (each one a push
    and a pull by every worker saved)."""
    primal, gap, b = certificate(m, w, cfg)
    # the workers' last check saw these coefficients (to the 2^-48 the table keeps): their dual point (an
    # extrapolated one) bounds the optimum from below too, and is the tighter certificate
    gap = min(gap, float(head["gap"]) + max(primal - float(head["objective"]), 0.0))
    return {"objective": primal, "duality_gap": gap, "relative_gap": gap / primal if primal else 0.0,
            "nonzeros": int(np.count_nonzero(w)), "seconds": seconds, "rounds": head["rounds"],
            "coordinate_updates": int(head["updates"]), "converged": proven(primal, gap, cfg.tol),
            "stalled": bool(head["stalled"]), "stuck": bool(head.get("stuck", False)),
            "phase_seconds": head["phase_seconds"], "lambda": cfg.lam,
            "loss": cfg.loss, "intercept": b, "kkt_filter": cfg.kkt_filter,
            "kkt_skipped": int(head.get("kkt_skipped", 0)),
            "active_set": [int(h.get("active_set", 0)) for h in head["history"]]}
