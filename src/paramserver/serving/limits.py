"""The bounds of ``paramserver serve``'s HTTP service, and the connection guard that keeps them.

aiohttp reads a request's headers with no deadline (its keep-alive timer closes a
connection idle before its first request, not one that trickles a header a byte a minute),
and it accepts connections up to the open-file limit.  ``Guard`` wraps each connection's
aiohttp protocol (``RequestHandler``), using only asyncio's protocol methods:

* a connection over ``max_connections`` is answered ``503`` with ``Retry-After`` and closed
  before aiohttp sees it;
* from its first byte (or from the moment it opens), a request has ``header_timeout_s`` to
  send its headers whole; when the time is up the connection is answered ``408`` and closed;
* once the headers are in, the app (``app.py``) reads the body with ``body_timeout_s`` for the
  whole of it (``body.py``), and calls ``request_started`` / ``request_ended`` to stop and
  rearm the header clock.

Idle keep-alive connections are aiohttp's own: closed after ``KEEPALIVE_S``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any

from paramserver.errors import ConfigError
from paramserver.serving.stats import Stats

logger = logging.getLogger(__name__)

MIB = 1 << 20
KEEPALIVE_S = 15.0  # an idle keep-alive connection is closed after this (it holds one of --max-connections)
LINGER_S = 2.0  # after an answer sent before the body was read whole, its rest is read and dropped this long


@dataclass(frozen=True)
class Limits:
    """The service's bounds (``serve``'s flags; the defaults are production ones)."""

    header_timeout_s: float = 10.0  # a request's headers, from its first byte
    body_timeout_s: float = 60.0  # its whole body, once the headers are in (256 MiB at ~4.5 MB/s)
    max_connections: int = 1000
    max_rows: int = 100_000  # a request's
    max_body_bytes: int = 256 * MIB
    max_held_bytes: int = 1024 * MIB  # every body being read or scored at once

    def __post_init__(self) -> None:
        for flag, value in (("--header-timeout", self.header_timeout_s), ("--body-timeout", self.body_timeout_s)):
            if not 0 < value < math.inf:  # inf: a slow client would hold its connection for ever
                raise ConfigError(f"{flag} must be a finite number of seconds > 0, got {value:g}")
        for flag, count, unit in (("--max-connections", self.max_connections, 1), ("--max-rows", self.max_rows, 1),
                                  ("--max-body-mb", self.max_body_bytes, MIB),
                                  ("--max-held-mb", self.max_held_bytes, MIB)):
            if count < 1:  # said as the flag was given (MiB), not in bytes
                raise ConfigError(f"{flag} must be >= 1, got {count / unit:g}")
        if self.max_held_bytes < self.max_body_bytes:
            raise ConfigError(f"--max-held-mb ({self.max_held_bytes // MIB}) must be >= --max-body-mb "
                              f"({self.max_body_bytes // MIB}): else a body of the largest size is never admitted")


def _raw_answer(status: str, text: str, extra: str = "") -> bytes:
    body = ('{"error": "' + text + '"}').encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}"
            "Connection: close\r\n\r\n").encode() + body


BUSY = _raw_answer("503 Service Unavailable", "too many connections (--max-connections): retry shortly",
                   "Retry-After: 1\r\n")
SLOW_HEADERS = _raw_answer("408 Request Timeout", "the request's headers did not arrive within --header-timeout")


class Guard(asyncio.Protocol):
    """One connection: aiohttp's protocol (``inner``) behind the bounds of the module."""

    def __init__(self, inner: Any, limits: Limits, stats: Stats, guards: dict[Any, Guard]) -> None:
        self.inner, self.limits, self.stats, self.guards = inner, limits, stats, guards
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.busy = False  # a request's headers are in and the app has it
        self.admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.stats.connections_open >= self.limits.max_connections:
            self.stats.connections_refused += 1
            logger.debug("refused a connection: %d open (--max-connections)", self.stats.connections_open)
            transport.write(BUSY)
            transport.close()
            return
        self.admitted = True
        self.stats.connections_open += 1
        self.guards[self.inner] = self
        self.inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if not self.busy and self.timer is None:
            self._arm()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.admitted:
            self.admitted = False
            self.stats.connections_open -= 1
            self.guards.pop(self.inner, None)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.inner.resume_writing()

    def request_started(self) -> None:
        """The headers are in: the app reads the body under its own deadline."""
        self.busy = True
        self._disarm()

    def request_ended(self) -> None:
        """Answered: the next request's clock starts at its first byte."""
        self.busy = False

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.limits.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _headers_late(self) -> None:
        self.timer = None
        if self.busy or self.transport is None or self.transport.is_closing():
            return
        self.stats.timeouts["header"] = self.stats.timeouts.get("header", 0) + 1
        logger.debug("closed a connection whose headers took over %g s (--header-timeout)",
                     self.limits.header_timeout_s)
        self.transport.write(SLOW_HEADERS)
        self.transport.close()


def guarded(factory: Any, limits: Limits, stats: Stats, guards: dict[Any, Guard]) -> Any:
    """A protocol factory for ``loop.create_server``: ``factory``'s protocols (aiohttp's
    ``Server``), each behind a ``Guard`` registered in ``guards`` by its aiohttp protocol."""
    return lambda: Guard(factory(), limits, stats, guards)
