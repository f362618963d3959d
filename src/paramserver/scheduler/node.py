"""The scheduler: membership, heartbeats, the ring, tables, barriers, shutdown, and the
data-shard queue of a training job with its coordinated checkpoints.

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
from collections import deque
from collections.abc import Callable
from typing import Any

from paramserver._runtime.logutil import Throttled
from paramserver.config import Config
from paramserver.errors import ConfigError, ParamServerError, ProtocolError
from paramserver.routing.ring import Ring
from paramserver.scheduler.barrier import Barrier
from paramserver.scheduler.detector import Detector
from paramserver.scheduler.fanout import FanOut, FanOuts
from paramserver.scheduler.jobs import Jobs
from paramserver.scheduler.membership import Membership, Migration, NodeInfo
from paramserver.scheduler.restores import Restores
from paramserver.scheduler.waiters import ServerWaiters
from paramserver.tables.namespaces import Quota, check_name, namespace_of
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message, Op, decode, encode, error_reply, failed_request, reply
from paramserver.wire.message import field as hfield
from paramserver.wire.security import MAY_REGISTER, refused_op, tokens_of, user_role
from paramserver.wire.sockets import check_metrics_url
from paramserver.wire.transport import Transport, ZmqTransport

logger = logging.getLogger(__name__)

ROLES = ("server", "worker", "driver")
_BEAT_BACK = encode({"op": Op.HEARTBEAT.value})


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
        self.nodes: dict[int, NodeInfo] = {}
        self.by_identity: dict[bytes, int] = {}
        self.tables: dict[str, TableSpec] = {}
        self.parked_workers: list[tuple[bytes, Message, NodeInfo]] = []
        self.barrier = Barrier()  # workers waiting at the barrier
        self.fanouts = FanOuts(lambda server, header: self._notify(self.nodes[server], header))
        self.jobs = Jobs(self)  # the training job's shard queue and checkpoints
        self.restores = Restores(self)  # tables loaded from checkpoints, one at a time
        self.membership = Membership(self, config.vnodes_per_server, config.servers)  # the ring and its changes
        self.detector = Detector(self)  # who is dead: silent nodes, less fenced servers with last copies
        self._announced: list[int] | None = None
        self.worker_waiters: list[tuple[bytes, Any, int]] = []  # (identity, request id, count)
        self.server_waiters = ServerWaiters()  # wait_servers: for a count of servers, or for a joiner
        self.deferred: list[tuple[bytes, Message]] = []  # table commands waiting for a migration
        self.quotas: dict[str, Quota] = {}  # namespace -> its quota (servers enforce them)
        self._bad_requests, self._failures = Throttled(logger), Throttled(logger)  # a flood logs a few lines
        self._next_id = 1
        self._workers_seen = 0  # workers ever registered (the barrier waits for the expected number first)
        self._running = True
        self._last_turn = self.clock()
        self._key_role: str | None = None
        self.events: deque[dict[str, Any]] = deque(maxlen=50)  # joins and removals, for the dashboard
        self.http_url = self.metrics_url = ""  # the dashboard and the cluster's /metrics (observe.py), if served
        self.handlers = {
            Op.REGISTER: self.on_register,
            Op.HEARTBEAT: self.on_heartbeat,
            Op.LEAVE: self.on_leave,
            Op.CREATE_TABLE: self.on_create_table,
            Op.DROP_TABLE: self.on_drop_table,
            Op.TABLE_INFO: self.on_table_info,
            Op.BARRIER: self.on_barrier,
            Op.SHUTDOWN: self.on_shutdown,
            Op.WAIT_WORKERS: self.on_wait_workers,
            Op.JOB_START: self.jobs.start,
            Op.NEXT_SHARD: lambda identity, msg: self.jobs.next_shard(identity, msg, self.by_identity.get(identity)),
            Op.SHARD_DONE: lambda identity, msg: self.jobs.shard_done(identity, msg, self.by_identity.get(identity)),
            Op.JOB_STATUS: self.jobs.status,
            Op.PROGRESS: lambda identity, msg: self.jobs.progress(msg, self.by_identity.get(identity)),
            Op.RESTORE: self.restores.request,
            Op.CREATE_NAMESPACE: self.on_create_namespace,
            Op.DROP_NAMESPACE: self.on_drop_namespace,
            Op.MIGRATED: self.on_migrated,
            Op.REMOVE_SERVER: self.on_remove_server,
            Op.CLUSTER_INFO: self.on_cluster_info,
            Op.WAIT_SERVERS: self.on_wait_servers,
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
        except Exception:  # a bug must not take the cluster down
            logger.exception("scheduler failed while checking deadlines")

    def _handle(self, frames: list[Any]) -> None:
        identity, body = frames[0], frames[1:]
        request_id = None
        self._key_role = user_role(body[0]) if body else None  # the ZAP handler's word on the sender's key
        try:
            msg = decode(body, self.config.max_message_bytes)
            request_id = msg.id
            node_id = self.by_identity.get(identity)
            if node_id is not None:
                self.nodes[node_id].last_seen = self.clock()
            self._handle_message(identity, msg)
        except ParamServerError as exc:
            request_id = failed_request(exc, request_id)
            code = "protocol" if isinstance(exc, ProtocolError) else "config"
            self._bad_requests.warning("bad request from %r: %s", identity, exc)
            self.sock.send(error_reply(request_id, code, str(exc)), identity)
        except Exception as exc:  # a bug must not take the cluster down
            self._failures.exception("scheduler failed on a request from %r", identity)
            self.sock.send(error_reply(request_id, "internal", f"{type(exc).__name__}: {exc}"), identity)

    def _handle_message(self, identity: bytes, msg: Message) -> None:
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

    # ---- membership --------------------------------------------------------------------
    def on_register(self, identity: bytes, msg: Message) -> None:
        role = hfield(msg, "role", str)
        if role not in ROLES:
            raise ProtocolError(f"role must be one of {ROLES}, got {role!r}")
        if self._key_role is not None and role not in MAY_REGISTER.get(self._key_role, ()):
            raise ProtocolError(f"a {self._key_role} key cannot register as a {role}: only the cluster's keys "
                                "(paramserver keygen) may run a scheduler or servers")
        address = msg.header.get("address")
        if role == "server" and not address:
            raise ProtocolError("a server must register with its address (tcp://HOST:PORT)")
        if address is not None and address != "":  # any role's: a bad one would reach every peer, the logs,
            self.transport.check(address)  # the dashboard (and a server's, every server's connect)
        metrics = check_metrics_url(msg.header.get("metrics"))  # listed by cluster status, linked by the dashboard
        pid = msg.header.get("pid", 0)
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < 1 << 32:
            raise ProtocolError(f"pid must be the node's process id (a whole number), got {str(pid)[:100]!r}")
        process = msg.header.get("process") or ""
        if not isinstance(process, str) or len(process) > 256:
            raise ProtocolError(f"register: process must be a string of at most 256 characters, got {process!r:.100}")
        node = NodeInfo(self._next_id, role, identity, address or "", self.clock(), metrics=metrics, pid=pid,
                        process=process)
        self._next_id += 1
        if role != "driver":  # a driver (a script, the dashboard's own client) is not the cluster's news
            self.events.append({"at": time.time(), "what": f"{role} {node.id} joined"})
        if role == "worker":
            node.rank, self._workers_seen = self._free_rank(), self._workers_seen + 1
        self.nodes[node.id] = node
        self.by_identity[identity] = node.id
        logger.info("%s %d registered (%s)", role, node.id, address or identity.hex())
        if role == "server":
            self.sock.send(reply(msg, node_id=node.id, **self._token(node.id)), identity)
            self.membership.server_joined(node.id)
        elif self.ring is None:
            self.parked_workers.append((identity, msg, node))
        else:
            self._welcome(identity, msg, node)

    def _free_rank(self) -> int:
        """The smallest rank no live worker holds: ranks stay dense in [0, live workers), and a
        dead worker's rank goes to the worker that joins next (its replacement)."""
        taken = {n.rank for n in self.nodes.values() if n.role == "worker"}
        return next(r for r in range(len(taken) + 1) if r not in taken)

    def _cluster_view(self) -> dict[str, Any]:
        assert self.ring is not None
        return {
            "ring": self.ring.to_wire(),
            "servers": {str(n.id): n.address for n in self.nodes.values() if n.role == "server"},
            "tables": {name: spec.to_wire() for name, spec in self.tables.items()},
            "namespaces": {name: q.to_wire() for name, q in self.quotas.items()},
        }

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
        view = {"op": Op.RING.value, **self._cluster_view()}
        for node in self.nodes.values():
            if everyone or node.role == "server":
                self._notify(node, view)

    def ring_formed(self) -> None:
        for identity, msg, node in self.parked_workers:
            self._welcome(identity, msg, node)
        self.parked_workers.clear()
        self._serve_server_waiters()

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
        deferred, self.deferred = self.deferred, []
        for identity, msg in deferred:
            if self.migration is not None:  # the next change started: wait again
                self.deferred.append((identity, msg))
                continue
            try:
                self._handle_message(identity, msg)
            except ParamServerError as exc:
                self.sock.send(error_reply(msg.id, "config", str(exc)), identity)
            except Exception as exc:
                logger.exception("deferred %s failed", msg.op.value)
                self.sock.send(error_reply(msg.id, "internal", f"{type(exc).__name__}: {exc}"), identity)
        self.membership.next_change()
        self._serve_server_waiters()

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
                                "events": list(self.events), "ring_moves": self.ring_moves, "http": self.http_url,
                                "metrics": {str(n.id): n.metrics for n in self.nodes.values() if n.metrics}
                                | ({"scheduler": self.metrics_url} if self.metrics_url else {})}
        if self.ring is not None:
            info.update(self._cluster_view(), ring_servers=self.ring.servers, ring_version=self.ring.version)
        self.sock.send(reply(msg, **info), identity)

    def on_wait_servers(self, identity: bytes, msg: Message) -> None:
        """Answer once ``count`` servers are on the ring and no vnode is moving, or once
        ``joiner`` (``{"pid": P}`` and/or ``{"address": A}``) is on the settled ring."""
        self.server_waiters.add(identity, msg)
        self._serve_server_waiters()

    def _serve_server_waiters(self, lost: NodeInfo | None = None) -> None:
        self.server_waiters.serve(self.membership, self.nodes, self.sock.send, lost)

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

    def _welcome(self, identity: bytes, msg: Message, node: NodeInfo) -> None:
        node.last_seen = self.clock()  # its heartbeats start with this answer
        if node.role == "worker":
            self.workers_changed()
            self._serve_worker_waiters()
        self.sock.send(reply(msg, node_id=node.id, rank=node.rank, num_workers=self._barrier_size(),
                             scheduler_process=self.transport.process(), **self._token(node.id),
                             **self._cluster_view()), identity)

    def _token(self, node_id: int) -> dict[str, Any]:
        return {} if self.tokens is None else {"node_token": self.tokens.token(node_id)}

    def on_wait_workers(self, identity: bytes, msg: Message) -> None:
        """Answer once ``count`` workers are registered (launchers wait for their workers)."""
        self.worker_waiters.append((identity, msg.id, hfield(msg, "count", int)))
        self._serve_worker_waiters()

    def _serve_worker_waiters(self) -> None:
        live = sum(n.role == "worker" for n in self.nodes.values() if n.id not in
                   {p[2].id for p in self.parked_workers})
        waiting, self.worker_waiters = self.worker_waiters, []
        for identity, request_id, count in waiting:
            if live >= count:
                self.sock.send(encode({"op": Op.OK.value, "id": request_id, "workers": live}), identity)
            else:
                self.worker_waiters.append((identity, request_id, count))

    def on_heartbeat(self, identity: bytes, msg: Message) -> None:
        # servers beat from a socket of their own, so they name themselves
        node_id = msg.header.get("node_id", self.by_identity.get(identity))
        if self.tokens is not None and "node_id" in msg.header:  # a server names itself: it proves it
            self.tokens.check(node_id, msg.header.get("token"), "a heartbeat")
        node = self.nodes.get(node_id) if isinstance(node_id, int) else None
        if node is not None:
            node.last_seen = self.clock()
            seq = msg.header.get("seq")  # a server's beat: echoed, it renews the server's lease
            self.sock.send(_BEAT_BACK if seq is None else encode({"op": Op.HEARTBEAT.value, "seq": seq}),
                 identity)  # and nodes tell a dead scheduler by silence
        else:  # declared dead, then came back: tell it, so it stops serving
            self.sock.send(error_reply(None, "unknown_node", "not registered (declared dead?)"), identity)

    def on_leave(self, identity: bytes, msg: Message) -> None:
        node_id = self.by_identity.get(identity)
        self.sock.send(reply(msg), identity)
        if node_id is not None:
            self._remove(node_id, "left")

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
        parked = {p[2].id for p in self.parked_workers}  # they wait on us, not we on them
        for node_id in self.detector.dead(now, parked):  # silent ones, less fenced servers (scheduler/detector.py)
            if node_id in self.nodes:
                self._remove(node_id, "dead")

    def alive(self, process: str) -> bool | None:
        return self.transport.alive(process)

    def _remove(self, node_id: int, why: str) -> None:
        node = self.nodes.pop(node_id)
        self.by_identity.pop(node.identity, None)
        self.detector.forget(node_id)
        self.parked_workers = [p for p in self.parked_workers if p[2].id != node_id]
        self.barrier.drop(node_id)
        self.jobs.node_removed(node_id, node.role)
        logger.info("%s %d removed (%s)", node.role, node_id, why)
        if node.role != "driver":
            self.events.append({"at": time.time(), "what": f"{node.role} {node_id} {why}", "failure": why == "dead"})
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
        self.fanouts.node_lost(node_id)
        self.jobs.maybe_checkpoint()  # a dead worker's shards went back: the boundary may be here
        if node.role == "server":
            self.membership.server_lost(node_id)
            self._serve_server_waiters(lost=node)
        self._maybe_release_barrier()

    # ---- tables ------------------------------------------------------------------------
    def _forward_to_servers(self, identity: bytes, msg: Message, header: dict[str, Any],
                            on_error: Callable[[], None] | None = None) -> None:
        def answer(op: FanOut) -> None:
            if op.errors:
                if on_error is not None:
                    on_error()
                self.sock.send(error_reply(msg.id, "server", str(next(iter(op.errors.values())))), identity)
            else:
                self.sock.send(encode({"op": Op.OK.value, "id": msg.id}), identity)

        self.fan_out(header, answer)

    def on_create_table(self, identity: bytes, msg: Message) -> None:
        if self.migration is not None:  # vnodes are moving: the plan does not know this table
            self.deferred.append((identity, msg))
            return
        spec = TableSpec.from_wire(msg.header.get("spec"))
        old = self.tables.get(spec.name)
        if old is not None:
            if old != spec:
                raise ConfigError(f"table {spec.name!r} exists with a different spec "
                                  f"({old.to_wire()}); drop it first or use another name")
            self.sock.send(reply(msg, spec=spec.to_wire()), identity)
            return
        if self.ring is None:
            raise ConfigError("the ring is not formed yet: wait for all servers to register")
        if spec.replicas > len(self.ring.servers):
            raise ConfigError(f"table {spec.name!r}: replicas={spec.replicas} needs at least {spec.replicas} "
                              f"servers, the ring has {len(self.ring.servers)}; add servers or lower replicas")
        self.tables[spec.name] = spec
        logger.info("table %r created: %s", spec.name, spec.to_wire())

        def failed() -> None:  # a server could not create it (memory for a dense table): un-list it everywhere
            if self.tables.get(spec.name) == spec:
                del self.tables[spec.name]
                logger.warning("table %r could not be created on every server: dropped again", spec.name)
                self.fan_out({"op": Op.DROP_TABLE.value, "name": spec.name}, lambda op: None)

        self._forward_to_servers(identity, msg, {"op": Op.CREATE_TABLE.value, "spec": spec.to_wire()}, failed)

    def on_drop_table(self, identity: bytes, msg: Message) -> None:
        if self.migration is not None:
            self.deferred.append((identity, msg))
            return
        name = hfield(msg, "name", str)
        if self.tables.pop(name, None) is None:
            raise ConfigError(f"no table {name!r} to drop (tables: {sorted(self.tables)})")
        logger.info("table %r dropped", name)
        self._forward_to_servers(identity, msg, {"op": Op.DROP_TABLE.value, "name": name})

    def on_create_namespace(self, identity: bytes, msg: Message) -> None:
        """Set (or change, or with no limits lift) a namespace's quota on every server."""
        name, quota = check_name(msg.header.get("name")), Quota.from_wire(msg.header.get("quota"))
        if quota.unlimited:
            self.quotas.pop(name, None)
        else:
            self.quotas[name] = quota
        logger.info("namespace %r: quota %s", name, quota.to_wire())
        self._forward_to_servers(identity, msg, {"op": Op.NAMESPACE.value, "name": name, "quota": quota.to_wire()})

    def on_drop_namespace(self, identity: bytes, msg: Message) -> None:
        """Drop every table of a namespace, and its quota; other namespaces are untouched."""
        if self.migration is not None:
            self.deferred.append((identity, msg))
            return
        name = check_name(msg.header.get("name"))
        dropped = sorted(t for t in self.tables if namespace_of(t) == name)
        for table in dropped:
            del self.tables[table]
        self.quotas.pop(name, None)
        logger.info("namespace %r dropped: tables %s", name, dropped)
        left = {"n": len(dropped) + 1}

        def one(op: FanOut) -> None:
            left["n"] -= 1
            if left["n"] == 0:
                self.sock.send(reply(msg, tables=dropped), identity)

        for table in dropped:
            self.fan_out({"op": Op.DROP_TABLE.value, "name": table}, one)
        self.fan_out({"op": Op.NAMESPACE.value, "name": name, "quota": None}, one)

    def on_table_info(self, identity: bytes, msg: Message) -> None:
        self.sock.send(reply(msg, tables={n: s.to_wire() for n, s in self.tables.items()}), identity)

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
    def _barrier_size(self) -> int:
        live = sum(n.role == "worker" for n in self.nodes.values())
        return max(live, self.config.workers) if self._workers_seen < self.config.workers else live

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
        line = self.barrier.missing(now, ranks, self._barrier_size())
        if line:
            logger.warning("%s", line)

    def _maybe_release_barrier(self) -> None:
        """Answer a complete barrier; each answer names the ranks that took part (the live
        workers), so that a program in rounds learns who is gone at the same point."""
        size = self._barrier_size()
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
