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
``regroup(round, live)`` carries on when workers die (see ``run_rounds``).

Between two rounds the parameters on the servers are consistent, so a checkpoint taken
there is a restart point: with ``RoundCheckpoints``, every ``every`` rounds each worker writes
its local state into the step (``program.save(round, step)``, optional), the first live
worker checkpoints the tables with the round in the manifest, and the rounds go on.  A
job started again with ``round_resume_point`` restores the tables, and ``run_rounds`` calls
``program.resume(round, step)`` on every worker, then runs from that round.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numba import njit

from paramserver.errors import CheckpointError, ConfigError, ParamServerError, check_flags
from paramserver.filters.packed import PackedRows

logger = logging.getLogger(__name__)


#: a round's push: its table, keys, rows (dense, or packed by their producer: ``filters/packed.py``) and op
Push = tuple[str, np.ndarray, "np.ndarray | PackedRows", str]


class Program(Protocol):
    def schedule(self, round_: int, workers: int) -> Sequence[np.ndarray]: ...

    def update(self, round_: int, mine: np.ndarray) -> Sequence[Push]: ...

    def observe(self, round_: int, assignment: Sequence[np.ndarray]) -> None: ...

    def converged(self, round_: int) -> bool: ...


@dataclass
class RoundStats:
    """What ``run_rounds`` did: rounds run, parameters scheduled, seconds in each phase."""

    rounds: int = 0
    scheduled: int = 0
    regroups: int = 0  # times workers were lost and the program carried on without them
    checkpoints: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: {"schedule": 0.0, "update": 0.0, "push": 0.0,
                                                               "barrier": 0.0, "observe": 0.0})


class WorkersLost(ParamServerError):
    """Workers died and the program has no ``regroup`` to carry on without them."""


@dataclass(frozen=True)
class RoundCheckpoints:
    """Checkpoint the rounds under ``url`` every ``every`` rounds (and after the last one),
    keeping the newest ``keep`` (0: all).  ``meta`` is what a resumed job must match (the
    app, its data's shape, the settings the layout depends on): it goes into the manifest."""

    url: str
    every: int
    keep: int = 3
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundResume:
    """A round checkpoint to go on from: its step, and the round to run next;
    ``allow_unverified``: it may be a first-format one (files without sha256)."""

    step: str
    round: int
    allow_unverified: bool = False


def round_resume_point(url: str, meta: dict[str, Any], allow_unverified: bool = False) -> RoundResume:
    """The newest complete round checkpoint under ``url`` (or the step ``url`` names); a
    first-format one (its files have no sha256) only with ``allow_unverified``.

    Raises:
        CheckpointError: none there, or one written by another app or for other data or
            settings (the differing values are named).
    """
    from paramserver.checkpoint import store as ckpt

    step = ckpt.resolve_step(ckpt.local_url(url, "--resume"))
    rounds = ckpt.read_manifest(step, allow_unverified).get("rounds")
    if not isinstance(rounds, dict) or not isinstance(rounds.get("round"), int):
        raise CheckpointError(f"{step} is not a checkpoint of scheduled rounds (lasso, mf, lda): it has no round "
                              "in its manifest; resume a train job with paramserver train --resume")
    saved = rounds.get("meta", {})
    differ = {k: (saved.get(k), v) for k, v in meta.items() if saved.get(k) != v}
    if differ:
        said = "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, (a, b) in differ.items())
        raise CheckpointError(f"{step} was written by another job ({said}); resume with the data and settings it "
                              "was written with, or start afresh with an empty --checkpoint-dir")
    return RoundResume(step, int(rounds["round"]), allow_unverified)


def check_checkpoint_dir(url: str | None, resume: RoundResume | None) -> None:
    """Before the work: a fresh job must not write its rounds among another job's (a
    resumed one may go on in its own folder).

    Raises:
        ConfigError: ``url`` already holds complete checkpoints and the job is not going on from them.
    """
    from paramserver.checkpoint import store as ckpt

    if url is None:
        return
    try:
        newest = ckpt.latest_step(url)
    except CheckpointError:
        return  # nothing complete there
    if resume is None or resume.step.rstrip("/").rsplit("/", 1)[0] != newest.rstrip("/").rsplit("/", 1)[0]:
        raise ConfigError(f"--checkpoint-dir {url} already holds checkpoints (the newest is {newest}); pass "
                          f"--resume {url} to go on from it, or give an empty folder")


@dataclass(frozen=True)
class CheckpointOptions:
    """The checkpoint flags of a scheduled app: ``--checkpoint-dir``, ``--checkpoint-every``
    (in the app's own unit: epochs, iterations, rounds), ``--keep-checkpoints``, ``--resume``,
    ``--allow-unverified-checkpoint`` (resume from a first-format checkpoint)."""

    dir: str | None = None
    every: int = 1
    keep: int = 3
    resume: str | None = None
    allow_unverified: bool = False

    def check(self) -> None:
        """Before any long work: the flags' values, the folder writable, a checkpoint to resume there.

        Raises:
            ConfigError, CheckpointError: said in one line, with the flag."""
        from paramserver.checkpoint import store as ckpt
        from paramserver.data.files import check_output

        check_flags([("--checkpoint-every", self.every, isinstance(self.every, int) and self.every >= 1,
                      "a whole number >= 1"),
                     ("--keep-checkpoints", self.keep, isinstance(self.keep, int) and self.keep >= 0,
                      "a whole number >= 0 (0: keep all)")])
        check_output(self.dir, "--checkpoint-dir", folder=True)
        if self.resume is not None:
            ckpt.resolve_step(self.resume)

    def plan(self, meta: dict[str, Any], rounds_a_unit: int) -> tuple[RoundCheckpoints | None, RoundResume | None]:
        """What ``run_rounds`` takes, once the data is read (``meta`` describes it and the
        settings a resumed job must share)."""
        from paramserver.checkpoint import store as ckpt

        point = round_resume_point(self.resume, meta, self.allow_unverified) if self.resume is not None else None
        # absolute, as the resumed step is: every worker and server then names the same folder
        url = ckpt.local_url(self.dir, "--checkpoint-dir") if self.dir else self.dir
        check_checkpoint_dir(url, point)
        cps = RoundCheckpoints(url, self.every * rounds_a_unit, self.keep, meta) if url else None
        return cps, point


NO_CHECKPOINTS = CheckpointOptions()


def _checkpoint(client: Any, program: Program, checkpoints: RoundCheckpoints, round_: int, live: list[int],
                rank: int, timeout_s: float) -> None:
    """Every worker saves its state into the step of round ``round_`` (the next to run);
    once all have, the first live worker checkpoints the tables and writes the manifest
    (last, so a step cut short is never resumed); nobody pushes before it is written."""
    from paramserver.checkpoint import store as ckpt

    step = ckpt.step_url(checkpoints.url, round_)
    save = getattr(program, "save", None)
    if save is not None:
        save(round_, step)
    present = client.barrier(timeout_s=timeout_s)
    # a worker that died before it saved: no step this time (the next round's barrier regroups)
    if rank == live[0] and not (present and set(live) - set(present)):
        client.checkpoint(checkpoints.url, step=step, extra={"rounds": {
            "round": round_, "live": live, "program": type(program).__name__, "meta": checkpoints.meta}})
        if checkpoints.keep:
            ckpt.prune(checkpoints.url, checkpoints.keep)
    client.barrier(timeout_s=timeout_s)


_clock = time.perf_counter  # the phases' seconds


def run_rounds(client: Any, program: Program, *, rank: int, workers: int, max_rounds: int,
               timeout_s: float = 600.0, checkpoints: RoundCheckpoints | None = None,
               resume: RoundResume | None = None, staleness: int = 0) -> RoundStats:
    """Run ``program`` on this worker (``rank`` of ``workers``) in rounds; every worker
    calls it with the same program and arguments.

    BSP (``staleness`` 0): after a round's pushes, a barrier, then ``observe``.  The
    barrier answers with the live workers.  When some are gone, every survivor calls
    ``program.regroup(round, live)`` (the surviving ranks, sorted) in place of that
    round's ``observe``: the program takes over the dead workers' part and makes the
    servers' state consistent again; from then on ``schedule`` deals to ``len(live)``
    workers, slot i being ``live[i]``.  A program without ``regroup`` stops with
    ``WorkersLost``.  Workers that join meanwhile are not part of the rounds.

    Gated BSP (a program whose ``gated`` is true: its tables are ``bsp`` on the servers):
    after a round's pushes the worker finishes its clock and observes at once; the
    servers answer its pulls of the next round once every live worker's pushes of this
    one are in (``consistency/clock.py``), which is the barrier's guarantee without its
    two round trips (the pushes' acknowledgements, then the scheduler).  It still arrives
    at each round's barrier, without waiting, and checks the answer (and the pushes'
    acknowledgements) a round later: a death is found there, by every survivor at the
    same round, and regrouped as above; the rounds between ran on counts the dead worker's
    last pushes may be missing from, which ``regroup`` rebuilds.  The round's pushes and
    clock go out as one message a server (``Client.together``), with observe's pulls if
    the program's ``observe_sends_only`` says observe waits on no answer.

    SSP (``staleness`` s >= 1): a worker arrives at round r's barrier without waiting
    (``Client.arrive``) and observes round r − s, once every worker has finished it, just
    before it schedules round r + 1: it runs at most s rounds ahead of the slowest, and
    every worker has observed exactly the same rounds when it schedules one, so schedules
    still agree.  Only for programs whose updates commute (``add``): two workers may then
    update one parameter from states s rounds apart.  Deaths are found at the same round
    by every survivor, which first waits out the rounds in flight, then regroups.  Before
    a checkpoint and at the end every round in flight is observed.

    With ``checkpoints``, the rounds are checkpointed every ``checkpoints.every`` rounds
    and after the last; with ``resume`` (the tables already restored by the driver),
    every worker calls ``program.resume(round, step)`` and the rounds go on from there.
    """
    rounds = _Rounds(client, program, rank, workers, timeout_s, staleness)
    start = 0
    if resume is not None:
        if not hasattr(program, "resume"):
            raise ParamServerError(f"{type(program).__name__} cannot resume from a checkpoint (it has no resume)")
        program.resume(resume.round, resume.step)
        start = resume.round
    for r in range(start, max_rounds):
        if program.converged(r):
            break
        rounds.run(r)
        job = getattr(client, "job", None)  # a simulated or in-process client may have no job API
        if job is not None and rank == min(rounds.live):  # the driver's progress line: rounds done, of how many
            job.report_progress(rounds=1, **({"rounds_max": max_rounds, "rounds_start": start} if r == start else {}))
        if checkpoints is not None and ((r + 1) % checkpoints.every == 0 or r + 1 == max_rounds):
            rounds.checkpoint(r, checkpoints)
    rounds.settle(max(start, rounds.stats.rounds + start - 1), 0)
    return rounds.stats


@dataclass
class _Arrival:
    """A round this worker arrived at: its barrier's answer to come (the live workers), the
    pushes not yet acknowledged (a gated round's), and whether it was observed already."""

    round: int
    assignment: Sequence[np.ndarray]
    answer: Any  # a future of the live ranks, or a call that waits for them
    pushes: list[Any] = field(default_factory=list)
    observed: bool = False


class _Rounds:
    """One worker's side of ``run_rounds`` between two rounds: the live workers, the rounds
    it arrived at and has not observed yet (oldest first, with the barrier's answer to
    come), and the stats."""

    def __init__(self, client: Any, program: Program, rank: int, workers: int, timeout_s: float,
                 staleness: int) -> None:
        # a gated program's tables are BSP on the servers: a pull waits there for every worker's clock
        self.gated = bool(getattr(program, "gated", False))
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ParamServerError(f"staleness must be a whole number >= 0 (0: BSP rounds), got {staleness!r}")
        if staleness and self.gated:
            raise ParamServerError("a gated program runs BSP rounds: its staleness is the servers' (0 here)")
        self.client, self.program, self.rank, self.timeout_s = client, program, rank, timeout_s
        self.staleness = staleness
        self.stats = RoundStats()
        self.live = list(range(workers))
        self.pending: deque[_Arrival] = deque()  # rounds arrived at, their barrier not yet answered
        # its observe only sends requests, waiting on none (it takes their answers in its next update)
        self.observe_sends_only = bool(getattr(program, "observe_sends_only", False))

    def run(self, r: int) -> None:
        """Round ``r``: schedule, update, push, then arrive at its barrier and observe what
        ``staleness`` lets be observed.  Every push is applied before the barrier; a gated
        program's (``gated``) before its next round's pulls are answered."""
        program, seconds = self.program, self.stats.seconds
        t0 = _clock()
        assignment = program.schedule(r, len(self.live))
        t1 = _clock()
        pushes = program.update(r, assignment[self.live.index(self.rank)])
        t2 = _clock()
        pushed = (self._end_gated if self.gated else self._end_behind_barrier)(r, assignment, pushes)
        seconds["push"] += pushed - t2
        seconds["schedule"] += t1 - t0
        seconds["update"] += t2 - t1
        self.stats.rounds += 1
        self.stats.scheduled += int(sum(len(a) for a in assignment))

    def _end_gated(self, r: int, assignment: Sequence[np.ndarray], pushes: Sequence[Push]) -> float:
        """The pushes, the clock and (if it only sends) observe's pulls as one message a
        server; observe; arrive at the barrier, whose answer says only who is alive: a
        death is found a round later.  Returns when the pushes went."""
        client, program = self.client, self.program
        with client.together():
            futures = self._push(pushes)
            client.clock()  # behind the pushes: the servers answer pulls of the next clock once all are in
            if self.observe_sends_only:
                program.observe(r, assignment)
        pushed = _clock()
        if not self.observe_sends_only:
            program.observe(r, assignment)
            self.stats.seconds["observe"] += _clock() - pushed
        self.pending.append(_Arrival(r, assignment, client.arrive(r), futures, observed=True))
        self.settle(r, 1)
        return pushed

    def _end_behind_barrier(self, r: int, assignment: Sequence[np.ndarray], pushes: Sequence[Push]) -> float:
        """Every push acknowledged, then arrive at the barrier (BSP: wait there; SSP: go on)
        and observe what ``staleness`` lets be observed.  Returns when the pushes were in."""
        client = self.client
        for f in self._push(pushes):
            f.result(timeout=self.timeout_s)
        pushed = _clock()
        answer = client.arrive(r) if self.staleness else functools.partial(client.barrier, timeout_s=self.timeout_s)
        self.pending.append(_Arrival(r, assignment, answer))
        self.settle(r, self.staleness)
        return pushed

    def _push(self, pushes: Sequence[Push]) -> list[Any]:
        """Send the round's pushes (those with keys): their futures."""
        return [self.client.push(table, keys, values, op=op, distinct=True) for table, keys, values, op in pushes
                if len(keys)]

    def settle(self, r: int, upto: int) -> None:
        """Observe the rounds in flight, oldest first, until at most ``upto`` are left; or
        regroup, as of round ``r``, if a barrier's answer lacks a worker."""
        seconds = self.stats.seconds
        while len(self.pending) > upto:
            arrival = self.pending.popleft()
            t = _clock()
            for f in arrival.pushes:
                f.result(timeout=self.timeout_s)
            answer = arrival.answer
            present = answer() if callable(answer) else answer.result(timeout=self.timeout_s)
            seconds["barrier"] += _clock() - t
            gone = [w for w in self.live if present and w not in present]
            t = _clock()
            if gone:
                self._regroup(r, arrival.round, gone)
            elif not arrival.observed:
                self.program.observe(arrival.round, arrival.assignment)
            seconds["observe"] += _clock() - t

    def _regroup(self, r: int, q: int, gone: list[int]) -> None:
        """Workers ``gone`` missed round ``q``'s barrier: wait out the rounds in flight (every
        survivor arrived at them before it saw the death), then ``program.regroup``."""
        regroup = getattr(self.program, "regroup", None)
        if regroup is None:
            raise WorkersLost(f"worker(s) {gone} died in round {q}; {type(self.program).__name__} cannot go on "
                              "without them (it has no regroup)")
        for later in self.pending:  # every survivor arrived at these before it saw the death
            for f in later.pushes:
                f.result(timeout=self.timeout_s)
            later.answer.result(timeout=self.timeout_s)
        self.pending.clear()
        self.live = [w for w in self.live if w not in gone]
        regroup(r, self.live)
        self.stats.regroups += 1

    def checkpoint(self, r: int, checkpoints: RoundCheckpoints) -> None:
        """After round ``r``: observe every round in flight, then checkpoint (``_checkpoint``)."""
        self.settle(r, 0)
        t = _clock()
        _checkpoint(self.client, self.program, checkpoints, r + 1, self.live, self.rank, self.timeout_s)
        self.stats.seconds["checkpoint"] = self.stats.seconds.get("checkpoint", 0.0) + _clock() - t
        self.stats.checkpoints += 1


def gated(client: Any, *tables: str) -> bool:
    """Whether ``tables`` are all ``bsp`` on the servers, so that a program on them may run
    gated rounds (``run_rounds``): a job's own are made so; one restored from an older
    checkpoint may not be."""
    specs = client.tables()
    return all(specs[t].consistency == 0 for t in tables)


def joined_midway(client: Any) -> bool:
    """True on a worker that joined a scheduled job after it began (``LocalCluster.add_worker``
    while it runs): the parts were dealt at the start and it has none, so it leaves the
    cluster at once (the rounds' barriers stop counting it), and says so.  Call it first in
    a job's worker function, and return without work if it is True."""
    if not getattr(client, "joined_midway", False):
        return False
    logger.warning("worker rank %d joined after the scheduled rounds began: their parts were dealt at the start, "
                   "so it has none; it leaves the cluster (add workers between scheduled jobs)", client.rank)
    client.close()
    return True


def took_part(results: list[Any]) -> tuple[list[Any], int]:
    """The results of the workers that took part in a scheduled job, and how many joined
    midway and left (``joined_midway``)."""
    kept = [r for r in results if not (isinstance(r, dict) and r.get("joined_midway"))]
    return kept, len(results) - len(kept)


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
