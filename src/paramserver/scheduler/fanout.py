"""A command to every server (create or drop a table, write a checkpoint), its answers
collected as they arrive: ``FanOuts``.

No sockets: ``start`` sends through the ``notify`` callable it is given, and the
scheduler feeds it the servers' answers (``answered``), their deaths (``node_lost``) and
the time (``expire``).  A fan-out is done once every server it was sent to has answered,
died or been given up on at its deadline; ``on_done(fan_out)`` then sees the replies, the
errors and the servers lost.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from paramserver.wire.message import Message, Op

logger = logging.getLogger(__name__)


@dataclass
class FanOut:
    """A command sent to every server; ``on_done(self)`` runs once each has answered,
    died or (past ``deadline``) been given up on."""

    on_done: Callable[[FanOut], None]
    waiting: set[int]
    deadline: float
    replies: dict[int, dict[str, Any]] = field(default_factory=dict)  # server -> OK header
    errors: dict[int, Any] = field(default_factory=dict)  # server -> error text
    lost: set[int] = field(default_factory=set)  # died or timed out before answering


class FanOuts:
    """The fan-outs under way, by id (the id their commands and answers carry)."""

    def __init__(self, notify: Callable[[int, dict[str, Any]], None]) -> None:
        self.notify = notify  # (server id, header): send a command to one server
        self.open: dict[int, FanOut] = {}
        self._next = 0

    def start(self, header: dict[str, Any], servers: Iterable[int], on_done: Callable[[FanOut], None],
              now: float, timeout_s: float = math.inf) -> int:
        """Send ``header`` to ``servers``; ``on_done`` gets the answers.  Returns the id."""
        self._next += 1
        targets = list(servers)
        self.open[self._next] = FanOut(on_done, set(targets), now + timeout_s)
        for server in targets:
            self.notify(server, {**header, "id": self._next})
        self._maybe_done(self._next)
        return self._next

    def answered(self, server: int | None, msg: Message) -> None:
        """A server's ``OK`` or ``ERROR`` to one of the commands (anything else is ignored)."""
        op = self.open.get(msg.id) if isinstance(msg.id, int) else None
        if op is None or server not in op.waiting:
            return
        if msg.op is Op.ERROR:
            logger.error("server %d failed command %d: %s", server, msg.id, msg.header.get("error"))
            op.errors[server] = msg.header.get("error")
        else:
            op.replies[server] = msg.header
        op.waiting.discard(server)
        self._maybe_done(msg.id)

    def node_lost(self, server: int) -> None:
        for op_id, op in list(self.open.items()):
            if server in op.waiting:
                op.waiting.discard(server)
                op.lost.add(server)
                self._maybe_done(op_id)

    def expire(self, now: float) -> None:
        """Give up on the servers that did not answer by a fan-out's deadline."""
        for op_id, op in [(i, op) for i, op in self.open.items() if op.deadline < now]:
            logger.error("servers %s did not answer command %d in time", sorted(op.waiting), op_id)
            op.lost |= op.waiting
            op.waiting.clear()
            self._maybe_done(op_id)

    def _maybe_done(self, op_id: int) -> None:
        op = self.open.get(op_id)
        if op is None or op.waiting:
            return
        del self.open[op_id]
        op.on_done(op)
