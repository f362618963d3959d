"""The workers' barrier: ``Barrier`` holds the workers that arrived and says when all of
them are there.

No sockets: the scheduler answers the released requests.  The barrier waits for the
workers the cluster was started with until they have all registered once, then for the
live ones (a worker that dies is dropped, and the barrier may be complete without it).
"""

from __future__ import annotations

from typing import Any


class Barrier:
    """Barriers by generation: the plain one (``None``), which every worker passes in turn,
    and numbered ones (a round of ``schedule.run_rounds`` under SSP), which a worker may
    arrive at ahead of the others: it arrives at round r and goes on, and waits only on
    the answer of round r − s.  Each generation is released on its own, once every
    worker taking part is there."""

    def __init__(self) -> None:
        self.open: dict[Any, list[tuple[bytes, Any, int]]] = {}  # generation -> (identity, request id, node id)
        self.since: dict[Any, float] = {}  # when each open generation's first worker came
        self.said = 0.0  # when who is missing was last said

    def arrive(self, identity: bytes, request_id: Any, node_id: int, now: float, generation: Any = None) -> None:
        waiting = self.open.setdefault(generation, [])
        if not waiting:
            self.since[generation] = now
            if len(self.open) == 1:
                self.said = now
        waiting.append((identity, request_id, node_id))

    def drop(self, node_id: int) -> None:
        """A worker left or died: it no longer waits."""
        for generation in list(self.open):
            self.open[generation] = [b for b in self.open[generation] if b[2] != node_id]
            if not self.open[generation]:
                del self.open[generation], self.since[generation]

    def here(self, generation: Any = None) -> set[int]:
        """The worker node ids waiting at ``generation`` now."""
        return {b[2] for b in self.open.get(generation, ())}

    def complete(self, size: int) -> list[Any]:
        """The generations that ``size`` distinct workers have reached."""
        return [g for g, waiting in self.open.items() if len({b[2] for b in waiting}) >= size]

    def release(self, size: int, generation: Any = None) -> list[tuple[bytes, Any]]:
        """The requests to answer now (``size`` workers take part): all of ``generation``'s
        once that many distinct workers are there, else none."""
        waiting = self.open.get(generation)
        if not waiting or len({b[2] for b in waiting}) < size:
            return []
        del self.open[generation], self.since[generation]
        return [(identity, request_id) for identity, request_id, _ in waiting]

    def missing(self, now: float, ranks: dict[int, int], size: int, every_s: float = 5.0) -> str | None:
        """Every ``every_s`` while a barrier is open: who waits at the oldest and who does
        not, as one line (``ranks``: worker node id -> rank of the live workers)."""
        if not self.open or now - self.said < every_s:
            return None
        self.said = now
        generation = min(self.open, key=lambda g: self.since[g])
        here = self.here(generation)
        waiting = sorted(ranks[n] for n in here if n in ranks)
        absent = sorted(r for n, r in ranks.items() if n not in here)
        which = "barrier" if generation is None else f"barrier of round {generation}"
        return (f"{which}: {len(here)} of {size} worker(s) waiting for {now - self.since[generation]:.0f} s "
                f"(ranks {waiting}); not there yet: " + (f"ranks {absent}" if absent else
                                                          f"{size - len(here)} worker(s) not registered yet"))
