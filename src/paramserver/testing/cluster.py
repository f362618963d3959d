"""The whole cluster in one process: the real ``SchedulerNode`` and ``ServerNode``s, and
workers that speak the wire protocol, on the simulated network (``testing/sim.py``).

Nodes run exactly the code they run in production: a message that arrives makes its
host run one turn of the node's loop (``SchedulerNode.turn``, ``ServerNode.turn``), a
timer runs its heartbeats and deadline checks, and every clock they read is the host's
virtual one.  Minutes of cluster time take milliseconds, and a seed gives the same run.

The workers are ``SimWorker``s (``testing/worker.py``): the client's own sans-IO core
(``client/core.py``: routing, push numbers and the acked watermark, the decision on
every answer) driven by callbacks on the simulated network.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from paramserver.config import Config
from paramserver.scheduler.node import SchedulerNode
from paramserver.server.node import ServerNode
from paramserver.testing.sim import Faults, SimNetwork, SimSocket
from paramserver.testing.worker import SimWorker

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
        worker = SimWorker(self.net, self.config, self.scheduler.address, f"worker-{len(self.workers) + 1}", rate)
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

    def stored(self, server: SimServer, table: str, key: int) -> float | None:
        """The value ``server`` stores for ``key``, None where it stores none (it does not
        hold the key, or its vnode)."""
        t = server.node.tables.get(table)
        if t is None or server.node.ring is None:
            return None
        v = server.node.ring.vnodes(np.array([key], np.uint64), t.layout)[:1].astype(np.int32)
        k, one = np.array([key], np.uint64), np.array([1], np.int64)
        if not t.holds(v)[0] or not t.stored(v, one, k)[0]:
            return None
        return self.value(server, table, key)

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
