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

This module is the loop and the dispatch only: an op -> its handler.  The server's state
is one object (``ServerState``, ``server/state.py``); the handlers take it and a port to
send on: the data plane (``server/data.py``), the clocks (``server/clocks.py``), a copy
received (``server/install.py``), the control plane (``server/control.py``), and
``server/admin.py`` and ``server/copies.py``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from paramserver._runtime.logutil import Throttled
from paramserver._runtime.proctitle import set_title
from paramserver.config import Config
from paramserver.errors import Code, ConnectError, ParamServerError, ProtocolError
from paramserver.filters.base import KeyStore
from paramserver.observe.metrics import serve as serve_metrics
from paramserver.routing.ring import Ring
from paramserver.server.admin import Admin
from paramserver.server.clocks import Clocks
from paramserver.server.control import ControlPlane
from paramserver.server.copies import Copies
from paramserver.server.data import DataPlane
from paramserver.server.install import install_copy
from paramserver.server.lease import Lease, scheduler_gone_s
from paramserver.server.peers import Acks, Peers
from paramserver.server.state import ServerState
from paramserver.server.steps import on_step
from paramserver.server.warmup import warm_server
from paramserver.store.protocol import VnodeStore
from paramserver.wire import batch
from paramserver.wire.handshake import CHECK_AFTER_S, refusal, unanswered
from paramserver.wire.message import Message, Op, decode, encode, error_code, error_reply, failed_request, reply
from paramserver.wire.security import http_token, load_keys, refused_op, tokens_of, user_role
from paramserver.wire.sockets import advertised, listens
from paramserver.wire.transport import Transport, transport_for

logger = logging.getLogger(__name__)


class Sockets:
    """The port the handlers send on (``server/state.py``'s ``Port``): the server's
    ROUTER (answers), its DEALER to the scheduler, and its DEALERs to the other servers."""

    def __init__(self, router: Any, control: Any, peers: Peers) -> None:
        self.router, self.control, self._peers = router, control, peers

    @property
    def peers(self) -> Peers:
        return self._peers

    def answer(self, frames: list[Any], identity: bytes) -> None:
        self.router.send(frames, identity)

    def tell_scheduler(self, frames: list[Any]) -> None:
        self.control.send(frames)


class ServerNode:
    """Registers with the scheduler, waits for the ring, then serves until ``STOP``."""

    def __init__(self, config: Config, transport: Transport | None = None) -> None:
        if not config.scheduler:
            raise ConnectError("no scheduler address: pass --scheduler tcp://HOST:PORT "
                               "or set PARAMSERVER_SCHEDULER")
        self.config = config
        self.transport = transport_for(config.scheduler, transport, config.secret_file)  # sockets, the clock
        self.node_token = ""
        self.clock = self.transport.now
        self.router, self.address = self.transport.bind(config.host, config.port, config.max_message_bytes)
        self.address = advertised(self.address, config.advertise_host, config.scheduler)  # what peers dial
        self.control = self.transport.connect(config.scheduler, config.max_message_bytes)
        self._register_sent = 0.0
        self._before_ring: list[list[Any]] = []  # INSTALL/REPLICATE that came before the first ring
        self._failures = Throttled(logger)  # a flood of requests that fail logs a few tracebacks, then counts
        self.poller = self.transport.poller()
        self.poller.register(self.router)
        self.poller.register(self.control)
        self.peers = Peers(self.transport, self.poller, config.max_message_bytes, self._finished)  # the other servers
        self.port = Sockets(self.router, self.control, self.peers)
        # vnodes are independent (the unit of locking), so one request's segments are
        # applied by several threads at once; numba kernels release the GIL
        threads = max(1, config.server_threads or os.cpu_count() or 1)
        self.state = ServerState(config, self.clock, tokens_of(self.transport),  # with a secret: ids are proven
                                 Lease(config.heartbeat_timeout_s, clock=self.clock),  # serve clients only under it
                                 threads, ThreadPoolExecutor(threads, thread_name_prefix="paramserver-vnodes")
                                 if threads > 1 else None, key_store=KeyStore(config.key_cache_bytes))
        self._running = True
        self._beats_stop = threading.Event()
        self.copies = Copies(self.state, self.port)  # vnode copies a migration asked of this server
        self.admin = Admin(self.state, self.port)  # export, checkpoint, restore, stats, functions, quotas
        self.metrics = self.admin.metrics
        self.metrics_url = serve_metrics(self.metrics.wire, config.http_host, config.metrics_port,
                                         http_token(load_keys(config.secret_file)) if config.secret_file else "") \
            if config.metrics_port >= 0 else ""
        self.data = DataPlane(self.state, self.port)
        self.clocks = Clocks(self.state, self.port)
        self.control_plane = ControlPlane(self.state, self.port, self.copies, self.clocks)
        self.data_handlers, self.control_handlers = self._handlers()

    def _handlers(self) -> tuple[dict[Op, Callable[..., list[Any] | None]], dict[Op, Callable[[Message], None]]]:
        """The dispatch: an op -> its handler, for requests (answered with what the handler
        returns, None: later) and for the scheduler's control messages."""
        admin, data, control = self.admin, self.data, self.control_plane
        data_handlers: dict[Op, Callable[..., list[Any] | None]] = {
            Op.PULL: data.on_pull, Op.PUSH: data.on_push, Op.STEP: partial(on_step, data),
            Op.PREFETCH: data.on_prefetch, Op.CLOCK: self.clocks.on_clock,
            Op.STATS: admin.on_stats, Op.PING: reply, Op.EXPORT: admin.on_export, Op.CHECKPOINT: admin.on_checkpoint,
            Op.CALL: admin.on_call, Op.REPLICATE: data.on_replicate, Op.INSTALL: partial(install_copy, self.state)}
        control_handlers: dict[Op, Callable[[Message], None]] = {
            Op.RING: self.on_ring, Op.CREATE_TABLE: control.on_create_table, Op.DROP_TABLE: control.on_drop_table,
            Op.STOP: self.on_stop, Op.MIGRATE: control.on_migrate, Op.NODE_LOST: control.on_node_lost,
            Op.OK: lambda m: None, Op.WORKERS: self.clocks.on_workers,
            Op.CHECKPOINT: lambda m: self.control.send(admin.on_checkpoint(m)),
            Op.RESTORE: lambda m: self.control.send(admin.on_restore(m)),
            Op.NAMESPACE: admin.on_namespace, Op.ERROR: control.on_scheduler_error}
        return data_handlers, control_handlers

    # ---- the state, as the simulated cluster and the tests read it ----------------------
    @property
    def node_id(self) -> int:
        return self.state.node_id

    @node_id.setter
    def node_id(self, node_id: int) -> None:
        self.state.node_id = node_id

    @property
    def ring(self) -> Ring | None:
        return self.state.ring

    @property
    def tables(self) -> dict[str, VnodeStore]:
        return self.state.tables

    # ---- lifecycle ---------------------------------------------------------------------
    def register(self) -> None:
        """Register and wait for the scheduler's answer (``ConnectError`` on timeout)."""
        self.send_register()
        deadline = self.clock() + self.config.connect_timeout_s
        key_checked = not self.config.secret_file  # with keys: a refused key is said in a second (wire/handshake.py)
        while self.clock() < deadline:
            if self.control.poll(100):
                self.registered(self.control.recv())
                return
            if not key_checked and self.clock() - self._register_sent > CHECK_AFTER_S:
                key_checked = True
                said = refusal(self.config.scheduler, str(self.config.secret_file), "server")
                if said:
                    raise ConnectError(said)
        secret, address = self.config.secret_file, str(self.config.scheduler)
        raise ConnectError(unanswered(address, secret, "server", self.config.connect_timeout_s,
                                      bool(secret) and listens(address)))

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
        self.state.lease.granted(self._register_sent)
        logger.info("server %d serving at %s", self.node_id, self.address)
        set_title(f"server {self.node_id} {self.address}", f"ps-server-{self.node_id}")

    def run(self) -> None:
        warm_server()
        beats = threading.Thread(target=self._heartbeats, name="paramserver-heartbeat", daemon=True)
        try:  # a scheduler it cannot reach closes its sockets too (a process's end waits for open ones)
            self.register()
            beats.start()
            self._serve()
        finally:
            self._beats_stop.set()
            if beats.ident is not None:
                beats.join(5)
            self.close()

    def _serve(self) -> None:
        failed_at = 0.0
        while self._running:
            try:
                self.turn()
            except Exception:  # a bug or a bad message must not take the server (and its data) down
                if self.clock() - failed_at > 1.0:  # at most one traceback a second
                    logger.exception("server %d: a loop turn failed; it goes on", self.node_id)
                failed_at = self.clock()

    def close(self) -> None:
        if self.state.pool is not None:
            self.state.pool.shutdown(wait=True)
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
        self.peers.expire()  # a forward or a copy unanswered past its deadline fails: the client retries
        if self.router in ready:
            for _ in range(64):  # bounded, so control messages keep flowing
                if not self._running or (frames := self.router.try_recv()) is None:
                    break
                self._handle_data(frames)
        if self.wants_turn() and self._running and self.copies.send_next():
            self.state.refresh_targets()

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
        gone = self.state.lease.expired_for() + self.state.lease.length
        if gone > scheduler_gone_s(self.config):
            logger.error("server %d: the scheduler at %s has not answered for %.0f s: it is gone for good (a new one "
                         "cannot adopt this server), so this server stops rather than run on for ever; its tables "
                         "are lost with it unless checkpointed", self.node_id, self.config.scheduler, gone)
            self._running = False
            return False
        sock.send(encode({"op": Op.HEARTBEAT.value, "node_id": self.node_id, "seq": self.state.lease.beat(),
                          **({"token": self.node_token} if self.node_token else {}),
                          **({"regained": self.state.lease.regained} if self.state.lease.regained else {})}))
        while sock.poll(0):
            msg = decode(sock.recv())
            if msg.op is Op.HEARTBEAT:  # the scheduler heard the beat: the lease runs on
                self.state.lease.answered(msg.header.get("seq"))
            elif msg.op is Op.ERROR and msg.header.get("code") == Code.UNKNOWN_NODE:
                logger.error("server %d was declared dead by the scheduler: stopping, "
                             "so that a zombie never serves stale vnodes", self.node_id)
                self._running = False
                return False
        return True

    # ---- dispatch ----------------------------------------------------------------------
    def _handle_data(self, frames: list[Any]) -> None:
        identity = frames[0]
        for answer in batch.packed(self._answers(identity, frames[1:]), self.config.max_message_bytes):
            self.router.send(answer, identity)  # an envelope's answers in as few envelopes as fit

    def _answers(self, identity: bytes, frames: Sequence[Any], in_batch: bool = False) -> list[list[Any]]:
        """Handle one request (an envelope's parts in order: ``wire/batch.py``); the frames of
        the answers to send now: none when it is answered later (parked by the staleness gate,
        waiting for backups) or not at all."""
        request_id = None
        try:
            msg = decode(frames, self.config.max_message_bytes)
            if msg.op is Op.BATCH and not in_batch:
                return [a for part in batch.split(msg.header, frames) for a in self._answers(identity, part, True)]
            request_id = msg.id
            handler = self.data_handlers.get(msg.op)
            if self.ring is None and msg.op in (Op.INSTALL, Op.REPLICATE) and len(self._before_ring) < 10_000:
                self._before_ring.append([identity, *frames])  # a joiner's copies can overtake its first ring
                return []
            if handler is None:
                raise ProtocolError(f"a server does not serve op {msg.op.value!r} "
                                    f"(serves {sorted(o.value for o in self.data_handlers)})")
            if self.state.tokens is not None and (refused := refused_op(user_role(frames[0]), msg.op.value)):
                raise ProtocolError(refused)  # what the sender's key may ask (wire/security.py)
            started = time.perf_counter()
            if msg.op in (Op.PULL, Op.PUSH, Op.STEP):
                if "tick" in msg.header:  # a worker's finished clock, carried in place of a clock message
                    self.clocks.carried(msg)
                answer = handler(msg, identity)
                self.metrics.request(msg.op.value, msg.header["table"],
                                     len(msg.arrays[0]), sum(map(len, frames)), time.perf_counter() - started)
            else:
                answer = handler(msg)
                self.metrics.observe(msg.op.value, time.perf_counter() - started)
            return [] if answer is None else [answer]
        except ParamServerError as exc:
            request_id = failed_request(exc, request_id)
            logger.debug("refused request %r: %s", request_id, exc)
            return [error_reply(request_id, error_code(exc), str(exc), ring_version=self.state.ring_version())]
        except Exception as exc:  # a bug must not kill the server: answer and keep serving
            self._failures.exception("server %d failed on request %r", self.node_id, request_id)
            return [error_reply(request_id, Code.INTERNAL, f"{type(exc).__name__}: {exc}")]

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
            self.control.send(error_reply(request_id, Code.ERROR, f"{type(exc).__name__}: {exc}"))

    def _finished(self, acks: Acks) -> None:
        """Every server a request was sent to answered (``Peers``' callback)."""
        self.data.finished(acks)

    # ---- the control messages the loop itself handles -----------------------------------
    def on_ring(self, msg: Message) -> None:
        """A new ring (``control.py``), then the copies that came before this server's
        first ring (on another socket), served now."""
        self.control_plane.on_ring(msg)
        early, self._before_ring = self._before_ring, []
        for frames in early:
            self._handle_data(frames)

    def on_stop(self, msg: Message) -> None:
        logger.info("server %d stopping", self.node_id)
        self._running = False
