"""Scheduled model parallelism (level 4, Petuum/STRADS style): rounds in which a
*schedule* chooses which parameters each worker may update, so that updates made at the
same time do not conflict.

A program is three small functions (``Program``):

- ``schedule(round, workers)``: the blocks (or coordinates) each worker updates this
  round, chosen by priority and checked against each other for interference.  It runs
  on every worker, with the same inputs, so every worker knows the whole assignment
  without a coordinator round trip: it must be deterministic (seed any sampling with
  the round) and depend only on what all workers share (the pulled parameters, the
  data, the round).
- ``update(round, mine)``: on one worker, with its data, for the parameters the
  schedule gave it; returns what to push: ``(table, keys, values, op)``.
- ``observe(round, assignment)``: after the round's barrier, on every worker: pull
  what the round changed (the schedule says exactly which parameters that is) and bring
  local state (a residual, counts) up to date.  This is where results are aggregated.

``run_rounds`` drives them: schedule, update, push (exactly once, replicated), barrier
(BSP), observe, until ``converged`` says so or ``max_rounds``.  A fourth, optional,
``regroup(round, live)`` carries on when workers die (see ``run_rounds``).  Between two rounds the
parameters on the servers are consistent, so a checkpoint taken there
(``Client.checkpoint``) is a restart point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numba import njit

from paramserver.errors import ParamServerError


class Program(Protocol):
    def schedule(self, round_: int, workers: int) -> Sequence[np.ndarray]: ...

    def update(self, round_: int, mine: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray, str]]: ...

    def observe(self, round_: int, assignment: Sequence[np.ndarray]) -> None: ...

    def converged(self, round_: int) -> bool: ...


@dataclass
class RoundStats:
    """What ``run_rounds`` did: rounds run, parameters scheduled, seconds in each phase."""

    rounds: int = 0
    scheduled: int = 0
    regroups: int = 0  # times workers were lost and the program carried on without them
    seconds: dict[str, float] = field(default_factory=lambda: {"schedule": 0.0, "update": 0.0, "push": 0.0,
                                                               "barrier": 0.0, "observe": 0.0})


class WorkersLost(ParamServerError):
    """Workers died and the program has no ``regroup`` to carry on without them."""


def run_rounds(client: Any, program: Program, *, rank: int, workers: int, max_rounds: int,
               timeout_s: float = 600.0) -> RoundStats:
    """Run ``program`` on this worker (``rank`` of ``workers``) in BSP rounds; every
    worker calls it with the same program and arguments.

    The barrier answers with the live workers.  When some are gone, every survivor calls
    ``program.regroup(round, live)`` (the surviving ranks, sorted) in place of that
    round's ``observe``: the program takes over the dead workers' part and makes the
    servers' state consistent again; from then on ``schedule`` deals to ``len(live)``
    workers, slot i being ``live[i]``.  A program without ``regroup`` stops with
    ``WorkersLost``.  Workers that join meanwhile are not part of the rounds.
    """
    import time

    stats = RoundStats()
    clock = time.perf_counter
    live = list(range(workers))
    for r in range(max_rounds):
        if program.converged(r):
            break
        t0 = clock()
        assignment = program.schedule(r, len(live))
        t1 = clock()
        pushes = program.update(r, assignment[live.index(rank)])
        t2 = clock()
        futures = [client.push(table, keys, values, op=op, distinct=True) for table, keys, values, op in pushes
                   if len(keys)]
        for f in futures:
            f.result(timeout=timeout_s)
        t3 = clock()
        present = client.barrier(timeout_s=timeout_s)
        t4 = clock()
        gone = [w for w in live if present and w not in present]
        if gone:
            regroup = getattr(program, "regroup", None)
            if regroup is None:
                raise WorkersLost(f"worker(s) {gone} died in round {r}; {type(program).__name__} cannot go on "
                                  "without them (it has no regroup)")
            live = [w for w in live if w not in gone]
            regroup(r, live)
            stats.regroups += 1
        else:
            program.observe(r, assignment)
        t5 = clock()
        stats.rounds += 1
        stats.scheduled += int(sum(len(a) for a in assignment))
        for name, a, b in (("schedule", t0, t1), ("update", t1, t2), ("push", t2, t3), ("barrier", t3, t4),
                           ("observe", t4, t5)):
            stats.seconds[name] += b - a
    return stats


def adopt(owner: list[int], live: list[int]) -> list[int]:
    """Who holds each part once only ``live`` are left: a survivor keeps its parts; each
    part of a dead worker goes, in order, to the survivor holding fewest (the lowest
    rank on a tie).  Deterministic, so every survivor computes the same."""
    out = list(owner)
    load = {w: sum(o == w for o in owner) for w in live}
    for p, o in enumerate(owner):
        if o not in load:
            heir = min(live, key=lambda w: (load[w], w))
            out[p] = heir
            load[heir] += 1
    return out


@njit(nogil=True, cache=True)
def _lightest_first(order, counts, parts):  # type: ignore[no-untyped-def]
    group = np.empty(order.shape[0], np.int64)
    load = np.zeros(parts, np.int64)
    for t in range(order.shape[0]):
        g = np.argmin(load)
        group[order[t]] = g
        load[g] += counts[order[t]]
    return group


def balanced_groups(counts: np.ndarray, parts: int) -> np.ndarray:
    """The group (of ``parts``) of each entity: largest first, each to the group with the
    least weight so far (LPT): every group gets a like sum of ``counts`` (ratings, tokens)."""
    order = np.argsort(-counts, kind="stable")
    return np.asarray(_lightest_first(order, counts.astype(np.int64), parts))
