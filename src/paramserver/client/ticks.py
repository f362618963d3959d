"""A finished clock sent to one server on its own (a tick no pull or push carried), tried
again while the server refuses it, for as long as a call is (``retry_timeout_s``) and as
the server is on the ring: what ``Client.send_ticks`` and the simulated worker both run.

Why retry rather than log and go on (issue 45's decision): a server that never hears a
worker's last clock keeps that worker behind in its vector clock, so every SSP or BSP
pull of the others parks at its gate until the worker ticks again, and a worker whose
part is over never does.  A refusal is passing (a lease that lapsed and is renewed, a
ring that moved), so the tick goes again 0.05 s later; once the server has left the ring
its clock no longer matters and the tick is given up quietly.  It fails only at the
deadline, and then loudly (the caller logs it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paramserver.client.core import remote_error
from paramserver.client.scatter import Port
from paramserver.errors import ClosedError
from paramserver.wire.message import Message, Op

#: a refused tick goes again after this long
TICK_RETRY_S = 0.05


def send_tick(port: Port, address: str, header: dict[str, Any], on_done: Callable[[BaseException | None], None],
              on_ring: Callable[[], bool]) -> None:
    """Send the clock request ``header`` to ``address`` until it is taken (``on_done(None)``),
    the server left the ring (``on_ring()`` false: ``on_done(None)``), the client closed,
    or ``port.retry_timeout_s`` passed (``on_done(error)``)."""
    deadline = port.now() + port.retry_timeout_s

    def attempt() -> None:
        try:
            port.submit(address, header, [], answered)
        except Exception as exc:  # the client closed meanwhile
            on_done(exc)

    def answered(msg: Message | None, exc: BaseException | None) -> None:
        if exc is None and msg is not None and msg.op is Op.ERROR:
            exc = remote_error(msg)
        elif exc is None and msg is None:
            exc = ClosedError(f"no answer from {address}")
        if exc is None or isinstance(exc, ClosedError):
            on_done(exc)
        elif not on_ring():
            on_done(None)  # the server left the ring: its clock no longer matters
        elif port.now() < deadline:
            port.call_later(TICK_RETRY_S, attempt)
        else:
            on_done(exc)

    attempt()
