"""The server's side of consistency: workers' clocks tick (``CLOCK``), workers come and
go (``WORKERS``, a worker lost), and each time the vector clock's minimum may have
moved: the pushes buffered for finished clocks are applied (BSP aggregation,
``consistency/buffers.py``), then the pulls the staleness gate parked and now allows
are answered (``consistency/clock.py``).

Ticks travel behind a worker's pushes on one FIFO channel, so by the time a clock is
finished here, every push of it was applied or buffered here.  A tick rides on the
worker's next pull or push to this server (``carried``), or comes as a ``CLOCK`` message
of its own when none follows soon (``client/sync_calls.py``).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from paramserver.consistency.buffers import Push
from paramserver.errors import Code, ParamServerError
from paramserver.routing.partition import route_push
from paramserver.server.data import serve_pull
from paramserver.server.state import Port, ServerState
from paramserver.wire.message import Message, error_code, error_reply, field, reply

logger = logging.getLogger(__name__)


class Clocks:
    """The handlers that move ``state``'s vector clock; released pulls go out on ``port``."""

    def __init__(self, state: ServerState, port: Port) -> None:
        self.state, self.port = state, port

    def on_clock(self, msg: Message) -> list[Any]:
        """A worker finished a clock."""
        self._tick(field(msg, "worker", int), field(msg, "clock", int), msg.header.get("worker_token"))
        return reply(msg)

    def carried(self, msg: Message) -> None:
        """A worker's finished clock carried by its pull or push (``tick``, ``tick_worker``):
        taken before the request, as the clock message it replaces would have been."""
        self._tick(field(msg, "tick_worker", int), field(msg, "tick", int), msg.header.get("tick_token"))

    def _tick(self, worker: int, clock: int, token: Any) -> None:
        state = self.state
        if state.tokens is not None:
            state.tokens.check(worker, token, "a clock")
        state.gate.vector.tick(worker, clock)
        self.moved()

    def on_workers(self, msg: Message) -> None:
        """The scheduler's list of the live workers (the vector clock's members)."""
        self.state.gate.vector.set_members([int(w) for w in msg.header.get("workers", [])])
        self.moved()

    def worker_lost(self, worker: int) -> None:
        """A worker left or died: it holds no clock back, and its parked pulls go."""
        gate = self.state.gate
        gate.vector.leave(worker)
        gate.drop_reader(worker, lambda request: request[1].header.get("reader"))
        self.moved()

    def moved(self) -> None:
        """Apply finished clocks' aggregated pushes, then answer the pulls now allowed."""
        state, port = self.state, self.port
        for name, pushes in state.buffers.finished(state.gate.vector.min()):
            self._apply_aggregate(name, pushes)
        for identity, msg in state.gate.release(state.clock()):
            try:
                port.answer(serve_pull(state, msg), identity)
            except ParamServerError as exc:  # e.g. the table was dropped, or the vnode moved, meanwhile
                port.answer(error_reply(msg.id, error_code(exc), str(exc), ring_version=state.ring_version()),
                            identity)
            except Exception as exc:  # a bug: this caller still gets an answer
                logger.exception("server %d failed on a released pull", state.node_id)
                port.answer(error_reply(msg.id, Code.INTERNAL, f"{type(exc).__name__}: {exc}"), identity)

    def _apply_aggregate(self, name: str, pushes: list[Push]) -> None:
        state = self.state
        table = state.tables.get(name)
        if table is None or not pushes:
            return
        assert state.ring is not None
        state.counted(table, -1)  # the clock's sum changes rows: a row cache's bound counts it, as no one client's
        routed = route_push(state.ring, np.concatenate([k for k, _ in pushes]),
                            np.concatenate([g for _, g in pushes]), table.layout)  # one summed row per key
        assert routed.grads is not None
        for part in routed.parts:
            held = table.holds(part.vnodes)  # the ring may have moved a vnode meanwhile
            rows = np.repeat(held, part.counts)
            table.apply(part.vnodes[held], part.counts[held], routed.keys[part.start:part.stop][rows],
                        routed.grads[part.start:part.stop][rows])
        table.settle()  # a tiered table: the sum's new rows may put it over its budget
