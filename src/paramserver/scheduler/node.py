"""The scheduler: membership, heartbeats, the ring, tables, barriers, shutdown, and the
data-shard queue of a training job with its coordinated checkpoints.

``SchedulerNode`` is the loop and the dispatch (op -> handler), and the hub its parts talk
through: who is registered and who waits for them (``registry.py``), the tables and
namespaces (``catalog.py``), the ring and its changes (``membership.py``), the dead
(``detector.py``), the job (``jobs.py``), restores (``restores.py``), the barrier
(``barrier.py``), commands to every server (``fanout.py``).  Each part says what it needs
of the node in a ``...Host`` protocol; what one event means for several parts (a node
removed) is decided here.

Every other node connects a DEALER to the scheduler's ROUTER, so the scheduler can both
answer requests and push notifications (``RING``, ``NODE_LOST``, ``STOP``, table and
checkpoint commands to servers) to any node by its identity.  One thread, one poll loop:
a command to every server is a fan-out whose answers are collected as they arrive.

Ring changes, one at a time:

* a server dies: at once a ring where its backups are primaries (clients retry there),
  with chains refilled; then the primaries copy vnodes to their new backups (repair);
* a server joins, or is removed: the primaries copy what changes holder (and forward
  every later push to it), and once every copy is acknowledged the ring flips.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from paramserver._runtime.logutil import Throttled
from paramserver.config import Config
from paramserver.errors import Code, ConfigError, ParamServerError, ProtocolError
from paramserver.routing.ring import Ring
from paramserver.scheduler.barrier import Barrier
from paramserver.scheduler.catalog import Catalog
from paramserver.scheduler.detector import Detector
from paramserver.scheduler.fanout import FanOut, FanOuts
from paramserver.scheduler.jobs import Jobs
from paramserver.scheduler.membership import Membership, Migration, NodeInfo
from paramserver.scheduler.registry import Registry
from paramserver.scheduler.restores import Restores
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message, Op, decode, encode, error_reply, failed_request, reply
from paramserver.wire.message import field as hfield
from paramserver.wire.security import refused_op, tokens_of, user_role
from paramserver.wire.transport import Transport, ZmqTransport

logger = logging.getLogger(__name__)


class SchedulerNode:
    """Runs the scheduler loop until ``SHUTDOWN``.

    Args:
        config: ``servers`` (how many to wait for before forming the ring), ``workers``
            (barrier size; 0 = whoever registered), heartbeat and bind settings.
        on_ready: called with the bound address once the socket is listening.
        transport: sockets and clock (``wire/transport.py``); ZeroMQ and real time if None.
    """

    def __init__(self, config: Config, on_ready: Callable[[str], None] | None = None,
                 transport: Transport | None = None):
        self.config = config
        self.transport = transport or ZmqTransport(secret_file=config.secret_file)
        self.tokens = tokens_of(self.transport)  # with a secret: each node's proof of its id
        self.clock = self.transport.now
        self.sock: Any
        self.sock, self.address = self.transport.bind(config.host, config.port, config.max_message_bytes)
        self.registry = Registry(self)  # who is in the cluster, and who waits for whom
        self.catalog = Catalog(self)  # the tables and the namespaces' quotas
        # the registry's and the catalog's own dicts, which Membership, Jobs, Restores and the detector read
        self.nodes: dict[int, NodeInfo] = self.registry.nodes
        self.by_identity: dict[bytes, int] = self.registry.by_identity
        self.tables: dict[str, TableSpec] = self.catalog.tables
        self.barrier = Barrier()  # workers waiting at the barrier
        self.fanouts = FanOuts(lambda server, header: self._notify(self.nodes[server], header))
        self.jobs = Jobs(self)  # the training job's shard queue and checkpoints
        self.restores = Restores(self)  # tables loaded from checkpoints, one at a time
        self.membership = Membership(self, config.vnodes_per_server, config.servers)  # the ring and its changes
        self.detector = Detector(self)  # who is dead: silent nodes, less fenced servers with last copies
        self._announced: list[int] | None = None
        self._bad_requests, self._failures = Throttled(logger), Throttled(logger)  # a flood logs a few lines
        self._running = True
        self._last_turn = self.clock()
        self._key_role: str | None = None
        self.http_url = self.metrics_url = ""  # the dashboard and the cluster's /metrics (observe.py), if served
        self.handlers = {
            Op.REGISTER: lambda identity, msg: self.registry.register(identity, msg, self._key_role),
            Op.HEARTBEAT: self.registry.heartbeat,
            Op.LEAVE: self.on_leave,
            Op.CREATE_TABLE: self.catalog.create_table,
            Op.DROP_TABLE: self.catalog.drop_table,
            Op.TABLE_INFO: self.catalog.table_info,
            Op.BARRIER: self.on_barrier,
            Op.SHUTDOWN: self.on_shutdown,
            Op.WAIT_WORKERS: self.registry.wait_workers,
            Op.JOB_START: self.jobs.start,
            Op.JOB_ADD: self.jobs.add,
            Op.NEXT_SHARD: lambda identity, msg: self.jobs.next_shard(identity, msg, self.by_identity.get(identity)),
            Op.SHARD_DONE: lambda identity, msg: self.jobs.shard_done(identity, msg, self.by_identity.get(identity)),
            Op.JOB_STATUS: self.jobs.status,
            Op.PROGRESS: lambda identity, msg: self.jobs.progress(msg, self.by_identity.get(identity)),
            Op.RESTORE: self.restores.request,
            Op.CREATE_NAMESPACE: self.catalog.create_namespace,
            Op.DROP_NAMESPACE: self.catalog.drop_namespace,
            Op.MIGRATED: self.on_migrated,
            Op.REMOVE_SERVER: self.on_remove_server,
            Op.CLUSTER_INFO: self.on_cluster_info,
            Op.WAIT_SERVERS: self.registry.wait_servers,
            Op.OK: self.on_ack,
            Op.ERROR: self.on_ack,
        }
        logger.info("scheduler listening at %s, waiting for %d server(s)", self.address, config.servers)
        if on_ready:
            on_ready(self.address)

    # ---- loop --------------------------------------------------------------------------
    @property
    def poll_s(self) -> float:
        """How often the loop looks at its deadlines when no message comes."""
        return min(self.config.heartbeat_interval_s, 1.0)

    def run(self) -> None:
        poll_ms = int(self.poll_s * 1000)
        try:
            while self._running:
                self.turn(self.sock.poll(poll_ms))
        finally:
            # linger: the reply to SHUTDOWN (and the STOPs) were queued just now; with
            # linger 0 zmq could drop them, and the driver would wait a heartbeat timeout
            self.sock.close(linger=500)

    def turn(self, ready: bool = True) -> None:
        """One turn of the loop: every waiting message, then the deadlines."""
        started = self._last_turn = self._after_stall(self._last_turn, self.poll_s)
        if ready:
            while self._running and (frames := self.sock.try_recv()) is not None:
                self._handle(frames)
        try:
            now = self.clock()
            # silence is judged as of the turn's start: had this process been stopped while
            # it handled the messages above (a SIGSTOP, a swap-out), the heartbeats sent
            # meanwhile would still be unread, and every node would look dead
            self._check_heartbeats(started)
            self.fanouts.expire(now)
            self._say_who_is_missing(now)
            self.jobs.tick()  # a checkpoint due by time though no shard was done since (a quiet stream)
        except Exception:  # a bug must not take the cluster down
            logger.exception("scheduler failed while checking deadlines")

    def _handle(self, frames: list[Any]) -> None:
        identity, body = frames[0], frames[1:]
        request_id = None
        self._key_role = user_role(body[0]) if body else None  # the ZAP handler's word on the sender's key
        try:
            msg = decode(body, self.config.max_message_bytes)
            request_id = msg.id
            self.registry.heard_from(identity)
            self.dispatch(identity, msg)
        except ParamServerError as exc:
            request_id = failed_request(exc, request_id)
            code = Code.PROTOCOL if isinstance(exc, ProtocolError) else Code.CONFIG
            self._bad_requests.warning("bad request from %r: %s", identity, exc)
            self.sock.send(error_reply(request_id, code, str(exc)), identity)
        except Exception as exc:  # a bug must not take the cluster down
            self._failures.exception("scheduler failed on a request from %r", identity)
            self.sock.send(error_reply(request_id, Code.INTERNAL, f"{type(exc).__name__}: {exc}"), identity)

    def dispatch(self, identity: bytes, msg: Message) -> None:
        """Hand ``msg`` to its op's handler, if the sender's key may ask for it."""
        handler = self.handlers.get(msg.op)
        if handler is None:
            raise ProtocolError(f"the scheduler does not serve op {msg.op.value!r}")
        refused = refused_op(self._key_role, msg.op.value)  # what the sender's key may ask (wire/security.py)
        if refused:
            raise ProtocolError(refused)
        handler(identity, msg)

    def answer(self, identity: bytes, frames: list[Any]) -> None:
        """Send ``frames`` to the node behind ``identity`` (``JobHost``)."""
        self.sock.send(frames, identity)

    def _notify(self, node: NodeInfo, header: dict[str, Any]) -> None:
        self.sock.send(encode(header), node.identity)

    # ---- what the registry needs (``RegistryHost``) -----------------------------------
    def cluster_view(self) -> dict[str, Any]:
        """The ring, the servers' addresses, the tables and quotas: what a client routes with."""
        assert self.ring is not None
        return {
            "ring": self.ring.to_wire(),
            "servers": {str(n.id): n.address for n in self.nodes.values() if n.role == "server"},
            **self.catalog.view(),
        }

    def wall_time(self) -> float:
        """When, for people: the dashboard's events, the losses and failovers of ``job_status``."""
        return time.time()

    # ---- what the ring's changes need (``MembershipHost``) ------------------------------
    @property
    def ring(self) -> Ring | None:
        return self.membership.ring

    @ring.setter
    def ring(self, ring: Ring | None) -> None:
        self.membership.ring = ring

    @property
    def migration(self) -> Migration | None:
        return self.membership.migration

    @property
    def losses(self) -> list[dict[str, Any]]:
        return self.membership.losses

    @property
    def failovers(self) -> list[dict[str, Any]]:
        return self.membership.failovers

    @property
    def ring_moves(self) -> int:
        return self.membership.moves

    def notify(self, node_id: int, header: dict[str, Any]) -> None:
        self._notify(self.nodes[node_id], header)

    def ring_changed(self, everyone: bool) -> None:
        """The ring, the servers' addresses and the tables: to every node (clients route
        with it), or to the servers alone (a first ring: clients are welcomed with it)."""
        view = {"op": Op.RING.value, **self.cluster_view()}
        for node in self.nodes.values():
            if everyone or node.role == "server":
                self._notify(node, view)

    def ring_formed(self) -> None:
        self.registry.ring_formed()

    def resync(self, node_id: int) -> None:
        """What one server may have missed while it was cut off: the ring (with the tables
        and servers, which ``on_ring`` reconciles with: a table dropped, a server lost
        meanwhile) and the live workers (``WORKERS``, as announced last)."""
        if node_id in self.nodes and self.ring is not None:
            self._notify(self.nodes[node_id], {"op": Op.RING.value, **self.cluster_view()})
            if self._announced is not None:
                self._notify(self.nodes[node_id], {"op": Op.WORKERS.value, "workers": self._announced})

    def joining(self, node_id: int) -> None:
        self.ring_changed(everyone=True)  # every server learns the joiner's address, it the tables
        self.notify(node_id, {"op": Op.WORKERS.value, "workers": self._announced or []})

    def retire(self, node_id: int) -> None:
        self.notify(node_id, {"op": Op.STOP.value})
        self._remove(node_id, "removed")

    def holding(self) -> bool:
        return self.restores.busy

    def between_changes(self) -> None:
        self.restores.settled()  # a restore that waited for vnodes to stop moving starts

    def migration_over(self) -> None:
        """Table commands that waited, then a restore or the next membership change."""
        self.catalog.migration_over()
        self.membership.next_change()
        self.registry.serve_server_waiters()

    def on_migrated(self, identity: bytes, msg: Message) -> None:
        self.membership.migrated(self.by_identity.get(identity), msg.header.get("migration"), msg.header.get("failed"))

    def on_remove_server(self, identity: bytes, msg: Message) -> None:
        """Take a server out of the ring (``Membership.remove``); answered when done."""
        self.membership.remove(hfield(msg, "node_id", int), (identity, msg.id))

    def on_cluster_info(self, identity: bytes, msg: Message) -> None:
        m = self.membership
        info: dict[str, Any] = {"migrating": m.migration is not None, "queued_changes": len(m.changes),
                                "incomplete_copies": len(m.incomplete), "fenced": sorted(self.detector.fenced),
                                "workers": {str(n.id): n.rank for n in self.nodes.values() if n.role == "worker"},
                                "events": list(self.registry.events), "ring_moves": self.ring_moves,
                                "http": self.http_url,
                                "metrics": {str(n.id): n.metrics for n in self.nodes.values() if n.metrics}
                                | ({"scheduler": self.metrics_url} if self.metrics_url else {})}
        if self.ring is not None:
            info.update(self.cluster_view(), ring_servers=self.ring.servers, ring_version=self.ring.version)
        self.sock.send(reply(msg, **info), identity)

    def workers_changed(self) -> None:
        """Tell servers which workers their vector clocks follow: the live ones, less
        those waiting for a data shard and holding none (an idle worker must not hold
        the others back; a worker asks for its next shard while it finishes one)."""
        idle = self.jobs.idle_workers()
        workers = sorted(n.id for n in self.nodes.values() if n.role == "worker" and n.id not in idle)
        if workers == self._announced:
            return
        self._announced = workers
        for node in self.nodes.values():
            if node.role == "server":
                self._notify(node, {"op": Op.WORKERS.value, "workers": workers})

    def _after_stall(self, last_turn: float, poll_s: float) -> float:
        """A failure detector must not blame others for its own stall (a SIGSTOP, a swapped-out
        VM, a long pause): if this loop's turn came much later than it should have, the
        heartbeats sent meanwhile are still unread, so every deadline is pushed back by the
        time this process was not running.  Returns the time of this turn."""
        now = self.clock()
        late = now - last_turn - poll_s
        if late > self.config.heartbeat_timeout_s / 2:
            logger.warning("the scheduler's loop was stalled for %.1f s (paused, swapped out?): every heartbeat "
                           "deadline moves back by as much, so no node is declared dead for it", late)
            for node in self.nodes.values():
                node.last_seen += late
        return now

    def _check_heartbeats(self, now: float) -> None:
        parked = self.registry.parked()  # they wait on us, not we on them
        for node_id in self.detector.dead(now, parked):  # silent ones, less fenced servers (scheduler/detector.py)
            if node_id in self.nodes:
                self._remove(node_id, "dead")
        for node_id in self.detector.take_returned():  # fenced, then beat again: what it missed is redone
            if node_id in self.nodes:
                self.membership.server_returned(node_id)

    def alive(self, process: str) -> bool | None:
        return self.transport.alive(process)

    def on_leave(self, identity: bytes, msg: Message) -> None:
        node_id = self.registry.leave(identity, msg)
        if node_id is not None:
            self._remove(node_id, "left")

    def _remove(self, node_id: int, why: str) -> None:
        """Node ``node_id`` left, died or was removed (``why``): off the books, and out of
        everything that waits on it or counts it."""
        node = self.registry.forget(node_id)
        self.detector.forget(node_id)
        self.barrier.drop(node_id)
        self.jobs.node_removed(node_id, node.role)
        self.registry.removed(node, why)
        if node.role == "worker":
            self.workers_changed()
        if why == "dead" or node.role != "worker":  # nothing may wait on a server that is gone; a client
            # that left is forgotten by the servers' exactly-once records; what a server's death loses
            # (no complete copy left) is told to every client, whose next call raises (client/losses.py)
            lost = self.membership.last_copies(node_id) if node.role == "server" and why != "removed" else {}
            lost_node = {"op": Op.NODE_LOST.value, "node_id": node_id, "role": node.role, "address": node.address,
                         **({"lost": lost} if lost else {})}
            for other in self.nodes.values():  # clients wait on servers only: a client's loss told to every
                if node.role == "server" or other.role == "server":  # client was n^2 notifications
                    self._notify(other, lost_node)
        if node.role == "server":  # the ring first: what the fan-outs below start next must not name it
            self.membership.server_lost(node_id)
            self.registry.serve_server_waiters(lost=node)
        self.fanouts.node_lost(node_id)  # a restore that loses a server loads again, on the new ring
        self.jobs.maybe_checkpoint()  # a dead worker's shards went back: the boundary may be here
        self._maybe_release_barrier()

    # ---- commands to every server ------------------------------------------------------
    def on_ack(self, identity: bytes, msg: Message) -> None:
        self.fanouts.answered(self.by_identity.get(identity), msg)

    def fan_out(self, header: dict[str, Any], on_done: Callable[[FanOut], None],
                timeout_s: float = math.inf, servers: list[int] | None = None) -> int:
        """Send ``header`` to every live server (or to ``servers``); ``on_done`` gets the
        answers (see ``FanOut``)."""
        if servers is None:
            servers = [n.id for n in self.nodes.values() if n.role == "server"]
        return self.fanouts.start(header, servers, on_done, self.clock(), timeout_s)

    # ---- what a restore needs (``Restores``) ---------------------------------------------
    @property
    def moving(self) -> bool:
        return self.migration is not None

    def restored(self) -> None:
        """A restore finished: the next one, or the joins and removals it held, may start."""
        self.membership.next_change()

    # ---- barrier and shutdown ----------------------------------------------------------
    def barrier_size(self) -> int:
        live = sum(n.role == "worker" for n in self.nodes.values())
        return max(live, self.config.workers) if self.registry.workers_seen < self.config.workers else live

    def on_barrier(self, identity: bytes, msg: Message) -> None:
        node_id = self.by_identity.get(identity)
        if node_id is None or self.nodes[node_id].role != "worker":
            raise ConfigError("only registered workers take part in barriers")
        generation = msg.header.get("generation")
        if generation is not None and (isinstance(generation, bool) or not isinstance(generation, int)):
            raise ConfigError(f"a barrier's generation must be a whole number (a round), got {generation!r}")
        self.barrier.arrive(identity, msg.id, node_id, self.clock(), generation)
        self._maybe_release_barrier()

    def _say_who_is_missing(self, now: float) -> None:
        """A barrier short of workers says so every few seconds: who waits, who does not."""
        ranks = {n.id: n.rank for n in self.nodes.values() if n.role == "worker"}
        line = self.barrier.missing(now, ranks, self.barrier_size())
        if line:
            logger.warning("%s", line)

    def _maybe_release_barrier(self) -> None:
        """Answer a complete barrier; each answer names the ranks that took part (the live
        workers), so that a program in rounds learns who is gone at the same point."""
        size = self.barrier_size()
        for generation in self.barrier.complete(size):
            here = self.barrier.here(generation)
            ranks = sorted(self.nodes[n].rank for n in here if n in self.nodes)
            for identity, request_id in self.barrier.release(size, generation):
                self.sock.send(encode({"op": Op.OK.value, "id": request_id, "workers": ranks}), identity)

    def on_shutdown(self, identity: bytes, msg: Message) -> None:
        logger.info("shutdown requested: stopping %d node(s)", len(self.nodes))
        for node in self.nodes.values():
            if node.identity != identity:
                self._notify(node, {"op": Op.STOP.value})
        self.sock.send(reply(msg), identity)
        self._running = False
