"""A worker on the simulated network: the client's own call driver (``client/scatter.py``:
``Scatter``, which ``Client`` drives from its I/O thread) through ``SimPort``, on callbacks.

What a pull or a push does is the client's: routing to pieces (``route``), the filters'
steps of a push (``ClientFilters.push_steps``), the call's header and each piece's
request (``call_header``, ``request``: the ring version, the push's ``seq`` kept by every
retry, the acked watermark of ``Sequencer``), the decision on every answer (``decide``:
done, resend routed again with the newest ring after the client's back-off, or fail),
and the sends, resends and completion of the call (``Scatter``).  What is the
simulation's is only the I/O (``SimPort``): the sockets, the request ids, the timers on
the host's virtual clock, and a request unanswered for ``answer_within_s`` failing with
``NoAnswerError`` as the I/O thread's do.  Registration, heartbeats and the scheduler's
notifications are the client's protocol, written as callbacks (nothing here may block).

A table the worker caches rows of (``cache_rows``) is pulled and pushed through the
client's own ``CachedCalls`` (``client/cached_calls.py``), on ``SimCachePort``: the row
cache's pulls and pushes go out as this worker's own do, so that the campaign runs the
client's cache, not a copy of it.  Its ``watch`` sees every push the cache sends (the
sums it gathered, and the gradients it did not), with its future: the invariants count
what reaches the servers (``testing/cache_ledger.py``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from paramserver.client import core
from paramserver.client.cached_calls import CachedCalls, OnPiece, Prepare
from paramserver.client.core import (
    NoAnswerError,
    Piece,
    RouteMemo,
    Scheduler,
    Sequencer,
    View,
    Wire,
    call_header,
    clock_request,
    push_header,
    route,
    rows_into,
)
from paramserver.client.filtering import ClientFilters
from paramserver.client.life_calls import with_stats
from paramserver.client.row_cache import RowCache
from paramserver.client.scatter import Scatter
from paramserver.client.ticks import send_tick
from paramserver.config import Config
from paramserver.errors import Code, NodeLostError
from paramserver.filters.chain import Chain
from paramserver.filters.packed import PackedRows
from paramserver.routing.ring import Ring
from paramserver.tables.spec import TableSpec
from paramserver.testing.sim import Host, SimNetwork, SimSocket
from paramserver.wire.message import Message, Op, decode, encode

Done = Callable[[Any, "str | None"], None]  # (result, error)
OnAnswer = Callable[[Message | None, BaseException | None], None]


class _Call:
    __slots__ = ("done", "sent_at", "server")

    def __init__(self, server: int, done: OnAnswer, sent_at: float) -> None:
        self.server, self.done, self.sent_at = server, done, sent_at


class SimPort:
    """A ``SimWorker``'s ``scatter.Port``: the client's calls in flight (``scatter.Scatter``,
    the class ``Client`` drives) on this worker's view and push numbers, through the
    simulated network, on the host's virtual clock."""

    def __init__(self, worker: SimWorker) -> None:
        self.w = worker
        self.memo = RouteMemo()  # as the client's (``ClientState.memo``)

    @property
    def retry_timeout_s(self) -> float:
        return self.w.config.retry_timeout_s

    def now(self) -> float:
        return self.w.host.now()

    def ring(self) -> Ring:
        assert self.w.ring is not None, "a worker routes once it was welcomed"
        return self.w.ring

    def scheduler(self) -> Scheduler:
        return Scheduler(self.w.scheduler, self.w.config.heartbeat_timeout_s)

    def refresh_view(self) -> None:
        self.w.refresh()

    def routed(self, kind: Op, keys: np.ndarray, extra: np.ndarray | PackedRows | None, layout: int,
               distinct: bool = False, ordered: bool = False) -> list[Piece]:
        return route(self.ring(), kind, keys, extra, layout, distinct, ordered, self.memo)

    def outgoing(self, kind: Op, header: dict[str, Any], piece: Piece, tries: int,
                 wire: Wire | None = None) -> tuple[str | None, dict[str, Any], list[np.ndarray]]:
        out, arrays = core.request(kind, header, piece, tries, self.w.sequencer, wire)  # through the module: see core
        return self.w.view.servers.get(piece.server), out, arrays

    def submit(self, address: str, header: dict[str, Any], arrays: list[np.ndarray], on_reply: OnAnswer) -> None:
        server = next((s for s, a in self.w.view.servers.items() if a == address), None)
        if server is None or not self.w.ask(server, header, arrays, on_reply):
            on_reply(None, NodeLostError(f"{address} left the ring"))

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.w.host.after(delay_s, fn)

    def count(self, what: str) -> None:
        """Calls are counted by the campaign, not here."""


#: (worker, table, keys, gradients (or a trained row's changes), the push's future, its op)
Watch = Callable[[str, str, np.ndarray, np.ndarray, Future[Any], str], None]


class SimCachePort:
    """``CachedCalls``' port on a ``SimWorker``: its ring, specs, filters and sends."""

    def __init__(self, worker: SimWorker) -> None:
        self.w = worker
        self.watch: Watch | None = None

    def ring_version(self) -> int:
        return self.w.port.ring().version

    def node_id(self) -> int:
        return self.w.node_id

    def spec(self, table: str) -> TableSpec:
        return self.w.specs[table]

    def reply_chain(self, spec: TableSpec) -> Chain | None:
        return self.w.filters.reply_chain(spec)

    def pull_wire(self, spec: TableSpec) -> Wire | None:
        return self.w.filters.wire(spec, "pull")

    def scatter_pull(self, spec: TableSpec, keys: np.ndarray, positions: np.ndarray, on_piece: OnPiece,
                     result: np.ndarray, extra_header: dict[str, Any], prepare: Prepare | None) -> Future[Any]:
        return self.w.scatter_pull(spec, keys, positions, on_piece, result, extra_header, prepare)

    def push(self, spec: TableSpec, keys: np.ndarray, grads: np.ndarray, distinct: bool,
             op: str = "update", on_piece: OnPiece | None = None) -> Future[Any]:
        _, future = self.w.send_push(spec, keys, grads, op, distinct, on_piece)
        if self.watch is not None:
            self.watch(self.w.name, spec.name, keys, grads, future, op)
        return future


def _pulled(done: Done) -> Callable[[Future[Any]], None]:
    """A pull's future, as the simulation's callbacks take it: ``done(rows, error)``."""
    def finished(future: Future[Any]) -> None:
        exc = future.exception()
        done(future.result() if exc is None else None, None if exc is None else f"{type(exc).__name__}: {exc}")
    return finished


def _finished(result: Any, done: Done) -> Callable[[Future[Any]], None]:
    """A call's future, as the simulation's callbacks take it: ``done(result, error)``."""
    def finished(future: Future[Any]) -> None:
        exc = future.exception()
        done(result, None if exc is None else f"{type(exc).__name__}: {exc}")
    return finished


class SimWorker:
    """A worker: register, beat, and pull, push and clock through callbacks."""

    def __init__(self, net: SimNetwork, config: Config, scheduler: str, name: str, rate: float = 1.0) -> None:
        self.net, self.config, self.scheduler, self.name = net, config, scheduler, name
        self.host: Host = net.host(name, rate)
        self.transport = self.host.transport()
        # the simulated network loses messages on the workers' links (what a broken connection
        # does to what it carried): a request unanswered this long fails as the I/O thread's do
        # when a client sets ClientState.answer_within_s
        self.answer_within_s = 2 * config.heartbeat_timeout_s
        self.sched = self.transport.connect(scheduler, config.max_message_bytes)
        self.socks: dict[int, SimSocket] = {}
        self.node_id = -1
        self.view = View()
        self.specs: dict[str, TableSpec] = {}
        self.sequencer = Sequencer()
        self.filters = ClientFilters()  # the tables' filters, as a client's
        self.clock = 0
        self.port = SimPort(self)  # what the client's calls in flight need of this worker
        self.row_caches: dict[str, RowCache] = {}  # the tables whose rows this worker caches
        self.cache_port = SimCachePort(self)  # what their pulls and pushes go through
        self.cached = CachedCalls(self.cache_port, self.row_caches)
        self.calls: dict[int, _Call] = {}  # request id -> what waits on its answer
        self.sched_calls: dict[int, Callable[[Message], None]] = {}
        self._ids = itertools.count(1)
        self.registered: Callable[[], None] | None = None
        self.on_exit: Callable[[], None] | None = None  # it learnt that it was declared dead, and exited
        self.host.on_turn = self.turn
        self._ask_scheduler({"op": Op.REGISTER.value, "role": "worker"}, self._welcomed)
        net.every(self.host, config.heartbeat_interval_s, self._beat)
        net.every(self.host, config.heartbeat_interval_s, self._expire_unanswered)

    @property
    def live(self) -> bool:
        return self.host.state != "crashed"

    @property
    def ring(self) -> Ring | None:
        return self.view.ring

    # ---- scheduler ----------------------------------------------------------------------
    def _ask_scheduler(self, header: dict[str, Any], on_reply: Callable[[Message], None]) -> None:
        request_id = next(self._ids)
        self.sched_calls[request_id] = on_reply
        self.sched.send(encode({**header, "id": request_id}))

    def _welcomed(self, msg: Message) -> None:
        self.node_id = int(msg.header["node_id"])
        self._view(msg.header)
        if self.registered is not None:
            self.registered()

    def _view(self, header: dict[str, Any]) -> None:
        if "ring" in header and self.view.apply(header):
            self.specs.update({n: TableSpec.from_wire(w) for n, w in header.get("tables", {}).items()})

    def refresh(self) -> None:
        self._ask_scheduler({"op": Op.CLUSTER_INFO.value}, lambda m: self._view(m.header))

    def _beat(self) -> bool:
        if not self.live:
            return False
        if self.node_id >= 0:
            self.sched.send(encode({"op": Op.HEARTBEAT.value}))
        return True

    def create_table(self, spec: TableSpec, done: Done) -> None:
        def answered(msg: Message) -> None:
            if msg.op is Op.OK:
                self.specs[spec.name] = spec
            done(None, None if msg.op is Op.OK else str(msg.header.get("error")))

        self._ask_scheduler({"op": Op.CREATE_TABLE.value, "spec": spec.to_wire()}, answered)

    # ---- receiving ----------------------------------------------------------------------
    def turn(self) -> None:
        while self.sched.poll(0):
            self._from_scheduler(decode(self.sched.recv()))
        for sock in list(self.socks.values()):
            while sock.poll(0):
                msg = decode(sock.recv())
                call = self.calls.pop(msg.id, None) if isinstance(msg.id, int) else None
                if call is not None:
                    call.done(msg, None)

    def _from_scheduler(self, msg: Message) -> None:
        if isinstance(msg.id, int) and msg.id in self.sched_calls:
            self.sched_calls.pop(msg.id)(msg)
        elif msg.op is Op.RING:
            self._view(msg.header)
        elif msg.op is Op.NODE_LOST and msg.header.get("role") == "server":
            lost = int(msg.header["node_id"])
            error = NodeLostError(f"server {lost} died with this request in flight")
            for request_id, call in [(i, c) for i, c in self.calls.items() if c.server == lost]:
                del self.calls[request_id]
                call.done(None, error)
            self.refresh()
        elif msg.op is Op.STOP:
            self.host.crash()
        elif msg.op is Op.ERROR and msg.header.get("code") == Code.UNKNOWN_NODE:
            self.net.log(f"exit {self.name} (declared dead)")  # as a real worker does
            self.host.crash()
            if self.on_exit is not None:
                self.on_exit()

    def _expire_unanswered(self) -> bool:
        """A request unanswered for ``answer_within_s`` fails as the I/O thread's do."""
        if not self.live:
            return False
        now = self.host.now()
        for request_id, call in [(i, c) for i, c in self.calls.items() if now - c.sent_at > self.answer_within_s]:
            del self.calls[request_id]
            call.done(None, NoAnswerError(f"server {call.server} did not answer within {self.answer_within_s:g} s"))
        return True

    # ---- sending ------------------------------------------------------------------------
    def _sock(self, server: int) -> SimSocket | None:
        if server not in self.view.servers:
            return None
        if server not in self.socks:
            self.socks[server] = self.transport.connect(self.view.servers[server], self.config.max_message_bytes)
        return self.socks[server]

    def ask(self, server: int, header: dict[str, Any], arrays: list[np.ndarray], done: OnAnswer) -> bool:
        """Send a request to ``server``; ``done`` gets its answer.  False: no address for it."""
        sock = self._sock(server)
        if sock is None:
            return False
        request_id = next(self._ids)
        self.calls[request_id] = _Call(server, done, self.host.now())
        sock.send(encode({**header, "id": request_id}, arrays))
        return True

    def ask_servers(self, header: dict[str, Any], done: Done) -> None:
        """Send ``header`` to every server of this worker's ring; ``done`` gets their
        answers (headers, in server order), or the first error."""
        assert self.ring is not None
        servers = list(self.ring.servers)
        answers: dict[int, dict[str, Any]] = {}
        state = {"over": False}

        def one(server: int, msg: Message | None, exc: BaseException | None) -> None:
            if state["over"]:
                return
            error = None if exc is None else str(exc)
            if error is None and msg is not None and msg.op is Op.ERROR:
                error = f"{msg.header.get('code')}: {msg.header.get('error')}"
            if error is not None or msg is None:
                state["over"] = True
                done(None, f"server {server}: {error}")
                return
            answers[server] = msg.header
            if len(answers) == len(servers):
                done([answers[s] for s in servers], None)

        for server in servers:
            if not self.ask(server, header, [], functools.partial(one, server)):
                one(server, None, NodeLostError("no address"))

    # ---- data ---------------------------------------------------------------------------
    def push(self, table: str, keys: np.ndarray, grads: np.ndarray, done: Done, op: str = "update") -> int:
        """Push (numbered: applied once however often it is resent) as push operation
        ``op``, as ``Client.push`` does; returns its seq (-1: gathered by the table's row
        cache, or part of a push of its sums)."""
        spec = self.specs[table]
        grads = with_stats(spec, np.ascontiguousarray(grads, np.float32), None)
        cache = self.row_caches.get(table)
        if cache is not None and op == "update":
            self.cached.push(spec, keys, grads, False, cache).add_done_callback(_finished(None, done))
            return -1
        seq, future = self.send_push(spec, keys, grads, op, distinct=False)
        future.add_done_callback(_finished(None, done))
        return seq

    def send_push(self, spec: TableSpec, keys: np.ndarray, grads: np.ndarray, op: str, distinct: bool,
                  on_piece: OnPiece | None = None) -> tuple[int, Future[Any]]:
        """A push once checked, as ``Caller.push`` sends it: its seq and future."""
        seq = self.sequencer.take()
        header = call_header(Op.PUSH, spec.name, node_id=self.node_id, worker_clock=self.clock, seq=seq,
                             extra=push_header(spec, op, self.host.now(), read_back=on_piece is not None))
        wire = self.filters.wire(spec, "push", op)
        keys, grads, distinct, prepare = self.filters.push_steps(spec, keys, grads, op, distinct=distinct)
        pieces = self.port.routed(Op.PUSH, keys, grads, spec.layout, distinct, wire is not None and wire.chain.ordered)
        call = Scatter(self.port, Op.PUSH, header, spec.layout, on_piece or (lambda piece, msg: None), None,
                       lambda: self.sequencer.settled(seq), wire)
        return seq, call.start(prepare(pieces) if prepare is not None else pieces)

    def pull(self, table: str, keys: np.ndarray, done: Done) -> None:
        """Pull ``keys``' rows, as ``Client.pull`` does (gated on this worker's clock;
        through the table's row cache if it has one)."""
        spec = self.specs[table]
        cache = self.row_caches.get(table)
        if cache is not None:
            self.cached.pull(spec, keys, cache).add_done_callback(_pulled(done))
            return
        out = np.empty((keys.shape[0], spec.dim), np.float32)
        replies = self.filters.reply_chain(spec)
        self.scatter_pull(spec, keys, None, rows_into(out, spec.dim, replies), out,
                          {"reply_filters": True} if replies is not None else None, None).add_done_callback(
            _finished(out, done))

    def scatter_pull(self, spec: TableSpec, keys: np.ndarray, positions: np.ndarray | None,
                     on_piece: Callable[[Piece, Message], None], out: np.ndarray, extra: dict[str, Any] | None,
                     prepare: Callable[[list[Piece]], list[Piece]] | None) -> Future[Any]:
        """A pull's pieces sent, as ``Caller.scatter`` sends them; resolves to ``out``."""
        header = call_header(Op.PULL, spec.name, node_id=self.node_id, worker_clock=self.clock, extra=extra)
        wire = self.filters.wire(spec, "pull")
        pieces = self.port.routed(Op.PULL, keys, positions, spec.layout,
                                  ordered=wire is not None and wire.chain.ordered)
        if prepare is not None:
            pieces = prepare(pieces)
        return Scatter(self.port, Op.PULL, header, spec.layout, on_piece, out, None, wire).start(pieces)

    def cache_rows(self, table: str, row_cache: str) -> None:
        """Cache ``table``'s rows on this worker, as ``Client.cache_rows`` does."""
        self.cached.use(self.specs[table], row_cache)

    def push_held(self, table: str, done: Done) -> int:
        """Push the sums ``table``'s row cache holds (``Client.push_held``, not waited on);
        the keys pushed (``done`` is called at once when there were none)."""
        sent, future = self.cached.push_held(table)
        if future is None:
            done(None, None)
        else:
            future.add_done_callback(_finished(None, done))
        return sent

    def tick(self, done: Done) -> None:
        """Finish this worker's clock: every server hears the new one, each by a clock
        message of its own tried again while refused (``client/ticks.py``: the client's
        ``send_ticks``).  The client's ride of a tick on the next pull or push is the one
        part of its clock this worker does not run."""
        self.clock += 1
        assert self.ring is not None
        addresses = [a for s, a in self.view.servers.items() if s in self.ring.servers]
        left = {"n": len(addresses)}

        def one(error: BaseException | None) -> None:
            left["n"] -= 1
            if left["n"] == 0:
                done(self.clock, None)

        header = clock_request(self.node_id, self.clock)
        for address in addresses:
            send_tick(self.port, address, header, one, functools.partial(self._on_ring, address))
        if not addresses:
            done(self.clock, None)

    def _on_ring(self, address: str) -> bool:
        return self.ring is not None and any(a == address and s in self.ring.servers
                                             for s, a in self.view.servers.items())
