"""One pull or push in flight (``Scatter``): split per server (``Piece``), sent,
answered, and routed again across ring changes until ``retry_timeout_s``.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from paramserver.errors import (
    CheckpointError,
    ConfigError,
    NodeLostError,
    ParamServerError,
    ProtocolError,
    QuotaError,
    RemoteError,
    StaleRingError,
    UnknownTableError,
)
from paramserver.wire.liveness import process_alive
from paramserver.wire.message import Message, Op

if TYPE_CHECKING:
    from paramserver.client.client import Client


def remote_error(msg: Message) -> ParamServerError:
    code, text = msg.header.get("code"), str(msg.header.get("error"))
    if code == "stale_ring":
        return StaleRingError(text)
    if code == "unknown_table":
        return UnknownTableError(text)
    if code == "protocol":
        return ProtocolError(text)
    if code == "config":
        return ConfigError(text)
    if code == "node_lost":
        return NodeLostError(text)
    if code == "quota":
        return QuotaError(text)
    if code == "checkpoint":
        return CheckpointError(text)
    return RemoteError(f"{code}: {text}")



@dataclass(frozen=True)
class Piece:
    """The part of a pull or push that goes to one server, as routed at ``ring_version`` (the ring's version)."""

    server: int
    ring_version: int
    keys: np.ndarray
    extra: np.ndarray  # pull: output row of each key; push: gradient rows
    vnodes: np.ndarray
    counts: np.ndarray


class Scatter:
    """One pull or push in flight: a request per server piece, and the future.

    A piece refused for a stale ring, or sent to a server that died, is routed again
    with the newest ring and resent (a push keeps its ``seq``: servers apply it once),
    until ``retry_timeout_s``.  Callbacks are bound to this object, which refers to
    none of them: no reference cycle keeps a pull's output array alive after its
    future is dropped (a cycle of closures did: 64 MB pulls page-faulted afresh).
    """

    def __init__(self, client: Client, kind: Op, header: dict[str, Any], layout: int,
                 on_piece: Callable[[Piece, Message], None], result: Any,
                 on_settled: Callable[[], None] | None = None):
        self.client, self.kind, self.header, self.on_piece, self.result = client, kind, header, on_piece, result
        self.layout = layout  # the table's layout: how its keys map to vnodes
        self.on_settled = on_settled  # once done and no request is left in flight
        self.future: Future = Future()
        self.pending = 0  # pieces not answered yet
        self.in_flight = 0  # requests sent and not answered (a failed future may still have some)
        self.lock = threading.Lock()
        self.deadline = time.monotonic() + client.config.retry_timeout_s
        client.counts[kind.value] = client.counts.get(kind.value, 0) + 1

    def start(self, pieces: list[Piece]) -> Future:
        if not pieces:
            self.future.set_result(self.result)
            return self.future
        self.pending = len(pieces)
        for piece in pieces:
            self.send(piece, 0)
        return self.future

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if not self.future.done():
                self.future.set_exception(exc)
        self._maybe_settled()

    def _maybe_settled(self) -> None:
        with self.lock:
            settled = self.future.done() and self.in_flight == 0 and self.on_settled is not None
            callback, self.on_settled = (self.on_settled, None) if settled else (None, self.on_settled)
        if callback is not None:
            callback()

    def send(self, piece: Piece, tries: int) -> None:
        client = self.client
        header = {**self.header, "ring_version": piece.ring_version}
        if "seq" in header:
            header["acked"] = client._acked_seq()
        arrays = [piece.keys, piece.extra, piece.vnodes, piece.counts] if self.kind is Op.PUSH else \
            [piece.keys, piece.vnodes, piece.counts]
        address = client._servers.get(piece.server)
        on_reply = functools.partial(self.answered, piece, tries)
        with self.lock:
            self.in_flight += 1
        if address is None:  # the server left the ring since this piece was routed
            on_reply(None, NodeLostError(f"server {piece.server} left the ring"))
            return
        try:
            client._io.submit(address, header, arrays, on_reply)
        except Exception as exc:  # closed meanwhile
            with self.lock:
                self.in_flight -= 1
            self.fail(exc)

    def resend(self, piece: Piece, tries: int) -> None:
        if self.future.done():
            return
        self.client.counts["retries"] = self.client.counts.get("retries", 0) + 1
        try:
            again = self.client._pieces(self.kind, piece.keys, piece.extra, self.layout, distinct=True)
        except Exception as exc:
            self.fail(exc)
            return
        with self.lock:
            self.pending += len(again) - 1
            if self.pending == 0 and not self.future.done():
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

    def _answered(self, piece: Piece, tries: int, msg: Message | None, exc: BaseException | None) -> None:
        if self.future.done():
            return
        if exc is None and msg is not None and msg.op is Op.ERROR:
            exc = remote_error(msg)
        if isinstance(exc, (StaleRingError, NodeLostError)) and self.client._io.scheduler_lost() and (
                time.monotonic() >= self.deadline or process_alive(self.client._scheduler_process) is False):
            # without a scheduler the servers serve no more (their leases ran out) and no ring can change:
            # a scheduler whose process is gone fails the call now, one only silent (stalled?) at the deadline
            exc = NodeLostError(f"the scheduler at {self.client.config.scheduler} stopped answering (declared lost "
                                f"after {self.client.config.heartbeat_timeout_s:g} s of silence), so the servers "
                                "serve no more (their leases ran out): restart the cluster, and resume from a "
                                f"checkpoint if there is one ({exc})")
        elif isinstance(exc, (StaleRingError, NodeLostError)) and time.monotonic() < self.deadline:
            # the ring changed under this piece: once ours is newer, route it again
            ring_version = self.client._ring.version
            newer = ring_version > piece.ring_version
            if not newer and msg is not None and msg.header.get("ring_version", 0) > ring_version:
                self.client._refresh_view()
            delay = 0.0 if newer else min(0.5, 0.01 * 2 ** min(tries, 6))
            self.client._io.call_later(delay, functools.partial(self.resend, piece, tries))
            return
        try:
            if exc is None:
                assert msg is not None, "the I/O thread answers with a message or an error"
                self.on_piece(piece, msg)
        except Exception as err:
            exc = err
        with self.lock:
            if self.future.done():
                return
            if exc is not None:
                self.future.set_exception(exc)
                return
            self.pending -= 1
            if self.pending == 0:
                self.future.set_result(self.result)
