"""The workers' barrier: ``Barrier`` holds the workers that arrived and says when all of
them are there.

No sockets: the scheduler answers the released requests.  The barrier waits for the
workers the cluster was started with until they have all registered once, then for the
live ones (a worker that dies is dropped, and the barrier may be complete without it).
"""

from __future__ import annotations

from typing import Any


class Barrier:
    def __init__(self) -> None:
        self.waiting: list[tuple[bytes, Any, int]] = []  # (identity, request id, worker node id)
        self.since = 0.0  # when the open barrier's first worker came
        self.said = 0.0  # when who is missing was last said

    def arrive(self, identity: bytes, request_id: Any, node_id: int, now: float) -> None:
        if not self.waiting:
            self.since = self.said = now
        self.waiting.append((identity, request_id, node_id))

    def drop(self, node_id: int) -> None:
        """A worker left or died: it no longer waits."""
        self.waiting = [b for b in self.waiting if b[2] != node_id]

    def here(self) -> set[int]:
        """The worker node ids waiting now."""
        return {b[2] for b in self.waiting}

    def release(self, size: int) -> list[tuple[bytes, Any]]:
        """The requests to answer now (``size`` workers take part): all of them once that
        many distinct workers are there, else none."""
        if not self.waiting or len({b[2] for b in self.waiting}) < size:
            return []
        out = [(identity, request_id) for identity, request_id, _ in self.waiting]
        self.waiting.clear()
        return out

    def missing(self, now: float, ranks: dict[int, int], size: int, every_s: float = 5.0) -> str | None:
        """Every ``every_s`` while the barrier is open: who waits and who does not, as one
        line (``ranks``: worker node id -> rank of the live workers)."""
        if not self.waiting or now - self.said < every_s:
            return None
        self.said = now
        here = {b[2] for b in self.waiting}
        waiting = sorted(ranks[n] for n in here if n in ranks)
        absent = sorted(r for n, r in ranks.items() if n not in here)
        return (f"barrier: {len(here)} of {size} worker(s) waiting for {now - self.since:.0f} s (ranks {waiting}); "
                "not there yet: " + (f"ranks {absent}" if absent else f"{size - len(here)} worker(s) not registered "
                                     "yet"))
