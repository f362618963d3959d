"""The vnode copies a migration asks of a server (``MIGRATE``), and where pushes on the
vnodes being copied are forwarded until the ring flips.

A copy is a snapshot of the vnode (keys, values, optimiser state, the exactly-once
record, and for BSP aggregation the pushes of unfinished clocks), sent as ``INSTALL``
(several messages for a vnode bigger than one); from then on every push on that vnode
is forwarded to its new holder too (the state's ``moving``: same channel, in order).  One vnode a
loop turn, at most ``COPIES_IN_FLIGHT`` unanswered, so requests keep being served and
forwarded pushes do not queue behind a backlog of copies at the receiver.  The
migration is reported done (``MIGRATED``) once every copy was acknowledged.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from paramserver.server.peers import Acks
from paramserver.server.state import Port, ServerState
from paramserver.wire.message import Op

logger = logging.getLogger(__name__)

#: vnode copies a migrating server keeps unanswered
COPIES_IN_FLIGHT = 2


class Copies:
    """A server's outgoing vnode copies, of ``state``'s tables, sent to ``port.peers``."""

    def __init__(self, state: ServerState, port: Port) -> None:
        self.state, self.port = state, port
        self.queue: deque[tuple[Acks, str | None, int, int]] = deque()  # (migration's acks, table, vnode, dest)
        self.in_flight = 0
        self.plans = 0  # migrations planned here: a copy's answer counts only for the newest
        self.unanswered: set[Acks] = set()  # the copies sent and not answered yet

    def plan(self, moves: list[tuple[str, int, int]], done: Callable[[str | None], None]) -> None:
        """Queue a migration's copies; ``done(failed)`` once every one is acknowledged.

        The scheduler runs one migration at a time, so a new one means the one before
        was abandoned: its copies not sent yet are dropped, and those unanswered no
        longer count against ``COPIES_IN_FLIGHT`` (a copy or its answer lost on a cut
        link would otherwise hold their places for ever, and no copy would go again)."""
        self.plans += 1
        self.queue.clear()
        self.in_flight = 0
        self.port.peers.drop(self.unanswered)  # an answer still to come is ignored
        self.unanswered.clear()
        acks = Acks(done=done)
        acks.pending = 1  # held until the last copy is sent: done cannot come before
        self.queue.extend((acks, name, vnode, dest) for name, vnode, dest in moves)
        self.queue.append((acks, None, -1, -1))

    def ready(self) -> bool:
        """A copy may go now."""
        return bool(self.queue) and self.in_flight < COPIES_IN_FLIGHT

    def clear(self) -> None:
        """The ring flipped: copies not sent yet belong to a plan the flip made void, and
        nothing is moving any more."""
        self.queue.clear()
        self.state.moving.clear()

    def lost(self, server: int) -> None:
        for by_vnode in self.state.moving.values():
            for dests in by_vnode.values():
                dests.discard(server)

    def send_next(self) -> bool:
        """Send the next copy; True if a vnode started moving (forwarding targets change)."""
        state, peers = self.state, self.port.peers
        acks, name, vnode, dest = self.queue.popleft()
        if name is None:  # every copy of this migration is sent
            peers.acked(acks)
            return False
        table = state.tables.get(name)
        if table is None or dest in state.dead or dest not in peers:
            return False
        ring = state.ring
        assert ring is not None, "vnodes move between rings"
        keys, rows = table.rows(vnode)  # in memory and, a tiered table's, on disk
        buffered = state.buffers.of_vnode(name, lambda k: ring.vnodes(k, table.layout), vnode)  # BSP: unfinished
        header: dict[str, Any] = {
            "op": Op.INSTALL.value, "table": name, "vnode": vnode, "from": state.node_id,
            "ring_version": ring.version,
            "seqs": state.dedup[name].export(vnode), "buffered": [c for c, _, _ in buffered],
            "clocks": {str(w): c for w, c in state.gate.vector.clocks.items()}, "append": False}
        # a vnode bigger than a message goes in several: the first replaces, the rest add
        step = max(1, (state.config.max_message_bytes - (2 << 20)) // (8 + 4 * table.width))
        plan = self.plans
        copy = Acks()
        copy.done = lambda failed: self._copied(acks, copy, failed, plan)
        acks.pending += 1
        self.in_flight += 1
        self.unanswered.add(copy)
        for start in range(0, max(1, keys.shape[0]), step):
            chunk = [keys[start:start + step], rows[start:start + step]]
            if start == 0:
                peers.ask(dest, header, [*chunk, *[a for _, k, g in buffered for a in (k, g)]], copy)
            else:
                peers.ask(dest, {"op": Op.INSTALL.value, "table": name, "vnode": vnode, "from": state.node_id,
                                 "seqs": [], "buffered": [], "append": True}, chunk, copy)
        state.moving.setdefault(name, {}).setdefault(vnode, set()).add(dest)
        return True

    def _copied(self, acks: Acks, copy: Acks, failed: str | None, plan: int) -> None:
        if plan == self.plans:  # else its migration was abandoned: it no longer holds a place
            self.in_flight -= 1
            self.unanswered.discard(copy)
        self.port.peers.acked(acks, failed)
