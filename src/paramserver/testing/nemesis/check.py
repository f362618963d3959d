"""What a nemesis run must show, from the workload's log and the values read back after the heal:

- ``lost``: a key holds fewer adds than were acknowledged;
- ``twice``: a key holds more than the acknowledged adds and the unknown ones together (an add
  applied twice);
- ``stale``: a read, after an add was acknowledged, that does not see it (read-your-writes,
  through a failover too);
- ``phantom``: a read that sees more adds than were made;
- ``hang``: an add or a read that waited ``WAIT_S`` or more for an answer;
- ``stuck``: no add acknowledged within ``progress_s`` of a heal, before the next fault began
  (or before the run's deadline, after the last one).

The time from each heal to the next acknowledged add is reported whether or not it is a violation.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from typing import Any

from paramserver.testing.nemesis.workload import TABLES, WAIT_S


class Stuck(RuntimeError):
    """A run waited past a deadline; the message names what it waited on."""


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)
    unknown: dict[str, int] = field(default_factory=dict)
    recovery_s: list[float | None] = field(default_factory=list)  # a heal each, None: no add before the next fault
    model: dict[str, float] = field(default_factory=dict)  # a training job's log loss, the fault-free one's, allowed

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> dict[str, Any]:
        known = [r for r in self.recovery_s if r is not None]
        return {"ok": self.ok, "violations": self.violations, "acked": self.acked, "unknown": self.unknown,
                "recovery_s": self.recovery_s, "max_recovery_s": max(known, default=None)} \
            | ({"model": self.model} if self.model else {})


def read_log(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def counters(lines: list[dict[str, Any]], values: dict[str, list[float]], verdict: Verdict) -> None:
    for table in TABLES:
        mine = [x for x in lines if x.get("table") == table and "ok" in x]
        ok = sum(1 for x in mine if x["ok"])
        unknown = len(mine) - ok
        verdict.acked[table], verdict.unknown[table] = ok, unknown
        held = values.get(table, [])
        low = [i for i, v in enumerate(held) if v < ok]
        high = [i for i, v in enumerate(held) if v > ok + unknown]
        if low:
            verdict.violations.append(f"lost: {len(low)} key(s) of {table} hold fewer adds than the {ok} acknowledged "
                                      f"(key #{low[0]} holds {held[low[0]]:g})")
        if high:
            verdict.violations.append(f"twice: {len(high)} key(s) of {table} hold more than the {ok} acknowledged and "
                                      f"{unknown} unknown adds (key #{high[0]} holds {held[high[0]]:g})")
        for x in mine:
            if x.get("wait", 0.0) >= WAIT_S:
                verdict.violations.append(f"hang: an add to {table} waited {x['wait']:.1f} s for an answer "
                                          f"(answered at t={x['t']:.1f}: {x.get('why', 'ok')})")


def reads(lines: list[dict[str, Any]], verdict: Verdict) -> None:
    stale = [x for x in lines if "read" in x and x["read"][0] < x["acked"]]
    phantom = [x for x in lines if "read" in x and x["read"][1] > x["acked"] + x["unknown"]]
    for name, bad, what in (("stale", stale, "does not see every acknowledged add"),
                            ("phantom", phantom, "sees more adds than were made")):
        if bad:
            x = bad[0]
            verdict.violations.append(f"{name}: {len(bad)} read(s) {what} (first: {x['table']} at t={x['t']:.1f} "
                                      f"read {x['read'][0]:g}..{x['read'][1]:g} after {x['acked']} acknowledged "
                                      f"and {x['unknown']} unknown adds)")
    for x in lines:
        if "read" in x and x.get("wait", 0.0) >= WAIT_S:
            verdict.violations.append(f"hang: a read of {x['table']} waited {x['wait']:.1f} s")


def first_progress(lines: list[dict[str, Any]], t: float) -> float | None:
    """When the workload first made progress after ``t`` (an add acknowledged, examples
    trained), or None: not yet.  A job whose rows were all trained (its ``finished`` line)
    has no progress left to make, even if that was before ``t``: a heal that came while it
    scored its test set and left is owed nothing (the job ended, and ``run`` drops the heals
    past its end)."""
    later = [x["t"] for x in lines if x.get("ok") and x["t"] > t]
    if later:
        return float(min(later))
    done = [x["t"] for x in lines if x.get("finished")]
    return float(min(done)) if done else None


def progress(lines: list[dict[str, Any]], heals: list[float], next_fault: list[float], progress_s: float,
             verdict: Verdict) -> None:
    """For each heal at ``heals[i]``: the first acknowledged add after it, which must come within
    ``progress_s`` unless the next fault (``next_fault[i]``) began before that."""
    acks = sorted(x["t"] for x in lines if x.get("ok"))
    for healed, until in zip(heals, next_fault, strict=True):
        i = bisect.bisect_right(acks, healed)
        first = acks[i] if i < len(acks) else None
        gap = None if first is None or first > until else round(first - healed, 3)
        verdict.recovery_s.append(gap)
        if (gap is None and until - healed >= progress_s) or (gap is not None and gap > progress_s):
            verdict.violations.append(f"stuck: no add acknowledged within {progress_s:g} s of the heal at "
                                      f"t={healed:.1f} (first after it: "
                                      f"{'none' if first is None else f'{first - healed:.1f} s'})")
