"""In-process ServerNodes on the simulated network (``paramserver.testing.sim``),
driven message by message: no scheduler, no timers; the harness of the replication and
dense-table tests.  What the servers send to the client and to the scheduler is
recorded as it is sent."""

from __future__ import annotations

import numpy as np

from paramserver.config import load_config
from paramserver.routing.partition import route_push
from paramserver.routing.ring import Ring
from paramserver.server.node import ServerNode
from paramserver.tables.spec import TableSpec
from paramserver.testing.sim import SimNetwork, SimSocket
from paramserver.wire.message import Message, decode, encode

CLIENT = b"client"
#: the default job's rule (``train``'s FTRL), for the tables steps go to (``conftest.two``)
STEP_FTRL = {"name": "ftrl", "alpha": 0.115, "beta": 0.5, "l1": 0.0, "l2": 0.0}


class Harness:
    def __init__(self):
        self.net = SimNetwork(0)
        self.nodes: list[ServerNode] = []
        self.replies: list[tuple[int, dict]] = []  # (server, header) answered to the client
        self.answers: list[Message] = []  # the same answers whole, arrays too
        self.control: list[tuple[int, dict]] = []  # (server, header) sent to the scheduler
        self.scheduler, _ = self.net.host("scheduler").transport().bind("", 0, 1 << 30)
        self.client = SimSocket(self.net.host("client"), False, "", CLIENT)
        self.net.connections[CLIENT] = self.client

        def watch(src, dest, frames):
            for n in self.nodes:
                if src is n.router and dest is self.client:
                    self.answers.append(decode(frames))
                    self.replies.append((n.node_id, self.answers[-1].header))
                elif src is n.control:
                    self.control.append((n.node_id, decode(frames[1:]).header))

        self.net.watchers.append(watch)

    def make(self, *ids: int) -> list[ServerNode]:
        for i in ids:
            host = self.net.host(f"server-{i}")
            n = ServerNode(load_config(scheduler="sim://scheduler", server_threads=1), host.transport())
            n.node_id = i
            n.state.lease.granted(float("inf"))  # no scheduler here to renew it: these nodes always serve
            self.nodes.append(n)
        return [n for n in self.nodes if n.node_id in ids]

    def by_id(self, i: int) -> ServerNode:
        return next(n for n in self.nodes if n.node_id == i)

    def ring(self, ring: Ring, specs: list[TableSpec], nodes: list[ServerNode] | None = None) -> None:
        view = {"op": "ring", "ring": ring.to_wire(), "servers": {str(n.node_id): n.address for n in self.nodes},
                "tables": {s.name: s.to_wire() for s in specs}}
        for n in nodes or self.nodes:
            n.on_ring(Message(view, []))

    def flush(self) -> None:
        """Move every message sent so far into its receiver's queue (nobody reads it yet)."""
        self.net.run_until(self.net.time + 1.0)

    def pump(self, nodes: list[ServerNode] | None = None) -> None:
        """Deliver requests and answers between the servers until none is left."""
        nodes = nodes or self.nodes
        for _ in range(1000):
            self.flush()
            moved = False
            for n in nodes:
                if n.router.poll(0) or any(s.poll(0) for s in n.peers.socks.values()) or n.wants_turn():
                    n.turn()
                    moved = True
            if not moved and not any(n.peers.awaiting or n.copies.queue for n in nodes):
                return
        raise AssertionError("the servers did not go quiet")

    def deliver(self, node: ServerNode, header: dict, arrays=()) -> None:
        node._handle_data([CLIENT, *[bytes(f) if not isinstance(f, np.ndarray) else f.tobytes()
                                     for f in encode(header, arrays)]])
        self.flush()

    def push(self, ring: Ring, table: str, keys, grads, **fields) -> None:
        routed = route_push(ring, keys, grads, self.nodes[0].tables[table].layout)
        for p in routed.parts:
            header = {"op": "push", "table": table, "ring_version": ring.version, "id": 1, **fields}
            self.deliver(self.by_id(p.server), header,
                         [routed.keys[p.start:p.stop], routed.grads[p.start:p.stop], p.vnodes, p.counts])

    @staticmethod
    def value(node: ServerNode, table: str, key) -> float | None:
        t = node.tables[table]
        v = int(node.ring.vnodes(np.array([key], np.uint64), t.layout)[0])
        if v not in t.tables:
            return None
        out = np.empty((1, t.spec.dim), np.float32)
        t.lookup(np.array([v], np.int32), np.array([1], np.int64), np.array([key], np.uint64), out)
        return float(out[0, 0])

    def close(self) -> None:
        for n in self.nodes:
            n.close()
