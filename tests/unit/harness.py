"""In-process ServerNodes driven message by message (no scheduler, no timing): the
harness of the replication and dense-table tests."""

from __future__ import annotations

import numpy as np
import zmq

from paramserver.config import load_config
from paramserver.routing.partition import route_push
from paramserver.routing.ring import Ring
from paramserver.server import node as node_mod
from paramserver.server.node import ServerNode
from paramserver.spec import TableSpec
from paramserver.wire.message import Message, decode, encode

CLIENT = b"client"


class Harness:
    def __init__(self, monkeypatch):
        self.nodes: list[ServerNode] = []
        self.replies: list[tuple[int, dict]] = []  # (server, header) answered to the client
        self.control: list[tuple[int, dict]] = []  # (server, header) sent to the scheduler
        real_send = node_mod.send

        def send(sock, frames, identity=None):
            for n in self.nodes:
                if sock is n.router and identity == CLIENT:
                    self.replies.append((n.node_id, decode([bytes(f) for f in frames]).header))
                    return
                if sock is n.control:
                    self.control.append((n.node_id, decode([bytes(f) for f in frames]).header))
                    return
            real_send(sock, frames, identity)

        monkeypatch.setattr(node_mod, "send", send)

    def make(self, *ids: int) -> list[ServerNode]:
        for i in ids:
            n = ServerNode(load_config(scheduler="tcp://127.0.0.1:9", server_threads=1))
            n.node_id = i
            n.lease.granted(float("inf"))  # no scheduler here to renew it: these nodes always serve
            self.nodes.append(n)
        return [n for n in self.nodes if n.node_id in ids]

    def by_id(self, i: int) -> ServerNode:
        return next(n for n in self.nodes if n.node_id == i)

    def ring(self, ring: Ring, specs: list[TableSpec], nodes: list[ServerNode] | None = None) -> None:
        view = {"op": "ring", "ring": ring.to_wire(), "servers": {str(n.node_id): n.address for n in self.nodes},
                "tables": {s.name: s.to_wire() for s in specs}}
        for n in nodes or self.nodes:
            n.on_ring(Message(view, []))

    def pump(self, nodes: list[ServerNode] | None = None) -> None:
        """Deliver requests and answers between the servers until none is left."""
        nodes = nodes or self.nodes
        for _ in range(1000):
            moved = False
            for n in nodes:
                if n.router.poll(5):
                    n._handle_data(n.router.recv_multipart(copy=False))
                    moved = True
                for peer, sock in list(n.peers.socks.items()):
                    if sock.poll(0):
                        n.peers.handle(peer, sock)
                        moved = True
                if n.copies and n.copies_in_flight < 2:
                    n._copy_next()
                    moved = True
            if not moved and not any(n.peers.awaiting or n.copies for n in nodes):
                return
        raise AssertionError("the servers did not go quiet")

    def deliver(self, node: ServerNode, header: dict, arrays=()) -> None:
        node._handle_data([zmq.Frame(CLIENT), *[zmq.Frame(bytes(f)) for f in encode(header, arrays)]])

    def push(self, ring: Ring, table: str, keys, grads, **fields) -> None:
        routed = route_push(ring, keys, grads, self.nodes[0].tables[table].bits)
        for p in routed.parts:
            self.deliver(self.by_id(p.server), {"op": "push", "table": table, "epoch": ring.epoch, "id": 1, **fields},
                         [routed.keys[p.start:p.stop], routed.grads[p.start:p.stop], p.vnodes, p.counts])

    @staticmethod
    def value(node: ServerNode, table: str, key) -> float | None:
        t = node.tables[table]
        v = int(node.ring.vnodes(np.array([key], np.uint64), t.bits)[0])
        if v not in t.tables:
            return None
        out = np.empty((1, t.spec.dim), np.float32)
        t.lookup(np.array([v], np.int32), np.array([1], np.int64), np.array([key], np.uint64), out)
        return float(out[0, 0])

    def close(self) -> None:
        for n in self.nodes:
            for sock in n.peers.socks.values():
                sock.close(linger=0)
            n.router.close(linger=0)
            n.control.close(linger=0)
            if n._pool is not None:
                n._pool.shutdown()
