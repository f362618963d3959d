"""A nemesis schedule: faults one after another, drawn from a seed, written as JSON so that a
failing seed replays exactly (``paramserver nemesis --replay FILE``).

The roles of the hosts are fixed: host 0 runs the scheduler, hosts ``1..servers`` a server each,
the last host the workload's client.  A fault is healed before the next begins, with a gap
between, except that a second fault may fall on another server while one lasts (``draw``'s
``overlap``): silent together, the detector must fence rather than write them off.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field

KINDS = ("isolate", "halves", "oneway", "oneway-in", "scheduler-cut", "loss", "slow", "delay", "pause", "kill",
         "isolate-client")
#: what a training job is put through by default: not the faults that cut its own host off.  A
#: worker cut from the scheduler past the heartbeat timeout is declared dead by design, and a job
#: whose every worker is dead fails rather than waits (``--kinds`` puts them back)
TRAINING_KINDS = tuple(k for k in KINDS if k not in ("halves", "isolate-client"))
WORKLOADS = ("counters", "train", "stream")


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the workload's first acknowledged add
    kind: str  # one of KINDS
    hosts: tuple[int, ...]  # the host(s) it falls on (halves: the first half)
    duration: float  # seconds until it is healed (kill: until the server is started again)
    arg: int = 0  # loss: percent; delay: ms each way (jitter a fifth of it); pause: 1 when the scheduler is paused


@dataclass(frozen=True)
class Plan:
    seed: int
    servers: int
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    workload: str = "counters"  # one of WORKLOADS: what the client host runs (``jobs.py``)

    @property
    def hosts(self) -> int:
        return self.servers + 2

    @property
    def client_host(self) -> int:
        return self.servers + 1

    @property
    def end(self) -> float:
        return max((f.at + f.duration for f in self.faults), default=0.0)

    def to_json(self) -> str:
        return json.dumps({"seed": self.seed, "servers": self.servers, "workload": self.workload,
                           "faults": [asdict(f) for f in self.faults]})

    @staticmethod
    def from_json(text: str) -> Plan:
        try:
            raw = json.loads(text)
            faults = tuple(Fault(float(f["at"]), str(f["kind"]), tuple(int(h) for h in f["hosts"]),
                                 float(f["duration"]), int(f.get("arg", 0))) for f in raw["faults"])
            plan = Plan(int(raw["seed"]), int(raw["servers"]), faults, str(raw.get("workload", "counters")))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"not a nemesis schedule ({e!r}): replay the JSON a run wrote (its 'plan')") from e
        if plan.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {plan.workload!r} in the schedule: one of {', '.join(WORKLOADS)}")
        for f in plan.faults:
            if f.kind not in KINDS:
                raise ValueError(f"unknown fault kind {f.kind!r} in the schedule: one of {', '.join(KINDS)}")
        return plan


OVERLAPPING = ("isolate", "oneway", "oneway-in", "loss", "slow", "delay", "pause", "kill")  # on one server's host


KILL_SPACING_S = 20.0  # a kill, then detection (5 s) and the repair's copies, before the next may come
#: faults that can get a server written off: a kill, or a server's host silenced (its heartbeats
#: stopped, or stalled behind TCP's retransmissions) for ``SILENT_S`` or more: with TCP's
#: backoff after the heal, such a silence can reach the 5 s heartbeat timeout
SILENCING = ("isolate", "oneway", "oneway-in", "pause", "halves")
SILENT_S = 2.0
#: a second failure that begins this soon after one began comes before the first one's earliest
#: verdict (its last heartbeat, at most 0.5 s before it, plus the 5 s timeout, less a margin):
#: at that deadline the second server has not beaten since, so the detector fences the first
#: rather than writing it off (what overlapping faults test) ...
FENCED_S = 4.0
#: ... and one that begins this long after it comes once the first was written off (5-6.5 s
#: after its start, TCP's backoff included) and its vnodes copied again (the counters' tables
#: copy in milliseconds): between the two, the second server may hold the only copies
REPAIRED_S = 10.0


def draw(seed: int, servers: int = 3, window_s: float = 20.0, longest_s: float = 6.0,
         kinds: tuple[str, ...] = KINDS, overlap: float = 0.3, workload: str = "counters") -> Plan:
    """Faults from ``seed`` until ``window_s``: each lasts 1..``longest_s`` seconds (a pause up to
    15 s when ``longest_s`` allows), with 1.5..3 s of quiet after it.  With probability
    ``overlap`` a second fault on another server's host begins while a fault on one server's host
    lasts.  Kills are ``KILL_SPACING_S`` apart, and other failures (``fails``) begin within
    ``FENCED_S`` of one or ``REPAIRED_S`` after it: two servers lost, the second before the
    first one's repair, lose at replicas 2 what the two held, by design (a double failure).
    Seed 9025 drew a one-way cut of a server for 5.7 s and a kill of another 5.6 s into it,
    just after the first was written off: 110 of the replicas-2 table's keys lost their adds,
    loudly (the client's ``DataLossError``), which the spacing of kills alone had not ruled out."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    t = 1.0
    while t < window_s:
        first = _shortened(rng, _one(rng, _allowed(kinds, t, faults), servers, t, longest_s), faults)
        faults.append(first)
        end = first.at + first.duration
        second = tuple(k for k in kinds if k in OVERLAPPING)
        if first.kind in OVERLAPPING and first.hosts[0] != 0 and second and servers > 1 and rng.random() < overlap:
            at = first.at + rng.uniform(0.0, first.duration)
            f = _shortened(rng, _one(rng, _allowed(second, at, faults), servers, at, longest_s, avoid=first.hosts[0]),
                           faults)
            faults.append(f)
            end = max(end, f.at + f.duration)
        t = end + rng.uniform(1.51, 3.0)  # 1.5 s of quiet at least, once ``at`` is rounded
    return Plan(seed, servers, tuple(sorted(faults, key=lambda f: f.at)), workload)


def fails(f: Fault) -> bool:
    """Whether fault ``f`` can get a server written off: a kill, or a server silenced ``SILENT_S``
    or more (not the scheduler paused, nor cut: every server is then silent, and fenced)."""
    return f.kind == "kill" or (f.kind in SILENCING and f.duration >= SILENT_S and f.hosts != (0,))


def _allowed(kinds: tuple[str, ...], at: float, before: list[Fault]) -> tuple[str, ...]:
    """``kinds``, without a kill where one at ``at`` would fail too soon after a failure of
    ``before`` (``_apart``); all of them where that leaves none (``--kinds kill``)."""
    kill = Fault(at, "kill", (), 0.0)
    if all(_apart(e, kill) for e in before if fails(e)):
        return kinds
    return tuple(k for k in kinds if k != "kill") or kinds


def _shortened(rng: random.Random, f: Fault, before: list[Fault]) -> Fault:
    """``f``, or where a silence would fail too soon after a failure of ``before`` (``_apart``),
    the same silence cut short of ``SILENT_S``."""
    if f.kind == "kill" or not fails(f) or all(_apart(e, f) for e in before if fails(e)):
        return f
    return Fault(f.at, f.kind, f.hosts, round(rng.uniform(1.0, SILENT_S - 0.01), 2), f.arg)


def _apart(e: Fault, f: Fault) -> bool:
    """Whether failure ``f`` comes far enough from failure ``e`` (before it): two kills
    ``KILL_SPACING_S`` apart; otherwise within ``FENCED_S`` (fenced together: the silenced
    server comes back) or ``REPAIRED_S`` on."""
    gap = f.at - e.at
    if e.kind == f.kind == "kill":
        return gap >= KILL_SPACING_S
    return gap <= FENCED_S or gap >= REPAIRED_S


def _one(rng: random.Random, kinds: tuple[str, ...], servers: int, at: float, longest_s: float,
         avoid: int = -1) -> Fault:
    kind = rng.choice(kinds)
    duration = round(rng.uniform(1.0, longest_s), 2)
    arg = 0
    on = [h for h in range(1, servers + 1) if h != avoid]
    if kind == "halves":
        everyone = list(range(servers + 2))
        hosts = tuple(sorted(rng.sample(everyone, rng.randint(1, len(everyone) - 1))))
    elif kind == "isolate-client":
        hosts = (servers + 1,)
    elif kind == "scheduler-cut":
        hosts = (0,)
    else:
        hosts = (rng.choice(on),)
    if kind == "loss":
        arg = rng.choice((10, 20, 40))
    if kind == "delay":
        arg = rng.choice((5, 25, 50))
    if kind == "pause":
        duration = round(rng.uniform(1.0, max(longest_s, min(15.0, 2.5 * longest_s))), 2)
        if avoid < 0 and rng.random() < 0.2:
            hosts, arg = (0,), 1  # the scheduler itself
    return Fault(round(at, 2), kind, hosts, duration, arg)
