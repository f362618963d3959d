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

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from paramserver._runtime.logutil import Throttled
from paramserver.config import Config
from paramserver.consistency.clock import StalenessGate
from paramserver.errors import ConnectError, ParamServerError, ProtocolError, StaleRingError, UnknownTableError
from paramserver.observe.metrics import ServerMetrics
from paramserver.observe.metrics import serve as serve_metrics
from paramserver.routing.partition import route_push
from paramserver.routing.ring import Ring
from paramserver.server.admin import Admin
from paramserver.server.copies import Copies
from paramserver.server.dedup import Dedup
from paramserver.server.install import check_grads, check_install, check_moves, replace_buffered
from paramserver.server.lease import Lease, scheduler_gone_s
from paramserver.server.peers import Acks, Peers, forward_targets
from paramserver.server.requests import check_segments, push_op, split
from paramserver.server.vnodes import VnodeSet
from paramserver.server.warmup import warm_server
from paramserver.tables.optim import OP_UPDATE
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import (
    Message,
    Op,
    decode,
    encode,
    error_code,
    error_reply,
    expect,
    failed_request,
    field,
    reply,
)
from paramserver.wire.security import http_token, load_keys, refused_op, tokens_of, user_role
from paramserver.wire.sockets import advertised
from paramserver.wire.transport import Transport, transport_for

logger = logging.getLogger(__name__)

class ServerNode:
    """Registers with the scheduler, waits for the ring, then serves until ``STOP``."""

    def __init__(self, config: Config, transport: Transport | None = None):
        if not config.scheduler:
            raise ConnectError("no scheduler address: pass --scheduler tcp://HOST:PORT "
                               "or set PARAMSERVER_SCHEDULER")
        self.config = config
        self.transport = transport_for(config.scheduler, transport, config.secret_file)  # sockets, the clock
        self.tokens = tokens_of(self.transport)  # with a secret: ids are proven (wire/security.py)
        self.node_token = ""
        self.clock = self.transport.now
        self.router, self.address = self.transport.bind(config.host, config.port, config.max_message_bytes)
        self.address = advertised(self.address, config.advertise_host, config.scheduler)  # what peers dial
        self.control = self.transport.connect(config.scheduler, config.max_message_bytes)
        self.node_id = -1
        self._register_sent = 0.0
        self.lease = Lease(config.heartbeat_timeout_s, clock=self.clock)  # serve clients only under it
        self._before_ring: list[list[Any]] = []  # INSTALL/REPLICATE that came before the first ring
        self._failures = Throttled(logger)  # a flood of requests that fail logs a few tracebacks, then counts
        self.ring: Ring | None = None
        self.tables: dict[str, VnodeSet] = {}
        self.early_tables: dict[str, TableSpec] = {}
        self.dedup: dict[str, Dedup] = {}
        self.primary = np.zeros(0, bool)  # per vnode: this server is its primary
        self.dead: set[int] = set()
        self.installs: dict[str, dict[int, int]] = {}  # table -> vnode copied here -> the sender's ring version
        self.targets: dict[str, np.ndarray] = {}  # table -> int32[n_vnodes, k]: forward to
        self.copies = Copies(self)  # vnode copies a migration asked of this server (server/copies.py)
        self.poller = self.transport.poller()
        self.poller.register(self.router)
        self.poller.register(self.control)
        self.peers = Peers(self.transport, self.poller, config.max_message_bytes, self._finish)  # the other servers
        self.gate = StalenessGate()  # the vector clock of live workers, and parked pulls
        self.aggregates: dict[str, dict[int, list[tuple[np.ndarray, np.ndarray]]]] = {}
        self._running = True
        self._beats_stop = threading.Event()
        # vnodes are independent (the unit of locking), so one request's segments are
        # applied by several threads at once; numba kernels release the GIL
        self.threads = max(1, config.server_threads or os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="paramserver-vnodes") \
            if self.threads > 1 else None
        self.admin = Admin(self)  # export, checkpoint, restore, stats, server-side functions, quotas
        self.metrics = ServerMetrics(self.admin.state)  # counted before each reply (metrics.py)
        self.metrics_url = serve_metrics(self.metrics.wire, config.http_host, config.metrics_port,
                                         http_token(load_keys(config.secret_file)) if config.secret_file else "") \
            if config.metrics_port >= 0 else ""
        self.data_handlers: dict[Op, Callable[..., list[Any] | None]] = {Op.PULL: self.on_pull, Op.PUSH: self.on_push,
                              Op.CLOCK: self.on_clock, Op.STATS: self.admin.on_stats,
                              Op.EXPORT: self.admin.on_export, Op.CHECKPOINT: self.admin.on_checkpoint,
                              Op.CALL: self.admin.on_call, Op.REPLICATE: self.on_replicate,
                              Op.INSTALL: self.on_install}
        self.control_handlers = {Op.RING: self.on_ring, Op.CREATE_TABLE: self.on_create_table,
                                 Op.DROP_TABLE: self.on_drop_table, Op.STOP: self.on_stop,
                                 Op.MIGRATE: self.on_migrate,
                                 Op.NODE_LOST: self.on_node_lost, Op.OK: lambda m: None,
                                 Op.WORKERS: self.on_workers,
                                 Op.CHECKPOINT: lambda m: self.control.send(self.admin.on_checkpoint(m)),
                                 Op.RESTORE: lambda m: self.control.send(self.admin.on_restore(m)),
                                 Op.NAMESPACE: self.admin.on_namespace,
                                 Op.ERROR: self.on_scheduler_error}

    # ---- lifecycle ---------------------------------------------------------------------
    def register(self) -> None:
        """Register and wait for the scheduler's answer (``ConnectError`` on timeout)."""
        self.send_register()
        deadline = self.clock() + self.config.connect_timeout_s
        while self.clock() < deadline:
            if self.control.poll(100):
                self.registered(self.control.recv())
                return
        raise ConnectError(f"server could not reach the scheduler at {self.config.scheduler} within "
                           f"{self.config.connect_timeout_s:g} s: is it running, and is the address "
                           "right? (--scheduler / PARAMSERVER_SCHEDULER)")

    def send_register(self) -> None:
        self._register_sent = self.clock()
        self.control.send(encode({"op": Op.REGISTER.value, "id": 0, "role": "server",
                                  "address": self.address, "pid": os.getpid(), "metrics": self.metrics_url,
                                  "process": self.transport.process()}))

    def registered(self, frames: list[Any]) -> None:
        """The scheduler's answer to ``REGISTER``: this server's id, and its first lease."""
        msg = decode(frames)
        if msg.op is Op.ERROR:
            raise ConnectError(f"scheduler refused server: {msg.header.get('error')}")
        self.node_id = int(msg.header["node_id"])
        self.node_token = str(msg.header.get("node_token", ""))
        self.lease.granted(self._register_sent)
        logger.info("server %d serving at %s", self.node_id, self.address)

    def run(self) -> None:
        warm_server()
        self.register()
        beats = threading.Thread(target=self._heartbeats, name="paramserver-heartbeat", daemon=True)
        beats.start()
        failed_at = 0.0
        try:
            while self._running:
                try:
                    self.turn()
                except Exception:  # a bug or a bad message must not take the server (and its data) down
                    if self.clock() - failed_at > 1.0:  # at most one traceback a second
                        logger.exception("server %d: a loop turn failed; it goes on", self.node_id)
                    failed_at = self.clock()
        finally:
            self._beats_stop.set()
            beats.join(5)
            self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.peers.close()
        self.router.close()
        self.control.close()

    def wants_turn(self) -> bool:
        """A vnode copy is ready to go: the next turn must not wait for a message."""
        return self.copies.ready()

    def turn(self) -> None:
        """One turn of the loop: control first, then answers from peers, then (a bounded
        number of) requests, then the next vnode copy."""
        ready = self.poller.poll(0 if self.wants_turn() else 500)
        if self.control in ready:
            while self._running and (frames := self.control.try_recv()) is not None:
                self._handle_control(frames)
        self.peers.receive(ready)
        if self.router in ready:
            for _ in range(64):  # bounded, so control messages keep flowing
                if not self._running or (frames := self.router.try_recv()) is None:
                    break
                self._handle_data(frames)
        if self.wants_turn() and self._running and self.copies.send_next():
            self._refresh_targets()

    def _heartbeats(self) -> None:
        """Beat from a thread of its own, so a long request (a JIT compile, a big table
        growth) is not mistaken for death; numba kernels release the GIL."""
        sock = self.transport.connect(self.config.scheduler, self.config.max_message_bytes)
        try:
            while not self._beats_stop.wait(self.config.heartbeat_interval_s) and self.beat(sock):
                pass
        finally:
            sock.close()

    def beat(self, sock: Any) -> bool:
        """Send a heartbeat on ``sock`` and read the answers to earlier ones; False once
        the scheduler said this server was declared dead (it stops)."""
        gone = self.lease.expired_for() + self.lease.length
        if gone > scheduler_gone_s(self.config):
            logger.error("server %d: the scheduler at %s has not answered for %.0f s: it is gone for good (a new one "
                         "cannot adopt this server), so this server stops rather than run on for ever; its tables "
                         "are lost with it unless checkpointed", self.node_id, self.config.scheduler, gone)
            self._running = False
            return False
        sock.send(encode({"op": Op.HEARTBEAT.value, "node_id": self.node_id, "seq": self.lease.beat(),
                          **({"token": self.node_token} if self.node_token else {})}))
        while sock.poll(0):
            msg = decode(sock.recv())
            if msg.op is Op.HEARTBEAT:  # the scheduler heard the beat: the lease runs on
                self.lease.answered(msg.header.get("seq"))
            elif msg.op is Op.ERROR and msg.header.get("code") == "unknown_node":
                logger.error("server %d was declared dead by the scheduler: stopping, "
                             "so that a zombie never serves stale vnodes", self.node_id)
                self._running = False
                return False
        return True

    # ---- dispatch ----------------------------------------------------------------------
    def _handle_data(self, frames: list[Any]) -> None:
        identity, request_id = frames[0], None
        try:
            msg = decode(frames[1:], self.config.max_message_bytes)
            request_id = msg.id
            handler = self.data_handlers.get(msg.op)
            if self.ring is None and msg.op in (Op.INSTALL, Op.REPLICATE) and len(self._before_ring) < 10_000:
                self._before_ring.append(frames)  # a joiner's copies can overtake its first ring: kept for it
                return
            if handler is None:
                raise ProtocolError(f"a server does not serve op {msg.op.value!r} "
                                    f"(serves {sorted(o.value for o in self.data_handlers)})")
            if self.tokens is not None and (refused := refused_op(user_role(frames[1]), msg.op.value)):
                raise ProtocolError(refused)  # what the sender's key may ask (wire/security.py)
            started = time.perf_counter()
            if msg.op in (Op.PULL, Op.PUSH):
                answer = handler(msg, identity)
                self.metrics.request("push" if msg.op is Op.PUSH else "pull", msg.header["table"],
                                     len(msg.arrays[0]), sum(map(len, frames)), time.perf_counter() - started)
            else:
                answer = handler(msg)
                self.metrics.observe(msg.op.value, time.perf_counter() - started)
            if answer is not None:  # None: parked by the staleness gate, or waiting for backups
                self.router.send(answer, identity)
        except ParamServerError as exc:
            request_id = failed_request(exc, request_id)
            logger.debug("refused request %r: %s", request_id, exc)
            self.router.send(error_reply(request_id, error_code(exc), str(exc),
                                          ring_version=self.ring.version if self.ring else 0), identity)
        except Exception as exc:  # a bug must not kill the server: answer and keep serving
            self._failures.exception("server %d failed on request %r", self.node_id, request_id)
            self.router.send(error_reply(request_id, "internal", f"{type(exc).__name__}: {exc}"),
                 identity)

    def _handle_control(self, frames: list[Any]) -> None:
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
            self.control.send(error_reply(request_id, "error", f"{type(exc).__name__}: {exc}"))

    # ---- peers (other servers) ---------------------------------------------------------
    def _finish(self, acks: Acks) -> None:
        if acks.request is not None and acks.identity is not None:
            if acks.failed:  # applied here, not on every backup: the client retries, and the
                # retry (same seq) is skipped where applied and forwarded again
                self.router.send(error_reply(acks.request.id, "stale_ring", f"{acks.failed}; retry",
                                              ring_version=self.ring.version if self.ring else 0), acks.identity)
            else:
                self.router.send(reply(acks.request), acks.identity)
        if acks.done is not None:
            acks.done(acks.failed)

    def _server_lost(self, server: int) -> None:
        """A server died: nothing waits on it any more (a push is acknowledged once every
        *live* backup applied it)."""
        self.dead.add(server)
        self.copies.lost(server)
        self._refresh_targets()
        self.peers.lost(server)

    def _refresh_targets(self) -> None:
        assert self.ring is not None
        self.targets = forward_targets(self.ring, self.tables, self.copies.moving, self.dead | {self.node_id})

    # ---- control -----------------------------------------------------------------------
    def on_ring(self, msg: Message) -> None:
        """A new ring (first one, a failover, or a finished migration): hold exactly the
        vnodes it gives this server; copies in progress are over."""
        self.ring = Ring.from_wire(msg.header["ring"])
        self.peers.me = self.node_id
        self.peers.set_addresses({int(k): v for k, v in msg.header.get("servers", {}).items()
                                  if int(k) != self.node_id})
        self.admin.set_quotas(msg.header.get("namespaces") or {})
        for name, wire in msg.header.get("tables", {}).items():
            if name not in self.tables:
                self._add_table(TableSpec.from_wire(wire))
        for spec in self.early_tables.values():  # created before this server had a ring
            if spec.name not in self.tables:
                self._add_table(spec)
        self.early_tables.clear()
        for name, table in self.tables.items():
            # a copy made under this ring (or a newer one) is kept: its plan's flip is still to
            # come, and this ring may reach this server after the copy did (another path)
            copied = self.installs.get(name, {})
            for vnode in [v for v, e in copied.items() if e < self.ring.version]:
                del copied[vnode]
            table.set_vnodes([*self.ring.held_by(self.node_id, table.spec.replicas), *copied])
        self.primary = self.ring.owners == self.node_id
        self.copies.clear()  # a copy not sent yet belongs to a plan the flip made void
        self._refresh_targets()
        logger.info("server %d: ring version %d, primary of %d vnode(s)", self.node_id, self.ring.version,
                    int(self.primary.sum()))
        early, self._before_ring = self._before_ring, []
        for frames in early:  # copies that came before this server's first ring (another socket)
            self._handle_data(frames)

    def _add_table(self, spec: TableSpec) -> None:
        assert self.ring is not None
        self.tables[spec.name] = VnodeSet(spec, self.ring.n_vnodes, self.ring.held_by(self.node_id, spec.replicas))
        old = self.dedup.get(spec.name)  # kept from a table of this name dropped before: see on_drop_table
        if old is None or old.n_vnodes != self.ring.n_vnodes:
            self.dedup[spec.name] = Dedup(self.ring.n_vnodes, horizon_s=2 * self.config.retry_timeout_s,
                                          clock=self.clock)

    def on_create_table(self, msg: Message) -> None:
        spec = TableSpec.from_wire(msg.header["spec"])
        if self.ring is None:  # a joiner still waiting for its first ring: keep it for then
            self.early_tables[spec.name] = spec
        elif spec.name not in self.tables:
            self._add_table(spec)
            self._refresh_targets()
        self.control.send(reply(msg))

    def on_drop_table(self, msg: Message) -> None:
        name = field(msg, "name", str)
        self.tables.pop(name, None)
        self.early_tables.pop(name, None)
        # the exactly-once record stays: a push applied before the drop, and delivered
        # again after a table of the same name is created (a duplicate, a late retry),
        # must not be applied to the new table (chaos seed restore/256)
        self.aggregates.pop(name, None)
        self.copies.moving.pop(name, None)
        self.installs.pop(name, None)
        self._refresh_targets()
        self.control.send(reply(msg))

    def on_migrate(self, msg: Message) -> None:
        """Copy vnodes to the servers that will hold them after the next ring flip
        (``server/copies.py``); answered with ``MIGRATED`` once every copy is in."""
        migration = field(msg, "migration", int)
        moves = check_moves(msg.header.get("moves"))

        def done(failed: str | None) -> None:
            self.control.send(encode({"op": Op.MIGRATED.value, "migration": migration, "node_id": self.node_id,
                                      "failed": failed}))

        self.copies.plan(moves, done)
        logger.info("server %d: migration %d: %d vnode copies to send", self.node_id, migration, len(moves))

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
            self.gate.drop_reader(node_id, lambda request: request[1].header.get("reader"))
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
        for identity, msg in self.gate.release(self.clock()):
            try:
                self.router.send(self._serve_pull(msg), identity)
            except ParamServerError as exc:  # e.g. the table was dropped, or the vnode moved, meanwhile
                self.router.send(error_reply(msg.id, error_code(exc), str(exc),
                                              ring_version=self.ring.version if self.ring else 0), identity)
            except Exception as exc:  # a bug: this caller still gets an answer
                logger.exception("server %d failed on a released pull", self.node_id)
                self.router.send(error_reply(msg.id, "internal", f"{type(exc).__name__}: {exc}"), identity)

    def _apply_aggregate(self, name: str, pushes: list[tuple[np.ndarray, np.ndarray]]) -> None:
        table = self.tables.get(name)
        if table is None or not pushes:
            return
        assert self.ring is not None
        routed = route_push(self.ring, np.concatenate([k for k, _ in pushes]),
                            np.concatenate([g for _, g in pushes]), table.layout)  # one summed row per key
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
        request, that this server is their primary: else the client's ring is stale).  A
        client's request is served under the lease only: also a pull the staleness gate
        parked and releases later, which passes here again."""
        if primary and not self.lease.valid():
            raise StaleRingError(f"server {self.node_id} has had no answer from the scheduler for "
                                  f"{self.lease.expired_for() + self.lease.length:.1f} s: its lease ran out, "
                                  "so it may have been declared dead; retry on the current ring")
        name = field(msg, "table", str)
        table = self.tables.get(name)
        if table is None:
            raise UnknownTableError(f"unknown table {name!r} (tables: {sorted(self.tables)})")
        assert self.ring is not None and msg.arrays[0].shape[0] == n_keys
        check_segments(table, self.ring, msg.arrays[0], vnodes, counts, self.primary if primary else None,
                       self.node_id, field(msg, "ring_version", int))
        return table

    def _split(self, vnodes: np.ndarray, counts: np.ndarray, fn: Callable[[slice, slice], None]) -> None:
        split(self._pool, self.threads, vnodes, counts, fn)

    def on_pull(self, msg: Message, identity: bytes = b"") -> list[Any] | None:
        keys, vnodes, counts = expect(msg, ("keys", "<u8", 1), ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        table = self._table(msg, keys.shape[0], vnodes, counts)
        clock = msg.header.get("clock")
        if isinstance(clock, int):  # ASP is admitted at once, and its staleness recorded too
            if not self.gate.admit(clock, table.spec.staleness, (identity, msg), self.clock(), identity):
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
        check_grads(table, keys, grads)
        self.admin.check_quota(table, vnodes, counts, keys)  # before the dedup marks it applied
        self._apply(table, msg, *self._fresh(table, msg, keys, grads, vnodes, counts))
        # forwarded whole, even the part already applied here: a retry after a failover
        # may find this server with the push and a backup without it; backups dedup too
        targets = self.targets.get(table.spec.name)
        if targets is None or self.ring is None:
            return reply(msg)
        return None if self.peers.forward(targets, self.ring.version, table.spec.name, msg, keys, grads, vnodes, counts,
                                          identity) else reply(msg)

    def on_replicate(self, msg: Message) -> list[Any]:
        """A push the primary applied, forwarded: apply it to the vnodes held here (a
        ring flip may have moved some meanwhile; those are no longer this server's)."""
        keys, grads, vnodes, counts = expect(msg, ("keys", "<u8", 1), ("grads", "<f4", 2),
                                             ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        table = self._table(msg, keys.shape[0], vnodes, counts, primary=False)  # unknown: the primary retries
        check_grads(table, keys, grads)
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
        pairs = check_install(msg, table, self.ring, name, vnode, buffered, seqs, clocks)
        keys, rows = msg.arrays[0], msg.arrays[1]
        if msg.header.get("append") is True:  # the rest of a vnode too big for one message
            if vnode not in table.tables:
                raise ProtocolError(f"install of {name!r}/{vnode}: a continuation with no first part")
            table.install(vnode, keys, rows, replace=False)
            return reply(msg)
        table.install(vnode, keys, rows)
        ring_version = msg.header.get("ring_version")
        if isinstance(ring_version, int) and vnode not in self.ring.held_by(self.node_id, table.spec.replicas):
            self.installs.setdefault(name, {})[vnode] = ring_version
        self.dedup[name].merge(vnode, seqs)
        for worker, clock in clocks.items():
            self.gate.vector.tick(int(worker), int(clock))
        replace_buffered(self.aggregates, self.ring, table.layout, name, vnode, pairs)
        self._refresh_targets()
        return reply(msg)

    def _fresh(self, table: VnodeSet, msg: Message, keys: np.ndarray, grads: np.ndarray, vnodes: np.ndarray,
               counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The part of a push not applied yet (a retry may have reached some vnodes)."""
        sender, seq = msg.header.get("sender"), msg.header.get("seq")
        if not isinstance(sender, int) or not isinstance(seq, int):
            return keys, grads, vnodes, counts  # an unnumbered push: at least once
        if self.tokens is not None:  # the sender proves it is the node whose pushes it acknowledges
            self.tokens.check(sender, msg.header.get("sender_token"), f"push {seq}")
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
        op = push_op(msg, table)
        if op != OP_UPDATE:
            self._split(vnodes, counts, lambda s, k: table.apply(vnodes[s], counts[s], keys[k], grads[k], op))
            return
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
        if self.tokens is not None:
            self.tokens.check(worker, msg.header.get("worker_token"), "a clock")
        self.gate.vector.tick(worker, clock)
        self._clocks_moved()
        return reply(msg)
