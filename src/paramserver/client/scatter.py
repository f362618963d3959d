"""One pull or push in flight (``Scatter``): its pieces sent through a ``Port``, each
answer decided on by the sans-IO core (``client/core.py``), and the future.

The port is what a call needs of its client: the client's own (``ClientState``: its I/O
thread, its view) or the simulation's (``testing/worker.SimPort``: the simulated network,
its virtual clock).  Both drive this one class, so the chaos campaign runs the code users
run: the same sends, resends, decisions and completion.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from paramserver.client import core
from paramserver.client.core import Decision, Gather, Piece, Scheduler, Verdict, Wire
from paramserver.errors import NodeLostError
from paramserver.filters.packed import PackedRows
from paramserver.routing.ring import Ring
from paramserver.wire.message import Message, Op

DONE = Decision(Verdict.DONE)

OnReply = Callable[[Message | None, BaseException | None], None]


class Port(Protocol):
    """What a call in flight needs of its client, threaded or simulated."""

    @property
    def retry_timeout_s(self) -> float: ...  # a call routed again and resent gives up after this long

    def now(self) -> float: ...  # seconds, monotonic (the simulation's: virtual)

    def ring(self) -> Ring: ...

    def scheduler(self) -> Scheduler: ...

    def refresh_view(self) -> None: ...  # ask the scheduler for the ring (not waited on)

    def routed(self, kind: Op, keys: np.ndarray, extra: np.ndarray | PackedRows | None, layout: int,
               distinct: bool = False, ordered: bool = False) -> list[Piece]: ...

    def outgoing(self, kind: Op, header: dict[str, Any], piece: Piece, tries: int,
                 wire: Wire | None = None) -> tuple[str | None, dict[str, Any], list[np.ndarray]]: ...

    def submit(self, address: str, header: dict[str, Any], arrays: list[np.ndarray], on_reply: OnReply) -> None: ...

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None: ...

    def count(self, what: str) -> None: ...


class Scatter:
    """One pull or push in flight: a request per server piece, and the future.

    A piece refused for a stale ring, sent to a server that died, or (if it is set)
    unanswered for ``ClientState.answer_within_s``, is routed again with the newest ring and resent (a push
    keeps its ``seq``: servers apply it once), until ``retry_timeout_s``.  Callbacks are
    bound to this object, which refers to none of them: no reference cycle keeps a pull's
    output array alive after its future is dropped (a cycle of closures did: 64 MB pulls
    page-faulted afresh).
    """

    def __init__(self, port: Port, kind: Op, header: dict[str, Any], layout: int,
                 on_piece: Callable[[Piece, Message], None], result: Any,
                 on_settled: Callable[[], None] | None = None, wire: Wire | None = None):
        self.port, self.kind, self.header, self.on_piece, self.result = port, kind, header, on_piece, result
        self.wire = wire  # the table's filters this way (None: none)
        self.layout = layout  # the table's layout: how its keys map to vnodes
        self.on_settled = on_settled  # once done and no request is left in flight
        self.future: Future[Any] = Future()
        self.gather = Gather(0)
        self.in_flight = 0  # requests sent and not answered (a failed future may still have some)
        self.lock = threading.Lock()
        self.deadline = port.now() + port.retry_timeout_s
        port.count(kind.value)

    def start(self, pieces: list[Piece]) -> Future[Any]:
        self.gather = Gather(len(pieces))
        if not pieces:
            self.future.set_result(self.result)
            return self.future
        for piece in pieces:
            self.send(piece, 0)
        return self.future

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if self.gather.fail(exc):
                self.future.set_exception(exc)
        self._maybe_settled()

    def _maybe_settled(self) -> None:
        with self.lock:
            settled = self.future.done() and self.in_flight == 0 and self.on_settled is not None
            callback, self.on_settled = (self.on_settled, None) if settled else (None, self.on_settled)
        if callback is not None:
            callback()

    def send(self, piece: Piece, tries: int) -> None:
        address, header, arrays = self.port.outgoing(self.kind, self.header, piece, tries, self.wire)
        on_reply = functools.partial(self.answered, piece, tries)
        with self.lock:
            self.in_flight += 1
        if address is None:  # the server left the ring since this piece was routed
            on_reply(None, NodeLostError(f"server {piece.server} left the ring"))
            return
        try:
            self.port.submit(address, header, arrays, on_reply)
        except Exception as exc:  # closed meanwhile
            with self.lock:
                self.in_flight -= 1
            self.fail(exc)

    def resend(self, piece: Piece, tries: int) -> None:
        if self.future.done():
            return
        self.port.count("retries")
        try:
            again = self.port.routed(self.kind, piece.keys, piece.extra, self.layout, distinct=True,
                                      ordered=self.wire is not None and self.wire.chain.ordered)
        except Exception as exc:
            self.fail(exc)
            return
        with self.lock:
            if self.gather.rerouted(len(again)):
                self.future.set_result(self.result)
        for p in again:
            self.send(p, tries + 1)

    def answered(self, piece: Piece, tries: int, msg: Message | None, exc: BaseException | None) -> None:
        with self.lock:
            self.in_flight -= 1
        try:
            self._answered(piece, tries, msg, exc)
        finally:
            self._maybe_settled()

    def _decision(self, piece: Piece, tries: int, msg: Message | None, exc: BaseException | None) -> Decision:
        if exc is None and msg is not None and msg.op is not Op.ERROR:
            return DONE  # what core.decide says of an answer; spared building what it would need
        return core.decide(piece, tries, msg, exc, ring_version=self.port.ring().version, now=self.port.now(),
                           deadline=self.deadline, scheduler=self.port.scheduler())

    def _answered(self, piece: Piece, tries: int, msg: Message | None, exc: BaseException | None) -> None:
        if self.future.done():
            return
        decision = self._decision(piece, tries, msg, exc)
        if decision.verdict is Verdict.RESEND:
            if decision.refresh:
                self.port.refresh_view()
            self.port.call_later(decision.delay_s, functools.partial(self.resend, piece, tries))
            return
        error = decision.error
        try:
            if error is None:
                assert msg is not None, "the I/O thread answers with a message or an error"
                self.on_piece(piece, msg)
        except Exception as err:
            error = err
        with self.lock:
            if self.future.done():
                return
            if error is not None:
                self.gather.fail(error)
                self.future.set_exception(error)
            elif self.gather.answered():
                self.future.set_result(self.result)
