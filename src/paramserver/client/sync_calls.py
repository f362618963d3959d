"""The client's clocks and barriers (``Clocks``): a worker finishing its clock (the
staleness gate and BSP aggregation key on it), taking the live servers' minimum when it
joins, and the scheduler's barriers, whole or numbered.  Built on the client's ``Caller``;
``Client`` calls them (``clock``, ``barrier``...); the data plane's calls (pull, push) are
in ``client.py``, the cluster's administration in ``admin.py``."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from paramserver.client.core import clock_request, tick_fields
from paramserver.client.ticks import send_tick
from paramserver.errors import ClosedError, ConfigError, NodeLostError
from paramserver.wire.message import Op

if TYPE_CHECKING:
    from paramserver.client.caller import Caller
    from paramserver.client.state import ClientState

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


class Clocks:
    """A client's clock and barrier calls, on its ``caller``; ``flush_due(clock)`` pushes
    what the filters hold back for that clock (``Flushes.due``) before the clock goes out."""

    def __init__(self, caller: Caller, flush_due: Callable[[int], None]) -> None:
        self.caller, self.flush_due = caller, flush_due
        self._flying: set[Future[None]] = set()  # ticks sent on their own (the timer's too), not yet taken

    @property
    def current(self) -> int:
        """Clocks this worker has finished (its pulls are gated on it)."""
        return self.caller.clock

    def clock(self, clocks: int = 1) -> int:
        """Finish this worker's clock (``clocks`` of them at once: a step of several batches,
        a clock each): tell every server (behind this client's pushes), on the next pull or
        push to it, or on its own after ``TICK_RIDE_S``."""
        c = self.caller
        c.losses.check()
        for k in range(1, clocks + 1):
            self.flush_due(c.clock + k)  # what a filter held back for these clocks goes out with them
        with c.lock:
            c.clock += clocks
            clock = c.clock
        tick, state = tick_fields(c.node_id, clock, c.token), c.state
        with state.lock:
            for address in state.view.servers.values():
                state.ticks[address] = tick  # the next pull or push to it carries it (``ClientState.outgoing``)
            arm, state.tick_timer = not state.tick_timer, True
        if arm:
            c.io.call_later(TICK_RIDE_S, self.send_ticks)
        return clock

    def send_ticks(self, wait: bool = False, landed: bool = False) -> None:
        """Send the finished clock no request carried to its server, each on its own, tried
        again while the server refuses it (``client/ticks.py`` says why): the worker may
        wait a while before its next request (a barrier, its last batch).  With ``wait``,
        until each server has taken it; with ``landed`` too, the ticks the timer sent a
        moment ago as well (what this worker says next, a result or a shard done, may be
        acted on by others at once: a driver's read of the tables it trained, which no
        staleness gate holds for a clock still on its way).  A barrier needs no more than
        ``wait``: a gated pull after it waits at the server for the clock, and waiting
        here for a round trip each of its rounds cost LDA's rounds 2 % (NYT, K = 50)."""
        c = self.caller
        sent: list[Future[None]] = []
        for address, (tick, future) in c.state.take_ticks(self._flying).items():
            sent.append(future)
            future.add_done_callback(self._landed)
            send_tick(c.state, address, clock_request(c.node_id, tick["tick"], tick.get("tick_token", "")),
                      functools.partial(_settle, future), functools.partial(_on_ring, c.state, address))
        if not wait:
            return
        with c.lock:
            flying = list(self._flying) if landed else sent
        for future in flying:
            try:
                future.result(timeout=c.config.retry_timeout_s + TICK_WAIT_S)
            except Exception:  # given up at its deadline: said by ``_landed``, and the worker goes on
                pass

    def _landed(self, future: Future[None]) -> None:
        with self.caller.lock:
            self._flying.discard(future)
        _tick_failed(future)

    def barrier(self, timeout_s: float | None = None) -> list[int]:
        """Block until every live worker has called ``barrier``; the ranks of those workers
        (every one released from a barrier gets the same list: a dead worker is missing)."""
        c = self.caller
        c.losses.check()
        self.send_ticks(wait=True)  # the others may wait on this worker's clock, not on its next request
        if c.role != "worker":
            raise ConfigError("only workers take part in barriers (this client is a driver)")
        return list(c.rpc.scheduler({"op": Op.BARRIER.value}, timeout_s).get("workers", []))

    def arrive(self, generation: int) -> Future[Any]:
        """Arrive at the numbered barrier ``generation`` (a round) without waiting: the
        future completes with the ranks of the live workers once all have arrived there.
        A worker may arrive at later generations meanwhile (SSP rounds: wait on round
        r − s, arrive at r); each generation is released on its own."""
        c = self.caller
        c.losses.check()
        self.send_ticks(wait=True)
        if c.role != "worker":
            raise ConfigError("only workers take part in barriers (this client is a driver)")
        if isinstance(generation, bool) or not isinstance(generation, int):
            raise ConfigError(f"a barrier's generation must be a whole number, got {generation!r}")
        out: Future[Any] = Future()

        def done(f: Future[Any]) -> None:
            try:
                out.set_result(list(f.result().header.get("workers", [])))
            except BaseException as exc:  # the request's own error, for whoever waits
                out.set_exception(exc)
        c.rpc.request(c.config.scheduler, {"op": Op.BARRIER.value, "generation": generation}).add_done_callback(done)
        return out

    def resync(self) -> None:
        """Take the live servers' minimum clock.  A server that dies meanwhile is skipped:
        its vnodes fail over to servers that answer, and a worker must not fail a job for
        a server the cluster survives (it failed the job even at replicas 2)."""
        c = self.caller
        futures = [c.rpc.request(address, {"op": Op.STATS.value}) for address in c.state.view.servers.values()]
        mins = []
        for future in futures:
            try:
                mins.append(future.result(timeout=c.config.heartbeat_timeout_s * 4).header.get("min_clock"))
            except (NodeLostError, TimeoutError) as exc:
                logger.info("clock resync: a server did not answer (%s); the others decide", exc)
        with c.lock:
            c.clock = max([c.clock, *[m for m in mins if m is not None]])
