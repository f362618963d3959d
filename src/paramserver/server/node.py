"""A server: holds vnodes of the ring and, per table, one ``VnodeTable`` (a ``DenseVnode``
for a dense table) per held vnode.

Data requests (``PULL``, ``PUSH``, ``CLOCK``, ``STATS``) arrive on the server's ROUTER
from workers' DEALERs; control (``RING``, table commands, ``MIGRATE``, ``STOP``) arrives
on its DEALER to the scheduler.  One thread, one poll loop: a request is validated whole
before any table is touched, so a malformed one changes nothing and gets an error reply.

Hot backup: a table of replication factor r lives on the first r servers of each vnode's
chain.  Clients pull from and push to the primary; the primary applies a push, forwards
it (``REPLICATE``, over a DEALER to each backup, in order) and acknowledges the client
once every live backup has.  Pushes carry (sender, seq): a retried one is applied once
(``server/dedup.py``).  Moving a vnode (``MIGRATE``, from the scheduler to its primary)
copies it whole (``INSTALL``) and forwards every later push on it to the new holder too,
until the scheduler flips the ring.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import zmq

from paramserver import checkpoint
from paramserver.config import Config
from paramserver.consistency.clock import StalenessGate
from paramserver.errors import ConnectError, ParamServerError, ProtocolError, StaleEpochError, UnknownTableError
from paramserver.logutil import Throttled
from paramserver.routing.partition import route_push
from paramserver.routing.ring import Ring
from paramserver.server.dedup import Dedup
from paramserver.server.lease import Lease
from paramserver.server.vnodes import VnodeSet
from paramserver.spec import TableSpec
from paramserver.warm import warm_server
from paramserver.wire.message import Message, Op, decode, encode, error_reply, expect, failed_request, field, reply
from paramserver.wire.sockets import advertised, bind_router, connect_dealer, send

logger = logging.getLogger(__name__)

#: requests with fewer keys run on the loop thread (a thread hand-off costs ~50 µs)
PARALLEL_MIN_KEYS = 32_768
#: vnode copies a migrating server keeps unanswered
COPIES_IN_FLIGHT = 2


class _Acks:
    """What waits on answers from other servers: a client's push (``reply`` is sent
    once every backup applied it) or a migration (``done`` runs once every copy was
    installed).  A server that dies counts as having answered."""

    __slots__ = ("pending", "identity", "request", "done", "failed")

    def __init__(self, identity: bytes | None = None, request: Message | None = None,
                 done: Callable[[str | None], None] | None = None):
        self.pending, self.identity, self.request, self.done = 0, identity, request, done
        self.failed: str | None = None  # why a receiver refused (the client must retry)


def _error_code(exc: ParamServerError) -> str:
    if isinstance(exc, StaleEpochError):
        return "stale_epoch"
    if isinstance(exc, KeyError):
        return "unknown_table"
    return "protocol" if isinstance(exc, ProtocolError) else "error"


class ServerNode:
    """Registers with the scheduler, waits for the ring, then serves until ``STOP``."""

    def __init__(self, config: Config):
        if not config.scheduler:
            raise ConnectError("no scheduler address: pass --scheduler tcp://HOST:PORT "
                               "or set PARAMSERVER_SCHEDULER")
        self.config = config
        self.ctx: zmq.Context = zmq.Context.instance()
        self.router, self.address = bind_router(self.ctx, config.host, config.port,
                                                config.max_message_bytes)
        self.address = advertised(self.address, config.advertise_host, config.scheduler)  # what peers dial
        self.control = connect_dealer(self.ctx, config.scheduler, config.max_message_bytes)
        self.node_id = -1
        self.lease = Lease(config.heartbeat_timeout_s)  # serve clients only under it (server/lease.py)
        self._before_ring: list[list[zmq.Frame]] = []  # INSTALL/REPLICATE that came before the first ring
        self._failures = Throttled(logger)  # a flood of requests that fail logs a few tracebacks, then counts
        self.ring: Ring | None = None
        self.tables: dict[str, VnodeSet] = {}
        self.early_tables: dict[str, TableSpec] = {}
        self.dedup: dict[str, Dedup] = {}
        self.primary = np.zeros(0, bool)  # per vnode: this server is its primary
        self.peers: dict[int, str] = {}  # server id -> address
        self.peer_socks: dict[int, zmq.Socket] = {}
        self.dead: set[int] = set()
        self.moving: dict[str, dict[int, set[int]]] = {}  # table -> vnode -> servers copied to
        self.targets: dict[str, np.ndarray] = {}  # table -> int32[n_vnodes, k]: forward to
        self.awaiting: dict[int, tuple[int, _Acks]] = {}  # request id -> (peer, what waits)
        self.copies: collections.deque = collections.deque()  # (acks, table, vnode, dest) to send
        self.copies_in_flight = 0
        self._next_request = 1
        self.poller = zmq.Poller()
        self.gate = StalenessGate()  # the vector clock of live workers, and parked pulls
        self.aggregates: dict[str, dict[int, list[tuple[np.ndarray, np.ndarray]]]] = {}
        self._running = True
        self._beats_stop = threading.Event()
        # vnodes are independent (the unit of locking), so one request's segments are
        # applied by several threads at once; numba kernels release the GIL
        self.threads = max(1, config.server_threads or os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="paramserver-vnodes") \
            if self.threads > 1 else None
        self.data_handlers: dict[Op, Callable[..., list[Any] | None]] = {Op.PULL: self.on_pull, Op.PUSH: self.on_push,
                              Op.CLOCK: self.on_clock, Op.STATS: self.on_stats,
                              Op.EXPORT: self.on_export, Op.CHECKPOINT: self.on_checkpoint,
                              Op.RESTORE: self.on_restore, Op.REPLICATE: self.on_replicate,
                              Op.INSTALL: self.on_install}
        self.control_handlers = {Op.RING: self.on_ring, Op.CREATE_TABLE: self.on_create_table,
                                 Op.DROP_TABLE: self.on_drop_table, Op.STOP: self.on_stop,
                                 Op.MIGRATE: self.on_migrate,
                                 Op.NODE_LOST: self.on_node_lost, Op.OK: lambda m: None,
                                 Op.WORKERS: self.on_workers,
                                 Op.CHECKPOINT: self.on_scheduler_checkpoint,
                                 Op.ERROR: self.on_scheduler_error}

    # ---- lifecycle ---------------------------------------------------------------------
    def register(self) -> None:
        """Register and wait for the scheduler's answer (``ConnectError`` on timeout)."""
        sent_at = time.monotonic()
        send(self.control, encode({"op": Op.REGISTER.value, "id": 0, "role": "server",
                                   "address": self.address, "pid": os.getpid()}))
        deadline = time.monotonic() + self.config.connect_timeout_s
        while time.monotonic() < deadline:
            if self.control.poll(100):
                msg = decode(self.control.recv_multipart(copy=False))
                if msg.op is Op.ERROR:
                    raise ConnectError(f"scheduler refused server: {msg.header.get('error')}")
                self.node_id = int(msg.header["node_id"])
                self.lease.granted(sent_at)
                logger.info("server %d serving at %s", self.node_id, self.address)
                return
        raise ConnectError(f"server could not reach the scheduler at {self.config.scheduler} within "
                           f"{self.config.connect_timeout_s:g} s: is it running, and is the address "
                           "right? (--scheduler / PARAMSERVER_SCHEDULER)")

    def run(self) -> None:
        warm_server()
        self.register()
        beats = threading.Thread(target=self._heartbeats, name="paramserver-heartbeat", daemon=True)
        beats.start()
        poller = self.poller
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.control, zmq.POLLIN)
        failed_at = 0.0
        try:
            while self._running:
                try:
                    self._turn(poller)
                except Exception:  # a bug or a bad message must not take the server (and its data) down
                    if time.monotonic() - failed_at > 1.0:  # at most one traceback a second
                        logger.exception("server %d: a loop turn failed; it goes on", self.node_id)
                    failed_at = time.monotonic()
        finally:
            self._beats_stop.set()
            beats.join(5)
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            for sock in self.peer_socks.values():
                sock.close(linger=0)
            self.router.close(linger=0)
            self.control.close(linger=0)

    def _turn(self, poller: zmq.Poller) -> None:
        copying = bool(self.copies) and self.copies_in_flight < COPIES_IN_FLIGHT
        ready = dict(poller.poll(0 if copying else 500))
        if self.control in ready:
            while self._running and self.control.poll(0):
                self._handle_control(self.control.recv_multipart(copy=False))
        for peer, sock in list(self.peer_socks.items()):
            if sock in ready:
                self._handle_peer(peer, sock)
        if self.router in ready:
            for _ in range(64):  # bounded, so control messages keep flowing
                if not self._running or not self.router.poll(0):
                    break
                self._handle_data(self.router.recv_multipart(copy=False))
        if self.copies and self.copies_in_flight < COPIES_IN_FLIGHT and self._running:
            self._copy_next()

    def _heartbeats(self) -> None:
        """Beat from a thread of its own, so a long request (a JIT compile, a big table
        growth) is not mistaken for death; numba kernels release the GIL."""
        sock = connect_dealer(self.ctx, self.config.scheduler, self.config.max_message_bytes)
        try:
            while not self._beats_stop.wait(self.config.heartbeat_interval_s):
                send(sock, encode({"op": Op.HEARTBEAT.value, "node_id": self.node_id, "seq": self.lease.beat()}))
                while sock.poll(0):
                    msg = decode(sock.recv_multipart())
                    if msg.op is Op.HEARTBEAT:  # the scheduler heard the beat: the lease runs on
                        self.lease.answered(msg.header.get("seq"))
                    elif msg.op is Op.ERROR and msg.header.get("code") == "unknown_node":
                        logger.error("server %d was declared dead by the scheduler: stopping, "
                                     "so that a zombie never serves stale vnodes", self.node_id)
                        self._running = False
                        return
        finally:
            sock.close(linger=0)

    # ---- dispatch ----------------------------------------------------------------------
    def _handle_data(self, frames: list[zmq.Frame]) -> None:
        identity, request_id = frames[0].bytes, None
        try:
            msg = decode(frames[1:], self.config.max_message_bytes)
            request_id = msg.id
            handler = self.data_handlers.get(msg.op)
            if self.ring is None and msg.op in (Op.INSTALL, Op.REPLICATE) and len(self._before_ring) < 10_000:
                self._before_ring.append(frames)  # a joiner's copies can overtake its first ring: kept for it
                return
            if msg.op in (Op.PULL, Op.PUSH) and not self.lease.valid():
                raise StaleEpochError(f"server {self.node_id} has had no answer from the scheduler for "
                                      f"{self.lease.expired_for() + self.lease.length:.1f} s: its lease ran out, "
                                      "so it may have been declared dead; retry on the current ring")
            if handler is None:
                raise ProtocolError(f"a server does not serve op {msg.op.value!r} "
                                    f"(serves {sorted(o.value for o in self.data_handlers)})")
            answer = handler(msg, identity) if msg.op in (Op.PULL, Op.PUSH) else handler(msg)
            if answer is not None:  # None: parked by the staleness gate, or waiting for backups
                send(self.router, answer, identity)
        except ParamServerError as exc:
            request_id = failed_request(exc, request_id)
            logger.debug("refused request %r: %s", request_id, exc)
            send(self.router, error_reply(request_id, _error_code(exc), str(exc),
                                          epoch=self.ring.epoch if self.ring else 0), identity)
        except Exception as exc:  # a bug must not kill the server: answer and keep serving
            self._failures.exception("server %d failed on request %r", self.node_id, request_id)
            send(self.router, error_reply(request_id, "internal", f"{type(exc).__name__}: {exc}"),
                 identity)

    def _handle_control(self, frames: list[zmq.Frame]) -> None:
        request_id = None
        try:
            msg = decode(frames, self.config.max_message_bytes)
            request_id = msg.id
            handler = self.control_handlers.get(msg.op)
            if handler is None:
                raise ProtocolError(f"unexpected control op {msg.op.value!r}")
            handler(msg)
        except Exception as exc:
            logger.exception("server %d: bad control message", self.node_id)
            send(self.control, error_reply(request_id, "error", f"{type(exc).__name__}: {exc}"))

    # ---- peers (other servers) ---------------------------------------------------------
    def _peer(self, server: int) -> zmq.Socket:
        sock = self.peer_socks.get(server)
        if sock is None:
            sock = connect_dealer(self.ctx, self.peers[server], self.config.max_message_bytes)
            self.peer_socks[server] = sock
            self.poller.register(sock, zmq.POLLIN)
        return sock

    def _ask(self, server: int, header: dict[str, Any], arrays: list[np.ndarray], acks: _Acks) -> None:
        """Send a request to another server; ``acks`` hears when it answers (or dies)."""
        request_id, self._next_request = self._next_request, self._next_request + 1
        self.awaiting[request_id] = (server, acks)
        acks.pending += 1
        send(self._peer(server), encode({**header, "id": request_id}, arrays))

    def _handle_peer(self, peer: int, sock: zmq.Socket) -> None:
        for _ in range(256):
            if not sock.poll(0):
                return
            try:
                msg = decode(sock.recv_multipart(copy=False), self.config.max_message_bytes)
            except ProtocolError as exc:
                logger.error("server %d: undecodable answer from server %d: %s", self.node_id, peer, exc)
                continue
            error = None
            if msg.op is Op.ERROR:
                error = f"server {peer} refused: {msg.header.get('error')}"
                logger.error("server %d: %s", self.node_id, error)
            entry = self.awaiting.pop(msg.id, None) if isinstance(msg.id, int) else None
            if entry is not None:
                self._acked(entry[1], error)

    def _acked(self, acks: _Acks, error: str | None = None) -> None:
        acks.failed = acks.failed or error
        acks.pending -= 1
        if acks.pending <= 0:
            self._finish(acks)

    def _finish(self, acks: _Acks) -> None:
        if acks.request is not None and acks.identity is not None:
            if acks.failed:  # applied here, not on every backup: the client retries, and the
                # retry (same seq) is skipped where applied and forwarded again
                send(self.router, error_reply(acks.request.id, "stale_epoch", f"{acks.failed}; retry",
                                              epoch=self.ring.epoch if self.ring else 0), acks.identity)
            else:
                send(self.router, reply(acks.request), acks.identity)
        if acks.done is not None:
            acks.done(acks.failed)

    def _server_lost(self, server: int) -> None:
        """A server died: nothing waits on it any more (a push is acknowledged once every
        *live* backup applied it)."""
        self.dead.add(server)
        self.peers.pop(server, None)
        sock = self.peer_socks.pop(server, None)
        if sock is not None:
            self.poller.unregister(sock)
            sock.close(linger=0)
        for by_vnode in self.moving.values():
            for dests in by_vnode.values():
                dests.discard(server)
        self._refresh_targets()
        for request_id, (peer, acks) in list(self.awaiting.items()):
            if peer == server:
                del self.awaiting[request_id]
                self._acked(acks)

    def _refresh_targets(self) -> None:
        """Per table and vnode, the servers a push is forwarded to: its backups, and
        whoever a vnode is being copied to."""
        assert self.ring is not None
        self.targets = {}
        for name, table in self.tables.items():
            r = table.spec.replicas
            columns = [self.ring.chains[:, j] for j in range(1, r)]
            moving = self.moving.get(name, {})
            for k in range(max((len(d) for d in moving.values()), default=0)):
                col = np.full(self.ring.n_vnodes, -1, np.int32)
                for v, dests in moving.items():
                    if k < len(dests):
                        col[v] = sorted(dests)[k]
                columns.append(col)
            if columns:
                t = np.column_stack(columns).astype(np.int32)
                t[np.isin(t, list(self.dead | {self.node_id}))] = -1
                if (t >= 0).any():
                    self.targets[name] = t

    def _forward(self, table: VnodeSet, msg: Message, keys: np.ndarray, grads: np.ndarray,
                 vnodes: np.ndarray, counts: np.ndarray, identity: bytes) -> bool:
        """Forward an applied push to the servers that also hold its vnodes; True if the
        client's acknowledgement now waits for theirs."""
        targets = self.targets.get(table.spec.name)
        if targets is None or vnodes.size == 0:
            return False
        per_segment = targets[vnodes]
        servers = np.unique(per_segment[per_segment >= 0]).tolist()
        if not servers:
            return False
        assert self.ring is not None, "targets exist once a ring does"
        acks = _Acks(identity, msg)
        header: dict[str, Any] = {
            "op": Op.REPLICATE.value, "table": table.spec.name, "epoch": self.ring.epoch,
            **{k: msg.header[k] for k in ("sender", "seq", "acked", "clock") if k in msg.header}}
        for server in servers:
            segs = (per_segment == server).any(axis=1)
            if segs.all():
                arrays = [keys, grads, vnodes, counts]
            else:
                rows = np.repeat(segs, counts)
                arrays = [keys[rows], grads[rows], vnodes[segs], counts[segs]]
            self._ask(server, header, arrays, acks)
        return True

    # ---- control -----------------------------------------------------------------------
    def on_ring(self, msg: Message) -> None:
        """A new ring (first one, a failover, or a finished migration): hold exactly the
        vnodes it gives this server; copies in progress are over."""
        self.ring = Ring.from_wire(msg.header["ring"])
        self.peers = {int(k): v for k, v in msg.header.get("servers", {}).items() if int(k) != self.node_id}
        awaited = {peer for peer, _ in self.awaiting.values()}
        for gone in [p for p in self.peer_socks if p not in self.peers and p not in awaited]:
            sock = self.peer_socks.pop(gone)
            self.poller.unregister(sock)
            sock.close(linger=0)
        for name, wire in msg.header.get("tables", {}).items():
            if name not in self.tables:
                self._add_table(TableSpec.from_wire(wire))
        for spec in self.early_tables.values():  # created before this server had a ring
            if spec.name not in self.tables:
                self._add_table(spec)
        self.early_tables.clear()
        for table in self.tables.values():
            table.set_vnodes(self.ring.held_by(self.node_id, table.spec.replicas))
        self.primary = self.ring.owners == self.node_id
        self.moving.clear()
        self.copies.clear()  # a copy not sent yet belongs to a plan the flip made void
        self._refresh_targets()
        logger.info("server %d: ring epoch %d, primary of %d vnode(s)", self.node_id, self.ring.epoch,
                    int(self.primary.sum()))
        early, self._before_ring = self._before_ring, []
        for frames in early:  # copies that came before this server's first ring (another socket)
            self._handle_data(frames)

    def _add_table(self, spec: TableSpec) -> None:
        assert self.ring is not None
        self.tables[spec.name] = VnodeSet(spec, self.ring.n_vnodes, self.ring.held_by(self.node_id, spec.replicas))
        self.dedup[spec.name] = Dedup(self.ring.n_vnodes, horizon_s=2 * self.config.retry_timeout_s)

    def on_create_table(self, msg: Message) -> None:
        spec = TableSpec.from_wire(msg.header["spec"])
        if self.ring is None:  # a joiner still waiting for its first ring: keep it for then
            self.early_tables[spec.name] = spec
        elif spec.name not in self.tables:
            self._add_table(spec)
            self._refresh_targets()
        send(self.control, reply(msg))

    def on_drop_table(self, msg: Message) -> None:
        name = field(msg, "name", str)
        self.tables.pop(name, None)
        self.early_tables.pop(name, None)
        self.dedup.pop(name, None)
        self.aggregates.pop(name, None)
        self.moving.pop(name, None)
        self._refresh_targets()
        send(self.control, reply(msg))

    def on_migrate(self, msg: Message) -> None:
        """Copy vnodes to the servers that will hold them after the next ring flip: a
        snapshot, then every push on them forwarded too (same channel: in order).  One
        vnode a loop turn (``_copy_next``), at most ``COPIES_IN_FLIGHT`` unanswered, so
        requests keep being served here and forwarded pushes do not queue behind a
        backlog of copies at the receiver."""
        migration = field(msg, "migration", int)
        moves = field(msg, "moves", list)
        if not all(isinstance(m, list) and len(m) == 3 and isinstance(m[0], str)
                   and all(isinstance(x, int) and not isinstance(x, bool) for x in m[1:]) for m in moves):
            raise ProtocolError(f"migrate: moves must be [[table, vnode, dest], ...], got {moves[:3]!r}")

        def done(failed: str | None) -> None:
            send(self.control, encode({"op": Op.MIGRATED.value, "migration": migration, "node_id": self.node_id,
                                       "failed": failed}))

        acks = _Acks(done=done)
        acks.pending = 1  # held until the last copy is sent: done cannot come before
        self.copies.extend((acks, name, vnode, dest) for name, vnode, dest in moves)
        self.copies.append((acks, None, -1, -1))
        logger.info("server %d: migration %d: %d vnode copies to send", self.node_id, migration, len(moves))

    def _copied(self, acks: _Acks, failed: str | None) -> None:
        self.copies_in_flight -= 1
        self._acked(acks, failed)

    def _copy_next(self) -> None:
        acks, name, vnode, dest = self.copies.popleft()
        if name is None:  # every copy of this migration is sent
            self._acked(acks)
            return
        table = self.tables.get(name)
        if table is None or dest in self.dead or dest not in self.peers:
            return
        vt = table.tables.get(vnode)
        keys, rows = vt.items() if vt is not None else (np.zeros(0, np.uint64), np.zeros((0, table.width), np.float32))
        buffered = self._buffered(name, vnode)  # BSP aggregation: pushes of unfinished clocks
        header = {"op": Op.INSTALL.value, "table": name, "vnode": vnode, "from": self.node_id,
                  "seqs": self.dedup[name].export(vnode), "buffered": [c for c, _, _ in buffered],
                  "clocks": {str(w): c for w, c in self.gate.vector.clocks.items()}, "append": False}
        # a vnode bigger than a message goes in several: the first replaces, the rest add
        step = max(1, (self.config.max_message_bytes - (2 << 20)) // (8 + 4 * table.width))
        copy = _Acks(done=lambda failed: self._copied(acks, failed))
        acks.pending += 1
        self.copies_in_flight += 1
        for start in range(0, max(1, keys.shape[0]), step):
            chunk = [keys[start:start + step], rows[start:start + step]]
            if start == 0:
                self._ask(dest, header, [*chunk, *[a for _, k, g in buffered for a in (k, g)]], copy)
            else:
                self._ask(dest, {"op": Op.INSTALL.value, "table": name, "vnode": vnode, "from": self.node_id,
                                 "seqs": [], "buffered": [], "append": True}, chunk, copy)
        self.moving.setdefault(name, {}).setdefault(vnode, set()).add(dest)
        self._refresh_targets()

    def on_stop(self, msg: Message) -> None:
        logger.info("server %d stopping", self.node_id)
        self._running = False

    def on_node_lost(self, msg: Message) -> None:
        role, node_id = msg.header.get("role"), int(msg.header["node_id"])
        if role == "server":
            self._server_lost(node_id)
            return
        for dedup in self.dedup.values():  # a client that left or died never retries
            dedup.forget(node_id)
        if role == "worker":
            self.gate.vector.leave(node_id)
            self._clocks_moved()

    def on_workers(self, msg: Message) -> None:
        self.gate.vector.set_members([int(w) for w in msg.header.get("workers", [])])
        self._clocks_moved()

    def _clocks_moved(self) -> None:
        """Apply finished clocks' aggregated pushes, then answer the pulls now allowed."""
        low = self.gate.vector.min()
        for name, by_clock in self.aggregates.items():
            for clock in sorted(c for c in by_clock if c < low):
                self._apply_aggregate(name, by_clock.pop(clock))
        for identity, msg in self.gate.release(time.monotonic()):
            try:
                send(self.router, self._serve_pull(msg), identity)
            except ParamServerError as exc:  # e.g. the table was dropped, or the vnode moved, meanwhile
                send(self.router, error_reply(msg.id, _error_code(exc), str(exc),
                                              epoch=self.ring.epoch if self.ring else 0), identity)
            except Exception as exc:  # a bug: this caller still gets an answer
                logger.exception("server %d failed on a released pull", self.node_id)
                send(self.router, error_reply(msg.id, "internal", f"{type(exc).__name__}: {exc}"), identity)

    def _apply_aggregate(self, name: str, pushes: list[tuple[np.ndarray, np.ndarray]]) -> None:
        table = self.tables.get(name)
        if table is None or not pushes:
            return
        assert self.ring is not None
        routed = route_push(self.ring, np.concatenate([k for k, _ in pushes]),
                            np.concatenate([g for _, g in pushes]), table.bits)  # one summed row per key
        assert routed.grads is not None
        for part in routed.parts:
            held = table.holds(part.vnodes)  # the ring may have moved a vnode meanwhile
            rows = np.repeat(held, part.counts)
            table.apply(part.vnodes[held], part.counts[held], routed.keys[part.start:part.stop][rows],
                        routed.grads[part.start:part.stop][rows])

    def on_scheduler_error(self, msg: Message) -> None:
        logger.error("server %d: scheduler says: %s", self.node_id, msg.header.get("error"))

    # ---- data --------------------------------------------------------------------------
    def _table(self, msg: Message, n_keys: int, vnodes: np.ndarray, counts: np.ndarray,
               primary: bool = True) -> VnodeSet:
        """The request's table, after checking its vnode segments (and, for a client's
        request, that this server is their primary: else the client's ring is stale)."""
        name = field(msg, "table", str)
        table = self.tables.get(name)
        if table is None:
            raise UnknownTableError(f"unknown table {name!r} (tables: {sorted(self.tables)})")
        epoch = field(msg, "epoch", int)
        assert self.ring is not None
        if (vnodes.shape != counts.shape or (counts < 0).any() or (counts > n_keys).any()
                or sum(counts.tolist()) != n_keys):  # Python ints: an int64 sum could wrap around
            raise ProtocolError(f"vnode counts do not cover the {n_keys} keys exactly")
        if len(set(vnodes.tolist())) != vnodes.size:  # a vnode twice could be applied by two threads
            raise ProtocolError("a request lists a vnode more than once")
        if ((vnodes < 0) | (vnodes >= self.ring.n_vnodes)).any():
            raise ProtocolError(f"vnodes must be in [0, {self.ring.n_vnodes}), got "
                                f"{sorted(set(vnodes.tolist()))[:8]}")
        if primary and not (self.primary[vnodes].all() and table.holds(vnodes).all()):
            raise StaleEpochError(f"server {self.node_id} is not the primary of all of vnodes "
                                  f"{sorted(set(vnodes.tolist()))[:8]}... (request routed at epoch {epoch}, "
                                  f"this server is at epoch {self.ring.epoch})")
        keys = msg.arrays[0]
        bad = table.check(vnodes, counts, keys)  # dense tables index arrays with the keys
        if bad >= 0:
            raise ProtocolError(f"table {name!r} is dense (key_bits={table.bits}): key {int(keys[bad])} is "
                                f"outside the key space or not in the vnode segment it was sent in")
        return table

    def _split(self, vnodes: np.ndarray, counts: np.ndarray,
               fn: Callable[[slice, slice], None]) -> None:
        """Call ``fn(segments, keys)`` on slices of the request: one, or one per vnode
        thread when the request is big (vnodes are independent; kernels drop the GIL)."""
        ends = np.cumsum(counts)
        total = int(ends[-1]) if ends.size else 0
        if self._pool is None or vnodes.size < 2 or total < PARALLEL_MIN_KEYS:
            fn(slice(0, vnodes.size), slice(0, total))
            return
        cuts = np.unique(np.searchsorted(ends, np.arange(1, self.threads) * total / self.threads) + 1)
        bounds = [0, *[int(c) for c in cuts if 0 < c < vnodes.size], int(vnodes.size)]
        starts = np.concatenate([[0], ends])
        futures = [self._pool.submit(fn, slice(lo, hi), slice(int(starts[lo]), int(starts[hi])))
                   for lo, hi in zip(bounds, bounds[1:])]
        for f in futures:
            f.result()

    def on_pull(self, msg: Message, identity: bytes = b"") -> list[Any] | None:
        keys, vnodes, counts = expect(msg, ("keys", "<u8", 1), ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        table = self._table(msg, keys.shape[0], vnodes, counts)
        clock = msg.header.get("clock")
        if isinstance(clock, int):  # ASP is admitted at once, and its staleness recorded too
            if not self.gate.admit(clock, table.spec.staleness, (identity, msg), time.monotonic()):
                return None  # answered by _clocks_moved
        return self._serve_pull(msg, table)

    def _serve_pull(self, msg: Message, table: VnodeSet | None = None) -> list[Any]:
        """Answer a pull (``table``: checked for this request already; a pull the gate
        held is checked again, the ring may have moved meanwhile)."""
        keys, vnodes, counts = msg.arrays
        if table is None:
            table = self._table(msg, keys.shape[0], vnodes, counts)
        out = np.empty((keys.shape[0], table.spec.dim), np.float32)
        self._split(vnodes, counts, lambda s, k: table.lookup(vnodes[s], counts[s], keys[k], out[k]))
        return reply(msg, [out])

    def on_push(self, msg: Message, identity: bytes = b"") -> list[Any] | None:
        keys, grads, vnodes, counts = expect(msg, ("keys", "<u8", 1), ("grads", "<f4", 2),
                                             ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        table = self._table(msg, keys.shape[0], vnodes, counts)
        self._check_grads(table, keys, grads)
        self._apply(table, msg, *self._fresh(table, msg, keys, grads, vnodes, counts))
        # forwarded whole, even the part already applied here: a retry after a failover
        # may find this server with the push and a backup without it; backups dedup too
        return None if self._forward(table, msg, keys, grads, vnodes, counts, identity) else reply(msg)

    def on_replicate(self, msg: Message) -> list[Any]:
        """A push the primary applied, forwarded: apply it to the vnodes held here (a
        ring flip may have moved some meanwhile; those are no longer this server's)."""
        keys, grads, vnodes, counts = expect(msg, ("keys", "<u8", 1), ("grads", "<f4", 2),
                                             ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        table = self._table(msg, keys.shape[0], vnodes, counts, primary=False)  # unknown: the primary retries
        self._check_grads(table, keys, grads)
        held = table.holds(vnodes)
        if not held.all():
            rows = np.repeat(held, counts)
            keys, grads, vnodes, counts = keys[rows], grads[rows], vnodes[held], counts[held]
        keys, grads, vnodes, counts = self._fresh(table, msg, keys, grads, vnodes, counts)
        self._apply(table, msg, keys, grads, vnodes, counts)
        return reply(msg, applied=int(keys.shape[0]))

    def on_install(self, msg: Message) -> list[Any]:
        """A whole vnode copied here (keys, values, optimiser state, applied pushes, and
        for BSP aggregation the pushes of unfinished clocks).  Checked whole first."""
        name, vnode = field(msg, "table", str), field(msg, "vnode", int)
        sender, seqs, buffered = field(msg, "from", int), field(msg, "seqs", list), field(msg, "buffered", list)
        clocks = msg.header.get("clocks") or {}
        table = self.tables.get(name)
        assert self.ring is not None
        if table is None:
            raise UnknownTableError(f"install: unknown table {name!r} (tables: {sorted(self.tables)})")
        if sender in self.dead:
            raise ProtocolError(f"install from server {sender}, which was declared dead")
        if not 0 <= vnode < self.ring.n_vnodes:
            raise ProtocolError(f"install: vnode {vnode} is not in [0, {self.ring.n_vnodes})")
        if len(msg.arrays) != 2 + 2 * len(buffered) or not all(isinstance(c, int) for c in buffered):
            raise ProtocolError(f"install: {len(msg.arrays)} arrays for {len(buffered)} buffered clocks")
        if not all(isinstance(r, list) and len(r) == 3 and isinstance(r[0], int) and isinstance(r[1], int)
                   and isinstance(r[2], list) and all(isinstance(q, int) for q in r[2]) for r in seqs):
            raise ProtocolError("install: seqs must be [[sender, acked, [seq, ...]], ...]")
        if not isinstance(clocks, dict) or not all(isinstance(c, int) and str(w).isdigit() for w, c in clocks.items()):
            raise ProtocolError("install: clocks must map worker ids to ints")
        keys, rows = msg.arrays[0], msg.arrays[1]
        if keys.dtype != np.uint64 or keys.ndim != 1 or rows.dtype != np.float32 \
                or rows.shape != (keys.shape[0], table.width):
            raise ProtocolError(f"install of {name!r}/{vnode}: keys must be <u8[n] and rows <f4[n, {table.width}], "
                                f"got {keys.dtype}{keys.shape} and {rows.dtype}{rows.shape}")
        pairs = [(c, msg.arrays[2 + 2 * i], msg.arrays[3 + 2 * i]) for i, c in enumerate(buffered)]
        for _, k, g in pairs:
            self._check_grads(table, k, g)
        for k in [keys, *[k for _, k, _ in pairs]]:  # a dense table indexes arrays with them
            bad = table.check(np.array([vnode], np.int32), np.array([k.shape[0]], np.int64), k)
            if bad >= 0:
                raise ProtocolError(f"install of {name!r}/{vnode}: key {int(k[bad])} is not in that vnode of "
                                    f"the dense table (key_bits={table.bits})")
        if msg.header.get("append") is True:  # the rest of a vnode too big for one message
            if vnode not in table.tables:
                raise ProtocolError(f"install of {name!r}/{vnode}: a continuation with no first part")
            table.install(vnode, keys, rows, replace=False)
            return reply(msg)
        table.install(vnode, keys, rows)
        self.dedup[name].merge(vnode, seqs)
        for worker, clock in clocks.items():
            self.gate.vector.tick(int(worker), int(clock))
        self._replace_buffered(name, vnode, pairs)
        self._refresh_targets()
        return reply(msg)

    def _buffered(self, name: str, vnode: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Per unfinished clock, the buffered (BSP-aggregated) pushes of ``vnode``."""
        out = []
        ring = self.ring
        assert ring is not None, "vnodes move between rings"
        for clock, pushes in sorted(self.aggregates.get(name, {}).items()):
            keys = np.concatenate([k for k, _ in pushes])
            mine = ring.vnodes(keys, self.tables[name].bits) == vnode
            if mine.any():
                out.append((clock, keys[mine], np.concatenate([g for _, g in pushes])[mine]))
        return out

    def _replace_buffered(self, name: str, vnode: int, pairs: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
        """Make ``vnode``'s buffered pushes those of the copy (it has all of them)."""
        by_clock = self.aggregates.get(name, {})
        bits, ring = self.tables[name].bits, self.ring
        assert ring is not None, "vnodes move between rings"
        for clock, pushes in by_clock.items():
            by_clock[clock] = [(k[keep], g[keep]) for k, g in pushes
                               for keep in [ring.vnodes(k, bits) != vnode]]
        for clock, k, g in pairs:
            self.aggregates.setdefault(name, {}).setdefault(clock, []).append((k.copy(), g.copy()))

    @staticmethod
    def _check_grads(table: VnodeSet, keys: np.ndarray, grads: np.ndarray) -> None:
        if grads.shape != (keys.shape[0], table.spec.dim):
            raise ProtocolError(f"push to {table.spec.name!r}: grads must have shape "
                                f"({keys.shape[0]}, {table.spec.dim}), got {grads.shape}")
        if not np.isfinite(grads).all():
            raise ProtocolError(f"push to {table.spec.name!r}: grads contain NaN or inf")

    def _fresh(self, table: VnodeSet, msg: Message, keys: np.ndarray, grads: np.ndarray, vnodes: np.ndarray,
               counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The part of a push not applied yet (a retry may have reached some vnodes)."""
        sender, seq = msg.header.get("sender"), msg.header.get("seq")
        if not isinstance(sender, int) or not isinstance(seq, int):
            return keys, grads, vnodes, counts  # an unnumbered push: at least once
        acked = msg.header.get("acked", -1)
        if not isinstance(acked, int) or not -1 <= acked < seq:
            raise ProtocolError(f"push {seq}: acked must be an int in [-1, {seq}), got {acked!r}")
        dedup = self.dedup[table.spec.name]
        fresh = dedup.fresh(sender, seq, acked, vnodes)
        if not fresh.all():
            logger.info("server %d: push %d of %d already applied to %d vnode(s): skipped there",
                        self.node_id, seq, sender, int((~fresh).sum()))
            rows = np.repeat(fresh, counts)
            keys, grads, vnodes, counts = keys[rows], grads[rows], vnodes[fresh], counts[fresh]
        dedup.mark(sender, seq, vnodes)
        return keys, grads, vnodes, counts

    def _apply(self, table: VnodeSet, msg: Message, keys: np.ndarray, grads: np.ndarray,
               vnodes: np.ndarray, counts: np.ndarray) -> None:
        if table.spec.aggregate:  # BSP aggregation: applied once the clock is finished
            clock = field(msg, "clock", int)
            if clock >= self.gate.vector.min():
                self.aggregates.setdefault(table.spec.name, {}).setdefault(clock, []).append(
                    (keys.copy(), grads.copy()))
                return
            # its clock was already applied (a worker that rejoined behind the others):
            # apply it now, as a late update, rather than lose it
            logger.warning("push for finished clock %d applied late on %r", clock, table.spec.name)
        self._split(vnodes, counts, lambda s, k: table.apply(vnodes[s], counts[s], keys[k], grads[k]))

    def on_clock(self, msg: Message) -> list[Any]:
        worker, clock = field(msg, "worker", int), field(msg, "clock", int)
        self.gate.vector.tick(worker, clock)
        self._clocks_moved()
        return reply(msg)

    def on_export(self, msg: Message) -> list[Any]:
        """Every key this server stores for a table, with its value (state left out)."""
        name = field(msg, "table", str)
        table = self.tables.get(name)
        if table is None:
            raise UnknownTableError(f"unknown table {name!r} (tables: {sorted(self.tables)})")
        if len(table) * (8 + 4 * table.spec.dim) > self.config.max_message_bytes - (1 << 20):
            raise ProtocolError(f"table {name!r} ({len(table)} keys on server {self.node_id}) is too large "
                                "to export in one message; use checkpoint() instead")
        parts = [vt.items() for v, vt in table.tables.items() if self.primary[v]]
        keys = np.concatenate([k for k, _ in parts]) if parts else np.zeros(0, np.uint64)
        rows = np.concatenate([r[:, : table.spec.dim] for _, r in parts]) if parts else \
            np.zeros((0, table.spec.dim), np.float32)
        return reply(msg, [keys, np.ascontiguousarray(rows)])

    def on_checkpoint(self, msg: Message) -> list[Any]:
        """Write every stored vnode (keys, values and optimiser state) under ``url``."""
        url = field(msg, "url", str)
        files: dict[str, dict[str, list]] = {}
        for name, table in self.tables.items():
            for v, vt in table.tables.items():
                if not self.primary[v]:  # one copy of each vnode: the primary's
                    continue
                keys, rows = vt.items()
                if keys.size:
                    files.setdefault(name, {})[str(v)] = checkpoint.write_vnode(url, name, v, keys, rows)
        return reply(msg, files=files, clocks={str(k): v for k, v in self.gate.vector.clocks.items()})

    def on_scheduler_checkpoint(self, msg: Message) -> None:
        """A checkpoint the scheduler coordinates during a job: answered on the control
        socket with the request's id (a failure is answered with an error reply)."""
        send(self.control, self.on_checkpoint(msg))

    def on_restore(self, msg: Message) -> list[Any]:
        """Load the keys this server owns (under the current ring) from checkpoint files."""
        name = field(msg, "table", str)
        step = field(msg, "step", str)
        entries = field(msg, "entries", list)
        table = self.tables.get(name)
        if table is None:
            raise UnknownTableError(f"unknown table {name!r}: create it before restoring it")
        assert self.ring is not None
        files = [(path, entry) for entry in entries for path in [checkpoint.entry_path(step, entry)]]
        loaded = 0
        for path, entry in files:
            keys, rows = checkpoint.read_vnode(path, entry)  # checked (size, sha256, keys) before anything is kept
            if keys.ndim != 1 or rows.shape != (keys.shape[0], table.width):
                raise checkpoint.CheckpointError(f"{path}: rows of shape {rows.shape} do not fit table "
                                                 f"{name!r}; was it saved from another table?")
            if table.bits and (keys >> np.uint64(table.bits)).any():
                raise checkpoint.CheckpointError(f"{path}: keys >= 2**{table.bits} do not fit the dense table "
                                                 f"{name!r}; was it saved from another table?")
            vnodes = self.ring.vnodes(keys, table.bits)
            for v in np.unique(vnodes).tolist():
                vt = table.tables.get(v)
                if vt is not None:
                    mine = vnodes == v
                    vt.load(keys[mine], rows[mine])
                    loaded += int(mine.sum()) if self.primary[v] else 0  # backups load too
        table.refresh()
        return reply(msg, loaded=loaded)

    def on_stats(self, msg: Message) -> list[Any]:
        tables = {name: {"keys": len(t), "bytes": t.nbytes, "vnodes": len(t.tables),
                         "primary_keys": sum(len(vt) for v, vt in t.tables.items() if self.primary[v])}
                  for name, t in self.tables.items()}
        return reply(msg, node_id=self.node_id, pid=os.getpid(), tables=tables,
                     epoch=self.ring.epoch if self.ring else 0,
                     clocks={str(k): v for k, v in self.gate.vector.clocks.items()},
                     min_clock=None if math.isinf(self.gate.vector.min()) else int(self.gate.vector.min()),
                     consistency=self.gate.telemetry(), rss_bytes=_rss_bytes())


def _rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
