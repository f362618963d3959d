"""The pushes a server holds back for BSP aggregation (sans-IO: no sockets, no ring).

A table that aggregates (``TableSpec.aggregate``: BSP) does not apply a push when it
arrives: the push waits here, under its worker's clock, until every live worker has
finished that clock (the vector clock's minimum passed it); then the clock's pushes are
applied together, one summed row a key.  So a pull released by the staleness gate sees
all of a clock's updates or none of them, whatever order the workers' pushes came in.

A vnode that moves to another server (a join, a removal, a repair) takes its share of
the unfinished clocks with it (``of_vnode`` at the sender, ``replace_vnode`` at the
receiver): which vnode a key is in is the ring's business, so the caller passes it in
(``vnodes_of``), and this module stays below the routing layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

#: one buffered push: its keys and their gradient rows
Push = tuple[np.ndarray, np.ndarray]
#: the vnode of each key (the ring's ``vnodes(keys, layout)`` for one table)
VnodesOf = Callable[[np.ndarray], np.ndarray]


class ClockBuffers:
    """Per table, per unfinished clock: the ``(keys, grads)`` pushes buffered there."""

    def __init__(self) -> None:
        self.by_table: dict[str, dict[int, list[Push]]] = {}

    def add(self, name: str, clock: int, keys: np.ndarray, grads: np.ndarray) -> None:
        """Hold a push of ``clock`` (copied: the request's frames are not kept)."""
        self.by_table.setdefault(name, {}).setdefault(clock, []).append((keys.copy(), grads.copy()))

    def finished(self, low: float) -> Iterator[tuple[str, list[Push]]]:
        """Take out, clock by clock in order, every table's pushes of the clocks below
        ``low`` (the vector clock's minimum: those every live worker has finished)."""
        for name, by_clock in self.by_table.items():
            for clock in sorted(c for c in by_clock if c < low):
                yield name, by_clock.pop(clock)

    def drop(self, name: str) -> None:
        """The table was dropped: its buffered pushes with it."""
        self.by_table.pop(name, None)

    def of_vnode(self, name: str, vnodes_of: VnodesOf, vnode: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Per unfinished clock, ``(clock, keys, grads)``: the pushes buffered for ``vnode``
        (what its copy takes along)."""
        out = []
        for clock, pushes in sorted(self.by_table.get(name, {}).items()):
            keys = np.concatenate([k for k, _ in pushes])
            mine = vnodes_of(keys) == vnode
            if mine.any():
                out.append((clock, keys[mine], np.concatenate([g for _, g in pushes])[mine]))
        return out

    def replace_vnode(self, name: str, vnodes_of: VnodesOf, vnode: int,
                      pairs: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
        """Make ``vnode``'s buffered pushes those of a copy received (it has all of them)."""
        by_clock = self.by_table.get(name, {})
        for clock, pushes in by_clock.items():
            by_clock[clock] = [(k[keep], g[keep]) for k, g in pushes for keep in [vnodes_of(k) != vnode]]
        for clock, k, g in pairs:
            self.add(name, clock, k, g)
