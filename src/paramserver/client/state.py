"""``ClientState``: what every call of one client shares, as one explicit object: its I/O
thread, its view of the cluster (the ring, the servers' addresses, the tables), its push
numbers, its counters, and the lock over them.  A call in flight (``scatter.Scatter``,
``calls.call``) holds the state, not the ``Client``: the client's public object and the
machinery of its calls meet here and nowhere else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from paramserver.client import core
from paramserver.client.core import Piece, RouteMemo, Scheduler, Sequencer, View, Wire, route
from paramserver.client.filtering import ClientFilters
from paramserver.client.io_thread import IOThread
from paramserver.client.row_cache import RowCache
from paramserver.config import Config
from paramserver.filters.packed import PackedRows
from paramserver.routing.ring import Ring
from paramserver.tables.spec import TableSpec
from paramserver.wire.liveness import process_alive
from paramserver.wire.message import Message, Op


class ClientState:
    """One client's shared state; its methods take ``lock`` where they read or change it.
    It is the ``scatter.Port`` of the client's calls in flight."""

    def __init__(self, config: Config, io: IOThread) -> None:
        self.config, self.io = config, io
        self.lock = threading.Lock()
        self.view = View()  # the ring and the servers this client routes with
        self.tables: dict[str, TableSpec] = {}
        self.sequencer = Sequencer()  # pushes numbered for exactly-once application
        self.filters = ClientFilters()  # links, residuals and bytes of the tables' filters
        self.memo = RouteMemo()  # the last pulls' routings, which pushes of the same keys take
        self.counts: dict[str, int] = {}  # calls by op, and "retries" (pieces routed again): metrics.client_families
        self.keys: dict[str, int] = {}  # keys sent by op (a pull's, a push's): each a key-operation on a server
        self.row_caches: dict[str, RowCache] = {}  # the tables whose rows this client caches (``client/row_cache.py``)
        # a data request unanswered this long fails with NoAnswerError, and is routed again and
        # resent.  None (the default): each request's own (``core.answer_within``: a pull or a
        # push by its size, not a pull a BSP/SSP gate may park, nor a server function, which
        # may compute for long); a number: every data request's, whatever it is.
        self.answer_within_s: float | None = None
        self.scheduler_process = ""  # the scheduler's process (its welcome says), to tell a dead one from a stalled one
        # a server's address -> the fields of the clock this worker finished last, which no
        # request has carried to that server yet: the next pull or push to it does
        # (``outgoing``), or a clock message once ``TICK_RIDE_S`` passed (``Clocks.clock``)
        self.ticks: dict[str, dict[str, Any]] = {}
        self.tick_timer = False  # a timer will send the ticks no request carried

    def apply_view(self, view: dict[str, Any]) -> None:
        """Take a view of the cluster (tables included), unless older than the one held."""
        with self.lock:
            if self.view.apply(view):
                self.tables = {n: TableSpec.from_wire(w) for n, w in view.get("tables", {}).items()}

    @property
    def retry_timeout_s(self) -> float:
        return self.config.retry_timeout_s

    def now(self) -> float:
        return time.monotonic()

    def submit(self, address: str, header: dict[str, Any], arrays: list[np.ndarray],
               on_reply: Callable[[Message | None, BaseException | None], None]) -> None:
        """Send a request through the I/O thread (``ClosedError``: the client is closed)."""
        within = self.answer_within_s
        if within is None:
            within = core.answer_within(header, arrays, self.tables.get(str(header.get("table"))))
        self.io.submit(address, header, arrays, on_reply, answer_within_s=within)

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.io.call_later(delay_s, fn)

    def ring(self) -> Ring:
        with self.lock:
            ring = self.view.ring
        assert ring is not None, "a client has a view once registered"
        return ring

    def refresh_view(self) -> None:
        """Ask the scheduler for the ring (a RING notification may still be on its way)."""
        def done(msg: Message | None, exc: BaseException | None) -> None:
            if msg is not None and msg.op is Op.OK and "ring" in msg.header:
                self.apply_view(msg.header)
        self.io.submit(self.config.scheduler, {"op": Op.CLUSTER_INFO.value}, (), done)

    def routed(self, kind: Op, keys: np.ndarray, extra: np.ndarray | PackedRows | None, layout: int,
               distinct: bool = False, ordered: bool = False) -> list[Piece]:
        """``keys`` routed with the current ring into one piece per server (``core.route``)."""
        return route(self.ring(), kind, keys, extra, layout, distinct, ordered, self.memo)

    def outgoing(self, kind: Op, header: dict[str, Any], piece: Piece, tries: int,
                 wire: Wire | None = None) -> tuple[str | None, dict[str, Any], list[np.ndarray]]:
        """Where ``piece`` goes (None: its server left the ring) and what it goes out as."""
        with self.lock:
            out, arrays = core.request(kind, header, piece, tries, self.sequencer, wire)  # through the module: see core
            address = self.view.servers.get(piece.server)
            if self.ticks and address is not None and (tick := self.ticks.pop(address, None)) is not None:
                out.update(tick)  # behind this worker's pushes to that server, as a clock message would be
            return address, out, arrays

    def take_ticks(self, flying: set[Future[None]]) -> dict[str, tuple[dict[str, Any], Future[None]]]:
        """The ticks no request carried, each server's now to be sent on its own, each with the
        future its answer settles, entered in ``flying`` in the same turn of the lock: who waits
        for every tick in flight (``Clocks.send_ticks(landed=True)``, under this lock) finds a
        tick either still here or its future there.  Taken first and entered after, a worker
        that returned while the timer sent its last ticks waited for one server's of two, and
        the driver read the other's rows before that clock was applied (a loaded machine)."""
        with self.lock:
            ticks, self.ticks, self.tick_timer = self.ticks, {}, False
            taken: dict[str, tuple[dict[str, Any], Future[None]]] = {a: (t, Future()) for a, t in ticks.items()}
            flying.update(future for _, future in taken.values())
        return taken

    def scheduler(self) -> Scheduler:
        """What a decision on an answer needs to know of the scheduler."""
        process = self.scheduler_process
        return Scheduler(self.config.scheduler, self.config.heartbeat_timeout_s, self.io.scheduler_lost(),
                         lambda: process_alive(process) is False)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
