"""Vector clocks and the staleness gate (sans-IO: no sockets, no time source).

A worker's clock is the number of ``clock()`` calls it completed.  A server keeps every
live worker's clock; a pull issued at clock ``c`` on a table of staleness ``s`` may be
answered once ``min(clocks) >= c - s``: by then every live worker has finished (and, as
ticks travel behind pushes on one FIFO channel, this server has applied) all its
updates of clocks ``<= c - s - 1``.  ``s = 0`` is BSP, ``s = inf`` (``None``) ASP.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from paramserver.errors import ProtocolError


def parse_consistency(text: str | int | float | None) -> float:
    """``"bsp"`` → 0, ``"asp"``/None → inf, ``"ssp:3"``/3 → 3."""
    from paramserver.errors import ConfigError

    if text is None:
        return math.inf
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    elif isinstance(text, str):
        t = text.strip().lower()
        if t == "bsp":
            return 0.0
        if t == "asp":
            return math.inf
        if not t.startswith("ssp:"):
            raise ConfigError(f"consistency must be bsp, asp or ssp:S (S a whole number >= 0), got {text!r}")
        try:
            value = float(int(t[4:]))
        except ValueError:
            raise ConfigError(f"consistency {text!r}: S in ssp:S must be a whole number >= 0") from None
    else:
        raise ConfigError(f"consistency must be bsp, asp, ssp:S or a number, got {text!r}")
    if math.isnan(value) or value < 0 or (math.isfinite(value) and value != int(value)):
        raise ConfigError(f"staleness must be a whole number >= 0 or inf, got {text!r}")
    return value


@dataclass
class VectorClock:
    """Clocks of the live workers, as one server has seen them.

    A worker that leaves for a while (idle, waiting for a data shard; the scheduler's
    coordinated checkpoint drains them all) comes back at the members' minimum, but never
    below the clock it had already ticked here: its pulls carry its own clock, and ticks
    it sent are not sent again, so a worker put back lower waits for ever on itself (and,
    once the others are within S of it, they on it).
    """

    clocks: dict[int, int] = field(default_factory=dict)
    # the minimum the members had reached when the last one left: with no member, the
    # workers come back at it (not at 0, which only the first ever starts at)
    floor: int = 0
    # the last clock each worker that left ticked (a tick may come after it left): it comes back at least there
    away: dict[int, int] = field(default_factory=dict)

    def min(self) -> float:
        return min(self.clocks.values()) if self.clocks else math.inf

    def low(self) -> int:
        """Where a joiner starts at least: the members' minimum, or, with none, the floor."""
        return int(self.min()) if self.clocks else self.floor

    def join(self, worker: int, low: int | None = None) -> int:
        """Add a worker at the current minimum (``low``) or at the clock it had already
        ticked, whichever is higher: it cannot drag others back, nor itself."""
        if worker not in self.clocks:
            self.clocks[worker] = max(self.low() if low is None else low, self.away.pop(worker, 0))
        return self.clocks[worker]

    def set_members(self, workers: list[int]) -> None:
        for w in [w for w in self.clocks if w not in workers]:
            self.leave(w, forget=False)
        low = self.low()  # the joiners of one change start from the same minimum
        for w in workers:
            self.join(w, low)

    def tick(self, worker: int, clock: int) -> None:
        """Advance a member's clock; a tick from a non-member (one that left, or was
        declared dead, while its tick travelled) must not make it a member again (one
        that left idle keeps it for when it comes back)."""
        if worker in self.clocks:
            self.clocks[worker] = max(self.clocks[worker], clock)
        elif worker in self.away:
            self.away[worker] = max(self.away[worker], clock)

    def leave(self, worker: int, forget: bool = True) -> None:
        """A worker leaves the vector: for good (dead) or, ``forget=False``, for a while."""
        if worker in self.clocks:  # the minimum only grows while there are members: kept for when none is left
            self.floor = max(self.floor, int(self.min()))
            clock = self.clocks.pop(worker)
            if not forget:
                self.away[worker] = clock
        if forget:
            self.away.pop(worker, None)


MAX_PARKED_PER_PEER = 256  # pulls of one peer waiting for the staleness bound, at most
MAX_PARKED = 16_384  # on one server, at most


@dataclass
class Parked:
    clock: int
    staleness: float
    since: float
    request: Any
    peer: Any = None  # who sent it (its connection's identity)


@dataclass
class StalenessGate:
    """Parks pulls until the vector clock allows them; records what readers saw."""

    vector: VectorClock = field(default_factory=VectorClock)
    parked: list[Parked] = field(default_factory=list)
    staleness_seen: Counter[int] = field(default_factory=Counter)  # c - min at answer time
    parked_count: int = 0
    parked_seconds: float = 0.0
    max_gap: int = 0  # largest (reader's clock - slowest live clock) ever answered

    def ready(self, clock: int, staleness: float) -> bool:
        return math.isinf(staleness) or self.vector.min() >= clock - staleness

    def admit(self, clock: int, staleness: float, request: Any, now: float, peer: Any = None) -> bool:
        """True: answer now (and it is recorded); False: the request was parked.  A peer
        may have ``MAX_PARKED_PER_PEER`` pulls parked, the server ``MAX_PARKED`` in all (a
        client has a few in flight; a pull with a clock far ahead would wait for ever and
        keep its arrays): past them ``ProtocolError``."""
        if self.ready(clock, staleness):
            self._record(clock)
            return True
        mine = sum(1 for p in self.parked if p.peer == peer) if peer is not None else 0
        if mine >= MAX_PARKED_PER_PEER or len(self.parked) >= MAX_PARKED:
            raise ProtocolError(f"pull at clock {clock}: {mine} pulls of this peer ({len(self.parked)} in all) wait "
                                f"already for the slowest worker (clock {self.vector.low()}, staleness {staleness:g}); "
                                f"at most {MAX_PARKED_PER_PEER} a peer: is the reader's clock far ahead of its ticks?")
        self.parked.append(Parked(clock, staleness, now, request, peer))
        self.parked_count += 1
        return False

    def drop_reader(self, reader: int, of: Callable[[Any], Any]) -> int:
        """Forget the parked pulls of ``reader`` (a worker that died: nobody waits for the
        answers, and they hold their arrays); ``of(request)`` says whose a request is."""
        keep = [p for p in self.parked if of(p.request) != reader]
        dropped, self.parked = len(self.parked) - len(keep), keep
        return dropped

    def release(self, now: float) -> list[Any]:
        """Requests that may be answered now that clocks moved (in arrival order)."""
        out, keep = [], []
        for p in self.parked:
            if self.ready(p.clock, p.staleness):
                self.parked_seconds += now - p.since
                self._record(p.clock)
                out.append(p.request)
            else:
                keep.append(p)
        self.parked = keep
        return out

    def _record(self, clock: int) -> None:
        m = self.vector.min()
        gap = 0 if math.isinf(m) else max(0, clock - int(m))
        self.staleness_seen[gap] += 1
        self.max_gap = max(self.max_gap, gap)

    def telemetry(self) -> dict[str, Any]:
        return {"staleness_histogram": {str(k): v for k, v in sorted(self.staleness_seen.items())},
                "parked_pulls": self.parked_count, "parked_seconds": self.parked_seconds,
                "max_gap": self.max_gap, "waiting": len(self.parked),
                "clocks": {str(k): v for k, v in self.vector.clocks.items()}}
