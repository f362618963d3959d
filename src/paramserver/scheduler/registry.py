"""Who is in the cluster (``Registry``): the registered nodes, by id and by the identity of
their socket, how they join (``REGISTER``), stay (``HEARTBEAT``) and go (``LEAVE``), and
the requests that wait for them: workers parked until the first ring forms, launchers
waiting for a number of workers (``WAIT_WORKERS``) or of servers (``WAIT_SERVERS``,
``waiters.ServerWaiters``).

The registry keeps this bookkeeping and answers these requests on the scheduler's socket;
what a node's arrival or departure means for the rest of the scheduler (the ring, the
job, the barrier, the other nodes' ``NODE_LOST``) is the scheduler's: a server that
registered goes to ``Membership``; a node that leaves, or dies, is removed by the
scheduler, which has the registry ``forget`` it.  Silence is judged by the ``Detector``, on the host's turn.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Protocol

from paramserver.config import Config
from paramserver.errors import Code, ProtocolError
from paramserver.routing.ring import Ring
from paramserver.scheduler.membership import Membership, NodeInfo
from paramserver.scheduler.waiters import ServerWaiters
from paramserver.wire.message import Message, Op, encode, error_reply, reply
from paramserver.wire.message import field as hfield
from paramserver.wire.security import MAY_REGISTER, NodeTokens
from paramserver.wire.sockets import check_metrics_url
from paramserver.wire.transport import Transport

logger = logging.getLogger("paramserver.scheduler.node")  # one log for the scheduler

ROLES = ("server", "worker", "driver")
_BEAT_BACK = encode({"op": Op.HEARTBEAT.value})


class RegistryHost(Protocol):
    """What ``Registry`` needs of the scheduler."""

    config: Config
    transport: Transport  # checks a node's address, names the scheduler's process
    tokens: NodeTokens | None  # with a secret: each node's proof of its id
    membership: Membership
    sock: Any  # the scheduler's ROUTER: answers go to a node by its identity

    @property
    def ring(self) -> Ring | None: ...

    def clock(self) -> float: ...
    def wall_time(self) -> float: ...  # when, for people (the dashboard's events)
    def cluster_view(self) -> dict[str, Any]: ...  # the ring, the servers, the tables: what a client routes with
    def barrier_size(self) -> int: ...
    def workers_changed(self) -> None: ...  # the live workers changed: the servers' vector clocks follow them


class Registry:
    """The live nodes, the workers parked until a ring forms, and who waits for them."""

    def __init__(self, host: RegistryHost) -> None:
        self.host = host
        self.nodes: dict[int, NodeInfo] = {}
        self.by_identity: dict[bytes, int] = {}
        self.parked_workers: list[tuple[bytes, Message, NodeInfo]] = []  # registered before the first ring
        self.worker_waiters: list[tuple[bytes, Any, int]] = []  # (identity, request id, count)
        self.server_waiters = ServerWaiters()  # wait_servers: for a count of servers, or for a joiner
        self.events: deque[dict[str, Any]] = deque(maxlen=50)  # joins and removals, for the dashboard
        self.next_id = 1
        self.workers_seen = 0  # workers ever registered (the barrier waits for the expected number first)

    # ---- joining -----------------------------------------------------------------------
    def register(self, identity: bytes, msg: Message, key_role: str | None) -> None:
        """``REGISTER``: a node gets its id (a worker its rank); a server's join goes to
        ``Membership``, a client is welcomed with the ring (parked until there is one).
        ``key_role``: the ZAP handler's word on the sender's key (None without keys)."""
        role, address, metrics, pid, process = self._checked(msg, key_role)
        node = NodeInfo(self.next_id, role, identity, address or "", self.host.clock(), metrics=metrics, pid=pid,
                        process=process)
        self.next_id += 1
        if role != "driver":  # a driver (a script, the dashboard's own client) is not the cluster's news
            self.events.append({"at": self.host.wall_time(), "what": f"{role} {node.id} joined"})
        if role == "worker":
            node.rank, self.workers_seen = self._free_rank(), self.workers_seen + 1
        self.nodes[node.id] = node
        self.by_identity[identity] = node.id
        logger.info("%s %d registered (%s)", role, node.id, address or identity.hex())
        if role == "server":
            self.host.sock.send(reply(msg, node_id=node.id, **self._token(node.id)), identity)
            self.host.membership.server_joined(node.id)
        elif self.host.ring is None:
            self.parked_workers.append((identity, msg, node))
        else:
            self._welcome(identity, msg, node)

    def _checked(self, msg: Message, key_role: str | None) -> tuple[str, Any, str, int, str]:
        """A ``REGISTER``'s role, address, metrics URL, pid and process, each checked (ProtocolError)."""
        role = hfield(msg, "role", str)
        if role not in ROLES:
            raise ProtocolError(f"role must be one of {ROLES}, got {role!r}")
        if key_role is not None and role not in MAY_REGISTER.get(key_role, ()):
            raise ProtocolError(f"a {key_role} key cannot register as a {role}: only the cluster's keys "
                                "(paramserver keygen) may run a scheduler or servers")
        address = msg.header.get("address")
        if role == "server" and not address:
            raise ProtocolError("a server must register with its address (tcp://HOST:PORT)")
        if address is not None and address != "":  # any role's: a bad one would reach every peer, the logs,
            self.host.transport.check(address)  # the dashboard (and a server's, every server's connect)
        metrics = check_metrics_url(msg.header.get("metrics"))  # listed by cluster status, linked by the dashboard
        pid = msg.header.get("pid", 0)
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < 1 << 32:
            raise ProtocolError(f"pid must be the node's process id (a whole number), got {str(pid)[:100]!r}")
        process = msg.header.get("process") or ""
        if not isinstance(process, str) or len(process) > 256:
            raise ProtocolError(f"register: process must be a string of at most 256 characters, got {process!r:.100}")
        return role, address, metrics, pid, process

    def _free_rank(self) -> int:
        """The smallest rank no live worker holds: ranks stay dense in [0, live workers), and a
        dead worker's rank goes to the worker that joins next (its replacement)."""
        taken = {n.rank for n in self.nodes.values() if n.role == "worker"}
        return next(r for r in range(len(taken) + 1) if r not in taken)

    def _welcome(self, identity: bytes, msg: Message, node: NodeInfo) -> None:
        node.last_seen = self.host.clock()  # its heartbeats start with this answer
        if node.role == "worker":
            self.host.workers_changed()
            self.serve_worker_waiters()
        self.host.sock.send(reply(msg, node_id=node.id, rank=node.rank, num_workers=self.host.barrier_size(),
                                  scheduler_process=self.host.transport.process(), **self._token(node.id),
                                  **self.host.cluster_view()), identity)

    def _token(self, node_id: int) -> dict[str, Any]:
        tokens = self.host.tokens
        return {} if tokens is None else {"node_token": tokens.token(node_id)}

    def ring_formed(self) -> None:
        """The first ring: the parked workers are welcomed with it, the waiters served."""
        for identity, msg, node in self.parked_workers:
            self._welcome(identity, msg, node)
        self.parked_workers.clear()
        self.serve_server_waiters()

    def parked(self) -> set[int]:
        """The workers parked until a ring forms (they wait on the scheduler, not it on them)."""
        return {p[2].id for p in self.parked_workers}

    # ---- staying and going -------------------------------------------------------------
    def heard_from(self, identity: bytes) -> None:
        """Any message from a registered node counts as a heartbeat."""
        node_id = self.by_identity.get(identity)
        if node_id is not None:
            self.nodes[node_id].last_seen = self.host.clock()

    def heartbeat(self, identity: bytes, msg: Message) -> None:
        # servers beat from a socket of their own, so they name themselves
        node_id = msg.header.get("node_id", self.by_identity.get(identity))
        tokens = self.host.tokens
        if tokens is not None and "node_id" in msg.header:  # a server names itself: it proves it
            tokens.check(node_id, msg.header.get("token"), "a heartbeat")
        node = self.nodes.get(node_id) if isinstance(node_id, int) else None
        if node is not None:
            node.last_seen = self.host.clock()
            seq = msg.header.get("seq")  # a server's beat: echoed, it renews the server's lease
            self.host.sock.send(_BEAT_BACK if seq is None else encode({"op": Op.HEARTBEAT.value, "seq": seq}),
                                identity)  # and nodes tell a dead scheduler by silence
            regained = msg.header.get("regained")
            if isinstance(regained, int) and regained > node.regained and node.role == "server":
                # its lease ran out and came back: what we sent it meanwhile may be lost
                node.regained = regained
                self.host.membership.server_returned(node.id)
        else:  # declared dead, then came back: tell it, so it stops serving
            self.host.sock.send(error_reply(None, Code.UNKNOWN_NODE, "not registered (declared dead?)"), identity)

    def leave(self, identity: bytes, msg: Message) -> int | None:
        """``LEAVE``, answered: the node that leaves (None if unknown), for the host to remove."""
        node_id = self.by_identity.get(identity)
        self.host.sock.send(reply(msg), identity)
        return node_id

    def forget(self, node_id: int) -> NodeInfo:
        """Take a removed node off the books (the host's ``remove`` says why, and to whom)."""
        node = self.nodes.pop(node_id)
        self.by_identity.pop(node.identity, None)
        self.parked_workers = [p for p in self.parked_workers if p[2].id != node_id]
        return node

    def removed(self, node: NodeInfo, why: str) -> None:
        """Log a removal, and keep it for the dashboard (a driver's is not the cluster's news)."""
        logger.info("%s %d removed (%s)", node.role, node.id, why)
        if node.role != "driver":
            self.events.append({"at": self.host.wall_time(), "what": f"{node.role} {node.id} {why}",
                                "failure": why == "dead"})

    # ---- who waits for whom ------------------------------------------------------------
    def wait_workers(self, identity: bytes, msg: Message) -> None:
        """Answer once ``count`` workers are registered (launchers wait for their workers)."""
        self.worker_waiters.append((identity, msg.id, hfield(msg, "count", int)))
        self.serve_worker_waiters()

    def serve_worker_waiters(self) -> None:
        parked = self.parked()
        live = sum(n.role == "worker" for n in self.nodes.values() if n.id not in parked)
        waiting, self.worker_waiters = self.worker_waiters, []
        for identity, request_id, count in waiting:
            if live >= count:
                self.host.sock.send(encode({"op": Op.OK.value, "id": request_id, "workers": live}), identity)
            else:
                self.worker_waiters.append((identity, request_id, count))

    def wait_servers(self, identity: bytes, msg: Message) -> None:
        """Answer once ``count`` servers are on the ring and no vnode is moving, or once
        ``joiner`` (``{"pid": P}`` and/or ``{"address": A}``) is on the settled ring."""
        self.server_waiters.add(identity, msg)
        self.serve_server_waiters()

    def serve_server_waiters(self, lost: NodeInfo | None = None) -> None:
        self.server_waiters.serve(self.host.membership, self.nodes, self.host.sock.send, lost)
