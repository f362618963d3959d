"""The whole cluster in one process: the real ``SchedulerNode`` and ``ServerNode``s, and
workers that speak the wire protocol, on the simulated network (``testing/sim.py``).

Nodes run exactly the code they run in production: a message that arrives makes its
host run one turn of the node's loop (``SchedulerNode.turn``, ``ServerNode.turn``), a
timer runs its heartbeats and deadline checks, and every clock they read is the host's
virtual one.  Minutes of cluster time take milliseconds, and a seed gives the same run.

``SimWorker`` is a client as ``Client`` is, reduced to what a workload needs and written
as callbacks (nothing here may block): it registers and beats, routes with its view of
the ring, numbers its pushes and retries a piece with the same ``seq`` (after a stale
ring, a lost server, or no answer within ``resend_s``) until ``retry_timeout_s``.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from paramserver.config import Config
from paramserver.routing.partition import route_push
from paramserver.routing.ring import Ring
from paramserver.scheduler.node import SchedulerNode
from paramserver.server.node import ServerNode
from paramserver.tables.spec import TableSpec
from paramserver.testing.sim import Faults, Host, SimNetwork, SimSocket
from paramserver.wire.message import Message, Op, decode, encode

logger = logging.getLogger(__name__)

Done = Callable[[Any, "str | None"], None]  # (result, error)


def sim_config(**overrides: Any) -> Config:
    """Settings that make a simulated cluster quick to form and to fail over."""
    base = {"host": "sim", "port": 0, "servers": 3, "vnodes_per_server": 8, "heartbeat_interval_s": 0.5,
            "heartbeat_timeout_s": 3.0, "server_threads": 1, "retry_timeout_s": 30.0, "connect_timeout_s": 30.0}
    return replace(Config(), **{**base, **overrides})


class SimServer:
    """A ``ServerNode`` on a host: registers, then turns on every message, beats on a timer."""

    def __init__(self, cluster: SimCluster, name: str, rate: float = 1.0) -> None:
        self.cluster, self.name = cluster, name
        self.host = cluster.net.host(name, rate)
        self.node = ServerNode(replace(cluster.config, scheduler=cluster.scheduler.address),
                               self.host.transport())
        self.beat_sock: SimSocket | None = None
        self.host.on_turn = self.turn
        self.node.send_register()

    @property
    def id(self) -> int:
        return self.node.node_id

    @property
    def live(self) -> bool:
        return self.host.state != "crashed" and self.node._running

    def turn(self) -> None:
        node = self.node
        if node.node_id < 0:
            if not node.control.poll(0):
                return
            node.registered(node.control.recv())
            self.beat_sock = self.host.transport().connect(self.cluster.scheduler.address,
                                                           self.cluster.config.max_message_bytes)
            self.cluster.net.every(self.host, self.cluster.config.heartbeat_interval_s, self.beat)
        try:
            node.turn()
        except Exception:  # as run() does: a turn that fails is logged, the server goes on
            logger.exception("server %d: a loop turn failed", node.node_id)
        if not node._running:
            self.stopped()
        elif node.wants_turn() or any(s.inbox for s in self.host.sockets if s is not self.beat_sock):
            self.host.wake()  # more than one turn's worth came

    def beat(self) -> bool:
        if not self.node._running or self.beat_sock is None:
            return False
        if not self.node.beat(self.beat_sock):
            self.stopped()
            return False
        return True

    def stopped(self) -> None:
        """The node left its loop (told to stop, or that it was declared dead): its process exits."""
        if self.host.state != "crashed":
            self.cluster.net.log(f"exit {self.name} (server {self.id})")
            self.host.crash()
            self.node._running = False


class SimCluster:
    """A scheduler, servers and workers on one simulated network.

    Args:
        seed: every random choice of the network and of the workloads.
        servers: servers the scheduler waits for before forming the ring.
        faults: what the network does to messages (``sim.Faults``).
        trace: keep the event trace (``net.trace``).
    """

    def __init__(self, seed: int, servers: int = 3, faults: Faults | None = None, trace: bool = False,
                 **config: Any) -> None:
        self.net = SimNetwork(seed, faults, trace)
        self.config = sim_config(servers=servers, **config)
        self.sched_host = self.net.host("scheduler")
        self.scheduler = SchedulerNode(self.config, transport=self.sched_host.transport())
        self.sched_host.on_turn = lambda: self._scheduler_turn(True)
        self.net.every(self.sched_host, self.scheduler.poll_s, lambda: self._scheduler_turn(False))
        self.servers: list[SimServer] = []
        self.workers: list[SimWorker] = []
        self._names = itertools.count(1)
        for _ in range(servers):
            self.add_server()

    def _scheduler_turn(self, ready: bool) -> bool:
        if not self.scheduler._running:
            return False
        self.scheduler.turn(ready)
        return True

    def add_server(self, rate: float = 1.0) -> SimServer:
        server = SimServer(self, f"server-{next(self._names)}", rate)
        self.servers.append(server)
        return server

    def add_worker(self, rate: float = 1.0) -> SimWorker:
        worker = SimWorker(self, f"worker-{len(self.workers) + 1}", rate)
        self.workers.append(worker)
        return worker

    def server(self, node_id: int) -> SimServer | None:
        return next((s for s in self.servers if s.id == node_id), None)

    def live_servers(self) -> list[SimServer]:
        return [s for s in self.servers if s.live]

    def run(self, seconds: float, stop: Callable[[], bool] | None = None) -> None:
        self.net.run_until(self.net.time + seconds, stop)

    def settle(self, until: Callable[[], bool], limit_s: float) -> bool:
        """Run until ``until()`` holds (checked after every event), at most ``limit_s``."""
        if until():
            return True
        self.run(limit_s, until)
        return until()

    def ring_settled(self) -> bool:
        return self.scheduler.membership.settled

    def value(self, server: SimServer, table: str, key: int) -> float | None:
        """The value ``server`` stores for ``key`` (None: it does not hold the vnode)."""
        node = server.node
        t = node.tables.get(table)
        if t is None or node.ring is None:
            return None
        v = int(node.ring.vnodes(np.array([key], np.uint64), t.layout)[0])
        if not t.holds(np.array([v], np.int32))[0]:
            return None
        out = np.empty((1, t.spec.dim), np.float32)
        t.lookup(np.array([v], np.int32), np.array([1], np.int64), np.array([key], np.uint64), out)
        return float(out[0, 0])


class _Call:
    __slots__ = ("done", "piece", "sent_at", "server")

    def __init__(self, server: int, piece: Any, done: Callable[[Message | None, str | None], None],
                 sent_at: float) -> None:
        self.server, self.piece, self.done, self.sent_at = server, piece, done, sent_at


class SimWorker:
    """A worker: register, beat, and pull, push and clock through callbacks."""

    def __init__(self, cluster: SimCluster, name: str, rate: float = 1.0) -> None:
        self.cluster, self.name = cluster, name
        self.host: Host = cluster.net.host(name, rate)
        self.transport = self.host.transport()
        cfg = cluster.config
        self.resend_s = 2 * cfg.heartbeat_timeout_s
        self.sched = self.transport.connect(cluster.scheduler.address, cfg.max_message_bytes)
        self.socks: dict[int, SimSocket] = {}
        self.node_id = -1
        self.ring: Ring | None = None
        self.addresses: dict[int, str] = {}
        self.specs: dict[str, TableSpec] = {}
        self.seq = 0
        self.inflight: set[int] = set()
        self.clock = 0
        self.calls: dict[int, _Call] = {}  # request id -> what waits on its answer
        self.sched_calls: dict[int, Callable[[Message], None]] = {}
        self._ids = itertools.count(1)
        self.registered: Callable[[], None] | None = None
        self.on_exit: Callable[[], None] | None = None  # it learnt that it was declared dead, and exited
        self.host.on_turn = self.turn
        self._ask_scheduler({"op": Op.REGISTER.value, "role": "worker"}, self._welcomed)
        cluster.net.every(self.host, cfg.heartbeat_interval_s, self._beat)
        cluster.net.every(self.host, cfg.heartbeat_interval_s, self._resend_overdue)

    @property
    def live(self) -> bool:
        return self.host.state != "crashed"

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
        if "ring" not in header:
            return
        ring = Ring.from_wire(header["ring"])
        if self.ring is None or ring.version >= self.ring.version:
            self.ring = ring
            self.addresses = {int(k): v for k, v in header.get("servers", {}).items()}
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
            for request_id, call in [(i, c) for i, c in self.calls.items() if c.server == lost]:
                del self.calls[request_id]
                call.done(None, "node_lost")
            self.refresh()
        elif msg.op is Op.STOP:
            self.host.crash()
        elif msg.op is Op.ERROR and msg.header.get("code") == "unknown_node":
            self.cluster.net.log(f"exit {self.name} (declared dead)")  # as a real worker does
            self.host.crash()
            if self.on_exit is not None:
                self.on_exit()

    def _resend_overdue(self) -> bool:
        """A request unanswered for ``resend_s`` (a lost message, a server that cannot
        answer) fails as a lost node does: its piece is routed again and resent."""
        if not self.live:
            return False
        now = self.host.now()
        for request_id, call in [(i, c) for i, c in self.calls.items() if now - c.sent_at > self.resend_s]:
            del self.calls[request_id]
            call.done(None, "no_answer")
        return True

    def ask_servers(self, header: dict[str, Any], done: Done) -> None:
        """Send ``header`` to every server of this worker's ring; ``done`` gets their
        answers (headers, in server order), or the first error."""
        assert self.ring is not None
        servers = list(self.ring.servers)
        answers: dict[int, dict[str, Any]] = {}
        state = {"over": False}

        def one(server: int, msg: Message | None, error: str | None) -> None:
            if state["over"]:
                return
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
            sock = self._sock(server)
            if sock is None:
                one(server, None, "no address")
                continue
            request_id = next(self._ids)
            self.calls[request_id] = _Call(server, None, functools.partial(one, server), self.host.now())
            sock.send(encode({**header, "id": request_id}))

    # ---- data ---------------------------------------------------------------------------
    def _sock(self, server: int) -> SimSocket | None:
        if server not in self.addresses:
            return None
        if server not in self.socks:
            self.socks[server] = self.transport.connect(self.addresses[server], self.cluster.config.max_message_bytes)
        return self.socks[server]

    def push(self, table: str, keys: np.ndarray, grads: np.ndarray, done: Done, op: str = "update") -> int:
        """Push (numbered: applied once however often it is resent) as push operation
        ``op``; returns its seq."""
        self.seq += 1
        seq = self.seq
        self.inflight.add(seq)

        def finished(result: Any, error: str | None) -> None:
            self.inflight.discard(seq)
            done(result, error)

        header = {"op": Op.PUSH.value, "table": table, "sender": self.node_id, "seq": seq}
        if op != "update":
            header["push_op"] = op
        if self.specs[table].consistency == 0 and self.specs[table].aggregate:
            header["clock"] = self.clock
        self._scatter(Op.PUSH, header, table, keys, grads, finished)
        return seq

    def pull(self, table: str, keys: np.ndarray, done: Done, clock: bool = True) -> None:
        header: dict[str, Any] = {"op": Op.PULL.value, "table": table}
        if clock:
            header["clock"] = self.clock
        self._scatter(Op.PULL, header, table, keys, None, done)

    def tick(self, done: Done) -> None:
        """Finish this worker's clock: every server hears the new one."""
        self.clock += 1
        assert self.ring is not None
        servers = list(self.ring.servers)
        left = {"n": len(servers)}
        deadline = self.host.now() + self.cluster.config.retry_timeout_s

        def one(server: int, msg: Message | None, error: str | None) -> None:
            if error is not None or (msg is not None and msg.op is Op.ERROR):
                if self.host.now() < deadline and self.ring is not None and server in self.ring.servers:
                    self.host.after(0.05, send, server)
                    return
            left["n"] -= 1
            if left["n"] == 0:
                done(self.clock, None)

        def send(server: int) -> None:
            sock = self._sock(server)
            if sock is None:
                one(server, None, None)  # gone from the ring: nothing to tell it
                return
            request_id = next(self._ids)
            self.calls[request_id] = _Call(server, None, lambda m, e: one(server, m, e), self.host.now())
            sock.send(encode({"op": Op.CLOCK.value, "id": request_id, "worker": self.node_id,
                              "clock": self.clock}))

        for server in servers:
            send(server)

    def _scatter(self, kind: Op, header: dict[str, Any], table: str, keys: np.ndarray, grads: np.ndarray | None,
                 done: Done) -> None:
        """Send a pull or push (distinct ``keys``) as one piece per server; a piece that
        fails is routed again with the newest ring and resent, until the deadline."""
        spec = self.specs[table]
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        out = np.zeros((keys.shape[0], spec.dim), np.float32) if kind is Op.PULL else None
        state = {"pending": 1, "over": False}
        deadline = self.host.now() + self.cluster.config.retry_timeout_s
        Piece = tuple[int, int, np.ndarray, "np.ndarray | None", np.ndarray, np.ndarray]

        def route(k: np.ndarray, g: np.ndarray | None) -> None:
            assert self.ring is not None
            routed = route_push(self.ring, k, g if g is not None else np.zeros((k.shape[0], 1), np.float32),
                                spec.layout)
            state["pending"] += len(routed.parts) - 1
            for part in routed.parts:
                assert routed.grads is not None
                send((part.server, self.ring.version, routed.keys[part.start:part.stop],
                      routed.grads[part.start:part.stop] if g is not None else None, part.vnodes, part.counts))

        def send(piece: Piece) -> None:
            if state["over"]:
                return
            server, ring_version, k, g, vnodes, counts = piece
            sock = self._sock(server)
            if sock is None:
                answered(piece, None, "node_lost")
                return
            request_id = next(self._ids)
            self.calls[request_id] = _Call(server, piece, lambda m, e: answered(piece, m, e), self.host.now())
            h = {**header, "id": request_id, "ring_version": ring_version}
            if "seq" in h:
                h["acked"] = (min(self.inflight) - 1) if self.inflight else self.seq
            sock.send(encode(h, [k, vnodes, counts] if g is None else [k, g, vnodes, counts]))

        def answered(piece: Piece, msg: Message | None, error: str | None) -> None:
            if state["over"]:
                return
            if msg is not None and msg.op is Op.ERROR:
                error = str(msg.header.get("code"))
                if error not in ("stale_ring", "node_lost"):
                    finish(f"{error}: {msg.header.get('error')}")
                    return
                if int(msg.header.get("ring_version") or 0) > (self.ring.version if self.ring else 0):
                    self.refresh()
            if error is not None:
                if self.host.now() >= deadline:
                    finish(f"{error}: still failing after {self.cluster.config.retry_timeout_s:g} s")
                    return
                self.host.after(0.05, retry, piece)
                return
            if out is not None and msg is not None:
                out[order[np.searchsorted(sorted_keys, piece[2])]] = msg.arrays[0]
            state["pending"] -= 1
            if state["pending"] == 0:
                finish(None)

        def retry(piece: Piece) -> None:
            if state["over"]:
                return
            if piece[0] in self.addresses and piece[1] == (self.ring.version if self.ring else 0):
                send(piece)  # the same ring: the same piece again
            else:
                route(piece[2], piece[3])

        def finish(error: str | None) -> None:
            state["over"] = True
            done(out, error)

        if keys.shape[0] == 0:
            done(out, None)
            return
        route(keys, grads)
