"""The client's clocks and barriers: a worker finishing its clock (the staleness gate and
BSP aggregation key on it), taking the live servers' minimum when it joins, and the
scheduler's barriers, whole or numbered.  ``Client`` inherits them; the data plane's
calls (pull, push) are in ``client.py``, the cluster's administration in ``admin.py``."""

from __future__ import annotations

import functools
import logging
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from paramserver.client.core import clock_request, tick_fields
from paramserver.client.ticks import send_tick
from paramserver.errors import ClosedError, ConfigError, NodeLostError
from paramserver.wire.message import Message, Op

if TYPE_CHECKING:
    from paramserver.client.io_thread import IOThread
    from paramserver.client.losses import Losses
    from paramserver.client.state import ClientState
    from paramserver.config import Config

logger = logging.getLogger("paramserver.client.client")  # one log for the client

#: a finished clock waits this long for a pull or a push to its server to carry it, then
#: goes on its own: a worker's next request follows its clock at once, and a clock message
#: of its own had cost each server a request and its answer, a third of a training job's
TICK_RIDE_S = 0.02
#: ``send_ticks(wait=True)`` waits this much longer than a tick's own deadline for its answer
TICK_WAIT_S = 5.0


def _settle(future: Future[None], error: BaseException | None) -> None:
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _on_ring(state: ClientState, address: str) -> bool:
    with state.lock:
        return address in state.view.servers.values()


def _tick_failed(future: Future[Any]) -> None:
    exc = future.exception()
    if exc is not None and not isinstance(exc, ClosedError):
        logger.warning("clock tick failed: %s", exc)


class SyncCalls:
    """Clock and barrier calls of a ``Client`` (it provides the transport underneath)."""

    if TYPE_CHECKING:
        config: Config
        role: str
        node_id: int
        _clock: int
        _lock: threading.Lock
        _io: IOThread
        _losses: Losses
        _token: dict[str, str]
        _state: ClientState

        @property
        def _servers(self) -> dict[int, str]: ...

        def _call(self, address: str, header: dict[str, Any], timeout_s: float | None = None,
                  connecting: bool = False) -> dict[str, Any]: ...

        def _request(self, address: str, header: dict[str, Any]) -> Future[Message]: ...

        def _flush_due(self, clock: int) -> None: ...

    @property
    def current_clock(self) -> int:
        """Clocks this worker has finished (its pulls are gated on it)."""
        return self._clock

    def clock(self) -> int:
        """Finish this worker's clock: tell every server (behind this client's pushes), on
        the next pull or push to it, or on its own after ``TICK_RIDE_S``."""
        self._losses.check()
        self._flush_due(self._clock + 1)  # what a filter held back for these clocks goes out with them
        with self._lock:
            self._clock += 1
            clock = self._clock
        tick, state = tick_fields(self.node_id, clock, self._token.get("token", "")), self._state
        with state.lock:
            for address in self._servers.values():
                state.ticks[address] = tick  # the next pull or push to it carries it (``ClientState.outgoing``)
            arm, state.tick_timer = not state.tick_timer, True
        if arm:
            self._io.call_later(TICK_RIDE_S, self.send_ticks)
        return clock

    def send_ticks(self, wait: bool = False) -> None:
        """Send the finished clock no request carried to its server, each on its own, tried
        again while the server refuses it (``client/ticks.py`` says why): the worker may
        wait a while before its next request (a barrier, its last batch).  With ``wait``,
        until each server has taken it (what this worker says next, a result or a shard
        done, may be acted on by others at once: a read of the tables it trained)."""
        futures = []
        state = self._state
        for address, tick in state.take_ticks().items():
            future: Future[None] = Future()
            futures.append(future)
            send_tick(state, address, clock_request(self.node_id, tick["tick"], tick.get("tick_token", "")),
                      functools.partial(_settle, future), functools.partial(_on_ring, state, address))
        for future in futures:
            if wait:
                try:
                    future.result(timeout=self.config.retry_timeout_s + TICK_WAIT_S)
                except Exception as exc:  # given up at its deadline: said, and the worker goes on
                    logger.warning("clock tick not taken: %s", exc)
            else:
                future.add_done_callback(_tick_failed)

    def barrier(self, timeout_s: float | None = None) -> list[int]:
        """Block until every live worker has called ``barrier``; the ranks of those workers
        (every one released from a barrier gets the same list: a dead worker is missing)."""
        self._losses.check()
        self.send_ticks(wait=True)  # the others may wait on this worker's clock, not on its next request
        if self.role != "worker":
            raise ConfigError("only workers take part in barriers (this client is a driver)")
        return list(self._call(self.config.scheduler, {"op": Op.BARRIER.value}, timeout_s=timeout_s).get("workers", []))

    def arrive(self, generation: int) -> Future[Any]:
        """Arrive at the numbered barrier ``generation`` (a round) without waiting: the
        future completes with the ranks of the live workers once all have arrived there.
        A worker may arrive at later generations meanwhile (SSP rounds: wait on round
        r − s, arrive at r); each generation is released on its own."""
        self._losses.check()
        self.send_ticks(wait=True)
        if self.role != "worker":
            raise ConfigError("only workers take part in barriers (this client is a driver)")
        if isinstance(generation, bool) or not isinstance(generation, int):
            raise ConfigError(f"a barrier's generation must be a whole number, got {generation!r}")
        out: Future[Any] = Future()

        def done(f: Future[Any]) -> None:
            try:
                out.set_result(list(f.result().header.get("workers", [])))
            except BaseException as exc:  # the request's own error, for whoever waits
                out.set_exception(exc)
        self._request(self.config.scheduler, {"op": Op.BARRIER.value, "generation": generation}).add_done_callback(done)
        return out

    def _resync_clock(self) -> None:
        """Take the live servers' minimum clock.  A server that dies meanwhile is skipped:
        its vnodes fail over to servers that answer, and a worker must not fail a job for
        a server the cluster survives (it failed the job even at replicas 2)."""
        futures = [self._request(address, {"op": Op.STATS.value}) for address in self._servers.values()]
        mins = []
        for future in futures:
            try:
                mins.append(future.result(timeout=self.config.heartbeat_timeout_s * 4).header.get("min_clock"))
            except (NodeLostError, TimeoutError) as exc:
                logger.info("clock resync: a server did not answer (%s); the others decide", exc)
        with self._lock:
            self._clock = max([self._clock, *[m for m in mins if m is not None]])
