"""A nemesis schedule: faults one after another, drawn from a seed, written as JSON so that a
failing seed replays exactly (``paramserver nemesis --replay FILE``).

The roles of the hosts are fixed: host 0 runs the scheduler, hosts ``1..servers`` a server each,
the last host the workload's client.  One fault at a time, each healed before the next, with a
gap between, so that with replicas 2 no two servers are down at once.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field

KINDS = ("isolate", "halves", "oneway", "scheduler-cut", "loss", "slow", "pause", "kill", "isolate-client")


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the workload's first acknowledged add
    kind: str  # one of KINDS
    hosts: tuple[int, ...]  # the host(s) it falls on (halves: the first half)
    duration: float  # seconds until it is healed (kill: until the server is started again)
    arg: int = 0  # loss: percent; pause: 1 when the scheduler is paused


@dataclass(frozen=True)
class Plan:
    seed: int
    servers: int
    faults: tuple[Fault, ...] = field(default_factory=tuple)

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
        return json.dumps({"seed": self.seed, "servers": self.servers, "faults": [asdict(f) for f in self.faults]})

    @staticmethod
    def from_json(text: str) -> Plan:
        try:
            raw = json.loads(text)
            faults = tuple(Fault(float(f["at"]), str(f["kind"]), tuple(int(h) for h in f["hosts"]),
                                 float(f["duration"]), int(f.get("arg", 0))) for f in raw["faults"])
            plan = Plan(int(raw["seed"]), int(raw["servers"]), faults)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"not a nemesis schedule ({e!r}): replay the JSON a run wrote (its 'plan')") from e
        for f in plan.faults:
            if f.kind not in KINDS:
                raise ValueError(f"unknown fault kind {f.kind!r} in the schedule: one of {', '.join(KINDS)}")
        return plan


def draw(seed: int, servers: int = 3, window_s: float = 20.0, longest_s: float = 6.0,
         kinds: tuple[str, ...] = KINDS) -> Plan:
    """Faults from ``seed`` until ``window_s``: each lasts 1..``longest_s`` seconds (a pause up to
    15 s when ``longest_s`` allows), with 1.5..3 s of quiet after it."""
    rng = random.Random(seed)
    servers_hosts = list(range(1, servers + 1))
    everyone = list(range(servers + 2))
    faults: list[Fault] = []
    t = 1.0
    while t < window_s:
        kind = rng.choice(kinds)
        duration = round(rng.uniform(1.0, longest_s), 2)
        arg = 0
        if kind == "halves":
            half = rng.sample(everyone, rng.randint(1, len(everyone) - 1))
            hosts = tuple(sorted(half))
        elif kind == "isolate-client":
            hosts = (servers + 1,)
        elif kind == "scheduler-cut":
            hosts = (0,)
        else:
            hosts = (rng.choice(servers_hosts),)
        if kind == "loss":
            arg = rng.choice((10, 20, 40))
        if kind == "pause":
            duration = round(rng.uniform(1.0, max(longest_s, min(15.0, 2.5 * longest_s))), 2)
            if rng.random() < 0.2:
                hosts, arg = (0,), 1  # the scheduler itself
        faults.append(Fault(round(t, 2), kind, hosts, duration, arg))
        t += duration + rng.uniform(1.5, 3.0)
    return Plan(seed, servers, tuple(faults))
