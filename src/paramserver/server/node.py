"""A server: owns vnodes of the ring and, per table, one ``VnodeTable`` per owned vnode.

Data requests (``PULL``, ``PUSH``, ``CLOCK``, ``STATS``) arrive on the server's ROUTER
from workers' DEALERs; control (``RING``, table commands, ``STOP``) arrives on its DEALER
to the scheduler.  One thread, one poll loop: a request is validated whole before any
table is touched, so a malformed one changes nothing and gets an error reply.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import zmq

from paramserver.config import Config
from paramserver.errors import (ConnectError, ParamServerError, ProtocolError, StaleEpochError,
                                UnknownTableError)
from paramserver import checkpoint
from paramserver.consistency.clock import StalenessGate
from paramserver.routing.partition import route_push
from paramserver.routing.ring import Ring
from paramserver.server.table import VnodeSet
from paramserver.spec import TableSpec
from paramserver.wire.message import Message, Op, decode, encode, error_reply, expect, field, reply
from paramserver.wire.sockets import bind_router, connect_dealer, send

logger = logging.getLogger(__name__)

#: requests with fewer keys run on the loop thread (a thread hand-off costs ~50 µs)
PARALLEL_MIN_KEYS = 32_768


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
        self.ctx = zmq.Context.instance()
        self.router, self.address = bind_router(self.ctx, config.host, config.port,
                                                config.max_message_bytes)
        self.control = connect_dealer(self.ctx, config.scheduler, config.max_message_bytes)
        self.node_id = -1
        self.ring: Ring | None = None
        self.tables: dict[str, VnodeSet] = {}
        self.gate = StalenessGate()  # the vector clock of live workers, and parked pulls
        self.aggregates: dict[str, dict[int, list[tuple[np.ndarray, np.ndarray]]]] = {}
        self._running = True
        self._beats_stop = threading.Event()
        # vnodes are independent (the unit of locking), so one request's segments are
        # applied by several threads at once; numba kernels release the GIL
        self.threads = max(1, config.server_threads or os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="paramserver-vnodes") \
            if self.threads > 1 else None
        self.data_handlers = {Op.PULL: self.on_pull, Op.PUSH: self.on_push,
                              Op.CLOCK: self.on_clock, Op.STATS: self.on_stats,
                              Op.EXPORT: self.on_export, Op.CHECKPOINT: self.on_checkpoint,
                              Op.RESTORE: self.on_restore}
        self.control_handlers = {Op.RING: self.on_ring, Op.CREATE_TABLE: self.on_create_table,
                                 Op.DROP_TABLE: self.on_drop_table, Op.STOP: self.on_stop,
                                 Op.NODE_LOST: self.on_node_lost, Op.OK: lambda m: None,
                                 Op.WORKERS: self.on_workers,
                                 Op.CHECKPOINT: self.on_scheduler_checkpoint,
                                 Op.ERROR: self.on_scheduler_error}

    # ---- lifecycle ---------------------------------------------------------------------
    def register(self) -> None:
        """Register and wait for the scheduler's answer (``ConnectError`` on timeout)."""
        send(self.control, encode({"op": Op.REGISTER.value, "id": 0, "role": "server",
                                   "address": self.address, "pid": os.getpid()}))
        deadline = time.monotonic() + self.config.connect_timeout_s
        while time.monotonic() < deadline:
            if self.control.poll(100):
                msg = decode(self.control.recv_multipart(copy=False))
                if msg.op is Op.ERROR:
                    raise ConnectError(f"scheduler refused server: {msg.header.get('error')}")
                self.node_id = int(msg.header["node_id"])
                logger.info("server %d serving at %s", self.node_id, self.address)
                return
        raise ConnectError(f"server could not reach the scheduler at {self.config.scheduler} within "
                           f"{self.config.connect_timeout_s:g} s: is it running, and is the address "
                           "right? (--scheduler / PARAMSERVER_SCHEDULER)")

    def run(self) -> None:
        _warm_up()
        self.register()
        beats = threading.Thread(target=self._heartbeats, name="paramserver-heartbeat", daemon=True)
        beats.start()
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.control, zmq.POLLIN)
        try:
            while self._running:
                ready = dict(poller.poll(500))
                if self.control in ready:
                    while self._running and self.control.poll(0):
                        self._handle_control(self.control.recv_multipart(copy=False))
                if self.router in ready:
                    for _ in range(64):  # bounded, so control messages keep flowing
                        if not self._running or not self.router.poll(0):
                            break
                        self._handle_data(self.router.recv_multipart(copy=False))
        finally:
            self._beats_stop.set()
            beats.join(5)
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self.router.close(linger=0)
            self.control.close(linger=0)

    def _heartbeats(self) -> None:
        """Beat from a thread of its own, so a long request (a JIT compile, a big table
        growth) is not mistaken for death; numba kernels release the GIL."""
        sock = connect_dealer(self.ctx, self.config.scheduler, self.config.max_message_bytes)
        beat = encode({"op": Op.HEARTBEAT.value, "node_id": self.node_id})
        try:
            while not self._beats_stop.wait(self.config.heartbeat_interval_s):
                send(sock, beat)
                while sock.poll(0):
                    msg = decode(sock.recv_multipart())
                    if msg.op is Op.ERROR and msg.header.get("code") == "unknown_node":
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
            if handler is None:
                raise ProtocolError(f"a server does not serve op {msg.op.value!r} "
                                    f"(serves {sorted(o.value for o in self.data_handlers)})")
            answer = handler(msg, identity) if msg.op is Op.PULL else handler(msg)
            if answer is not None:  # None: a pull parked by the staleness gate
                send(self.router, answer, identity)
        except ParamServerError as exc:
            request_id = getattr(exc, "request_id", request_id)
            logger.debug("refused request %r: %s", request_id, exc)
            send(self.router, error_reply(request_id, _error_code(exc), str(exc)), identity)
        except Exception as exc:  # a bug must not kill the server: answer and keep serving
            logger.exception("server %d failed on request %r", self.node_id, request_id)
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

    # ---- control -----------------------------------------------------------------------
    def on_ring(self, msg: Message) -> None:
        self.ring = Ring.from_wire(msg.header["ring"])
        mine = self.ring.vnodes_of(self.node_id)
        logger.info("server %d: ring epoch %d, %d vnode(s)", self.node_id, self.ring.epoch, mine.size)
        for name, wire in msg.header.get("tables", {}).items():
            if name not in self.tables:
                self.tables[name] = VnodeSet(TableSpec.from_wire(wire), self.ring.n_vnodes, mine)

    def on_create_table(self, msg: Message) -> None:
        spec = TableSpec.from_wire(msg.header["spec"])
        if spec.name not in self.tables:
            assert self.ring is not None
            self.tables[spec.name] = VnodeSet(spec, self.ring.n_vnodes, self.ring.vnodes_of(self.node_id))
        send(self.control, reply(msg))

    def on_drop_table(self, msg: Message) -> None:
        name = field(msg, "name", str)
        self.tables.pop(name, None)
        self.aggregates.pop(name, None)
        send(self.control, reply(msg))

    def on_stop(self, msg: Message) -> None:
        logger.info("server %d stopping", self.node_id)
        self._running = False

    def on_node_lost(self, msg: Message) -> None:
        if msg.header.get("role") == "worker":
            self.gate.vector.leave(int(msg.header["node_id"]))
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
            except ParamServerError as exc:  # e.g. the table was dropped meanwhile
                send(self.router, error_reply(msg.id, _error_code(exc), str(exc)), identity)
            except Exception as exc:  # a bug: this caller still gets an answer
                logger.exception("server %d failed on a released pull", self.node_id)
                send(self.router, error_reply(msg.id, "internal", f"{type(exc).__name__}: {exc}"), identity)

    def _apply_aggregate(self, name: str, pushes: list[tuple[np.ndarray, np.ndarray]]) -> None:
        table = self.tables.get(name)
        if table is None or not pushes:
            return
        assert self.ring is not None
        routed = route_push(self.ring, np.concatenate([k for k, _ in pushes]),
                            np.concatenate([g for _, g in pushes]))  # one summed row per key
        for part in routed.parts:
            table.apply(part.vnodes, part.counts, routed.keys[part.start:part.stop],
                        routed.grads[part.start:part.stop])

    def on_scheduler_error(self, msg: Message) -> None:
        logger.error("server %d: scheduler says: %s", self.node_id, msg.header.get("error"))

    # ---- data --------------------------------------------------------------------------
    def _table(self, msg: Message, n_keys: int, vnodes: np.ndarray, counts: np.ndarray) -> VnodeSet:
        """The request's table, after checking its epoch and vnode segments."""
        name = field(msg, "table", str)
        table = self.tables.get(name)
        if table is None:
            raise UnknownTableError(f"unknown table {name!r} (tables: {sorted(self.tables)})")
        epoch = field(msg, "epoch", int)
        assert self.ring is not None
        if epoch != self.ring.epoch:
            raise StaleEpochError(f"request routed at epoch {epoch}, ring is at {self.ring.epoch}")
        if (vnodes.shape != counts.shape or (counts < 0).any() or (counts > n_keys).any()
                or sum(counts.tolist()) != n_keys):  # Python ints: an int64 sum could wrap around
            raise ProtocolError(f"vnode counts do not cover the {n_keys} keys exactly")
        if len(set(vnodes.tolist())) != vnodes.size:  # a vnode twice could be applied by two threads
            raise ProtocolError("a request lists a vnode more than once")
        if not table.owns(vnodes):
            raise StaleEpochError(f"server {self.node_id} does not own all of vnodes "
                                  f"{sorted(set(vnodes.tolist()))[:8]}... at epoch {epoch}")
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
        return self._serve_pull(msg)

    def _serve_pull(self, msg: Message) -> list[Any]:
        keys, vnodes, counts = msg.arrays
        table = self._table(msg, keys.shape[0], vnodes, counts)
        out = np.empty((keys.shape[0], table.spec.dim), np.float32)
        self._split(vnodes, counts, lambda s, k: table.lookup(vnodes[s], counts[s], keys[k], out[k]))
        return reply(msg, [out])

    def on_push(self, msg: Message) -> list[Any]:
        keys, grads, vnodes, counts = expect(msg, ("keys", "<u8", 1), ("grads", "<f4", 2),
                                             ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        table = self._table(msg, keys.shape[0], vnodes, counts)
        if grads.shape != (keys.shape[0], table.spec.dim):
            raise ProtocolError(f"push to {table.spec.name!r}: grads must have shape "
                                f"({keys.shape[0]}, {table.spec.dim}), got {grads.shape}")
        if not np.isfinite(grads).all():
            raise ProtocolError(f"push to {table.spec.name!r}: grads contain NaN or inf")
        if table.spec.aggregate:  # BSP aggregation: applied once the clock is finished
            clock = field(msg, "clock", int)
            if clock >= self.gate.vector.min():
                self.aggregates.setdefault(table.spec.name, {}).setdefault(clock, []).append(
                    (keys.copy(), grads.copy()))
                return reply(msg)
            # its clock was already applied (a worker that rejoined behind the others):
            # apply it now, as a late update, rather than lose it
            logger.warning("push for finished clock %d applied late on %r", clock, table.spec.name)
        self._split(vnodes, counts, lambda s, k: table.apply(vnodes[s], counts[s], keys[k], grads[k]))
        return reply(msg)

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
        parts = [vt.items() for vt in table.tables.values()]
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
                keys, rows = vt.items()
                if keys.size:
                    files.setdefault(name, {})[str(v)] = [checkpoint.write_vnode(url, name, v, keys, rows),
                                                          int(keys.size)]
        return reply(msg, files=files, clocks={str(k): v for k, v in self.gate.vector.clocks.items()})

    def on_scheduler_checkpoint(self, msg: Message) -> None:
        """A checkpoint the scheduler coordinates during a job: answered on the control
        socket with the request's id (a failure is answered with an error reply)."""
        send(self.control, self.on_checkpoint(msg))

    def on_restore(self, msg: Message) -> list[Any]:
        """Load the keys this server owns (under the current ring) from checkpoint files."""
        name = field(msg, "table", str)
        paths = field(msg, "paths", list)
        table = self.tables.get(name)
        if table is None:
            raise UnknownTableError(f"unknown table {name!r}: create it before restoring it")
        assert self.ring is not None
        loaded = 0
        for path in paths:
            keys, rows = checkpoint.read_vnode(str(path))
            if keys.ndim != 1 or rows.shape != (keys.shape[0], table.width):
                raise checkpoint.CheckpointError(f"{path}: rows of shape {rows.shape} do not fit table "
                                                 f"{name!r}; was it saved from another table?")
            vnodes = self.ring.vnodes(keys)
            for v in np.unique(vnodes).tolist():
                vt = table.tables.get(v)
                if vt is not None:
                    mine = vnodes == v
                    vt.load(keys[mine], rows[mine])
                    loaded += int(mine.sum())
        table.refresh()
        return reply(msg, loaded=loaded)

    def on_stats(self, msg: Message) -> list[Any]:
        tables = {name: {"keys": len(t), "bytes": t.nbytes, "vnodes": len(t.tables)}
                  for name, t in self.tables.items()}
        return reply(msg, node_id=self.node_id, tables=tables,
                     clocks={str(k): v for k, v in self.gate.vector.clocks.items()},
                     min_clock=None if math.isinf(self.gate.vector.min()) else int(self.gate.vector.min()),
                     consistency=self.gate.telemetry(), rss_bytes=_rss_bytes())


def _warm_up() -> None:
    """Compile the table kernels for the array types requests bring (read-only frames)
    before registering, so the first real request is not slowed by the JIT."""
    from paramserver.server.optim import SGD, Zeros

    n = 64  # enough keys to make the vnode grow: growth has kernels of its own
    frames = encode({"op": Op.PUSH.value}, [np.arange(1, n + 1, dtype=np.uint64), np.ones((n, 1), np.float32),
                                            np.zeros(1, np.int32), np.array([n], np.int64)])
    keys, grads, vnodes, counts = decode([bytes(f) for f in frames]).arrays  # read-only, as requests
    table = VnodeSet(TableSpec("warm-up", optimizer=SGD(), initializer=Zeros()), 1, [0])
    table.apply(vnodes, counts, keys, grads)
    table.lookup(vnodes, counts, keys, np.empty((n, 1), np.float32))


def _rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
