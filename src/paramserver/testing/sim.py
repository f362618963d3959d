"""An in-memory network under a seeded virtual clock: the simulation transport.

Every node of a simulated cluster lives on a ``Host`` (a name, a clock, a state) and
gets a ``SimTransport`` from it, which has the interface of ``wire/transport.py``:
sockets that bind ``sim://NAME`` and connect to one, pollers, ``now()``.  Nothing runs
by itself: ``SimNetwork`` keeps one queue of timed events (deliveries, timers, node
turns) and runs them in order of virtual time, ties broken by the order they were
queued, with every random choice drawn from one ``random.Random(seed)``.  The same seed
therefore gives the same run, event for event, and ``trace`` says what happened.

A message is copied to ``bytes`` when sent (no sharing between nodes) and travels as a
TCP connection would carry it: in order on its connection, after a random latency.  The
``Faults`` plan changes that, per message: drop, delay, duplicate, or deliver out of
order; and per pair of hosts: cut one way or both (a partition drops what is sent
meanwhile, as a broken connection loses what it had in flight).  A host can be paused
(it runs no turn and no timer; what is sent to it queues, and its clock runs on, as a
stopped process's does), crashed (its sockets are gone, with what was queued for it),
and given a clock that runs fast or slow.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paramserver.errors import ConfigError, ProtocolError
from paramserver.wire.message import decode

SCHEME = "sim://"


@dataclass
class Faults:
    """What the network does to messages; probabilities per message sent."""

    drop: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0  # a message is held back this often ...
    delay_s: float = 0.5  # ... by up to this long
    reorder: float = 0.0  # delivered ignoring its connection's order
    latency_s: tuple[float, float] = (0.0002, 0.002)
    #: only messages between these hosts are touched (None: every message); a
    #: campaign aims drops at links whose loss the protocol is built to survive
    only: Callable[[str, str], bool] | None = None
    cut: set[tuple[str, str]] = field(default_factory=set)  # (from, to): dropped, one way
    #: (from, to): held, in order, and delivered when the pair leaves the set (``SimNetwork.unstall``):
    #: a TCP link cut for a while loses nothing, it retransmits once it heals
    stall: set[tuple[str, str]] = field(default_factory=set)


class Host:
    """A simulated process: its sockets, its clock, whether it runs."""

    def __init__(self, net: SimNetwork, name: str, rate: float = 1.0) -> None:
        self.net, self.name, self.rate = net, name, rate
        self.offset = net.time * (1.0 - rate)  # its clock reads the network's time now
        self.state = "up"  # up | paused | crashed
        self.sockets: list[SimSocket] = []
        self.on_turn: Callable[[], Any] | None = None  # what runs when a message came
        self._turn_queued = False
        self._deferred: list[tuple[Callable[..., None], tuple[Any, ...]]] = []  # timers due while paused

    def now(self) -> float:
        return self.offset + self.rate * self.net.time

    def set_rate(self, rate: float) -> None:
        """From now on the clock runs at ``rate`` (1: true time) without jumping."""
        now = self.now()
        self.rate, self.offset = rate, now - rate * self.net.time

    def after(self, dt: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` on this host in ``dt`` seconds of its clock: a paused host runs it once
        it resumes (a stopped process runs nothing), a crashed one never."""
        def fire() -> None:
            if self.state == "up":
                fn(*args)
            elif self.state == "paused":
                self._deferred.append((fn, args))

        self.net.after(dt / self.rate, fire)

    def wake(self) -> None:
        if self.state == "up" and self.on_turn is not None and not self._turn_queued:
            self._turn_queued = True
            self.net.after(0.0, self._turn)

    def _turn(self) -> None:
        self._turn_queued = False
        if self.state == "up" and self.on_turn is not None:
            self.on_turn()

    def pause(self) -> None:
        self.net.log(f"pause {self.name}")
        self.state = "paused"

    def resume(self) -> None:
        if self.state == "paused":
            self.net.log(f"resume {self.name}")
            self.state = "up"
            self.net.resumed(self)
            deferred, self._deferred = self._deferred, []
            for fn, args in deferred:
                self.net.after(0.0, fn, *args)
            if any(s.inbox for s in self.sockets):
                self.wake()

    def crash(self) -> None:
        self.net.log(f"crash {self.name}")
        self.state = "crashed"
        self.net._held.pop(self.name, None)
        for sock in list(self.sockets):
            sock.close()

    def transport(self) -> SimTransport:
        return SimTransport(self)


class SimSocket:
    """A bound (listening) or connected socket on the simulated network."""

    def __init__(self, host: Host, bound: bool, address: str, identity: bytes = b"") -> None:
        self.host, self.bound, self.address, self.identity = host, bound, address, identity
        self.inbox: deque[list[Any]] = deque()
        self.closed = False
        host.sockets.append(self)

    def try_send(self, frames: Sequence[Any]) -> bool:
        self.send(frames)  # the simulated network queues whatever is sent
        return True

    def send(self, frames: Sequence[Any], identity: bytes | None = None) -> None:
        if self.closed or self.host.state == "crashed":
            return
        data = [f.tobytes() if isinstance(f, np.ndarray) else bytes(f) for f in frames]
        net = self.host.net
        if self.bound:
            dest = net.connections.get(identity or b"")
            if dest is not None:
                net.transmit(self, dest, data)
        else:
            dest = net.listeners.get(self.address)
            if dest is not None:
                net.transmit(self, dest, [self.identity, *data])

    def recv(self) -> list[Any]:
        return self.inbox.popleft()

    def try_recv(self) -> list[Any] | None:
        return self.inbox.popleft() if self.inbox else None

    def poll(self, timeout_ms: int = 0) -> bool:
        return bool(self.inbox)

    def close(self, linger: int = 0) -> None:
        if self.closed:
            return
        self.closed = True
        self.inbox.clear()
        net = self.host.net
        if self.bound:
            net.listeners.pop(self.address, None)
        else:
            net.connections.pop(self.identity, None)
        if self in self.host.sockets:
            self.host.sockets.remove(self)


class SimPoller:
    def __init__(self) -> None:
        self.socks: list[SimSocket] = []

    def register(self, sock: SimSocket) -> None:
        if sock not in self.socks:
            self.socks.append(sock)

    def unregister(self, sock: SimSocket) -> None:
        if sock in self.socks:
            self.socks.remove(sock)

    def poll(self, timeout_ms: int) -> set[SimSocket]:
        return {s for s in self.socks if s.inbox}  # nothing blocks: a turn runs when a message came


class SimTransport:
    """``wire/transport.py``'s interface on a simulated host."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def bind(self, host: str, port: int, max_message_bytes: int) -> tuple[SimSocket, str]:
        address = f"{SCHEME}{self.host.name}"
        if address in self.host.net.listeners:
            raise ConfigError(f"cannot listen on {address}: another node listens there")
        sock = SimSocket(self.host, True, address)
        self.host.net.listeners[address] = sock
        return sock, address

    def connect(self, address: str, max_message_bytes: int) -> SimSocket:
        net = self.host.net
        net.next_identity += 1
        identity = f"{self.host.name}#{net.next_identity}".encode()
        sock = SimSocket(self.host, False, address, identity)
        net.connections[identity] = sock
        return sock

    def poller(self) -> SimPoller:
        return SimPoller()

    def check(self, address: Any) -> str:
        if not isinstance(address, str) or not address.startswith(SCHEME):
            raise ProtocolError(f"address {str(address)[:100]!r} is not a simulated one ({SCHEME}NAME)")
        return address

    def process(self) -> str:
        return f"sim:{self.host.name}"

    def alive(self, process: str) -> bool | None:
        """A crashed host's process is gone; a paused or cut-off one may be alive."""
        host = self.host.net.hosts.get(process[len("sim:"):]) if process.startswith("sim:") else None
        return None if host is None else host.state != "crashed"

    def now(self) -> float:
        return self.host.now()


class SimNetwork:
    """The event queue, the clock, the random source and the wires of one simulation."""

    def __init__(self, seed: int, faults: Faults | None = None, trace: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.time = 0.0
        self.faults = faults or Faults()
        self.hosts: dict[str, Host] = {}
        self.listeners: dict[str, SimSocket] = {}
        self.connections: dict[bytes, SimSocket] = {}
        self.next_identity = 0
        self.trace: list[str] | None = [] if trace else None
        self.watchers: list[Callable[[SimSocket, SimSocket, list[Any]], None]] = []  # see every message sent
        self._events: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._order = 0
        self._last: dict[tuple[int, int], float] = {}  # per connection and direction: last delivery time
        self._held: dict[str, list[tuple[SimSocket, list[Any]]]] = {}  # deliveries to paused hosts
        self._stalled: list[tuple[SimSocket, SimSocket, list[Any]]] = []  # sent on a stalled link, in order

    # ---- time ---------------------------------------------------------------------------
    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self._order += 1
        heapq.heappush(self._events, (max(t, self.time), self._order, fn, args))

    def after(self, dt: float, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.time + dt, fn, *args)

    def every(self, host: Host, period: float, fn: Callable[[], bool | None]) -> None:
        """Run ``fn`` on ``host`` every ``period`` of its clock while it is up (a paused host
        skips the ticks, as a stopped process does); stops once ``fn`` returns False or
        the host crashed."""

        def tick() -> None:
            if host.state == "crashed":
                return
            if host.state == "up" and fn() is False:
                return
            self.after(period / host.rate, tick)

        self.after(period / host.rate, tick)

    def run_until(self, t: float, stop: Callable[[], bool] | None = None) -> None:
        """Run events up to virtual time ``t`` (or until ``stop()`` says so)."""
        while self._events and self._events[0][0] <= t:
            when, _, fn, args = heapq.heappop(self._events)
            self.time = when
            fn(*args)
            if stop is not None and stop():
                return
        self.time = max(self.time, t)

    def log(self, line: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.time:12.6f} {line}")

    # ---- hosts --------------------------------------------------------------------------
    def host(self, name: str, rate: float = 1.0) -> Host:
        if name in self.hosts and self.hosts[name].state != "crashed":
            raise ConfigError(f"host {name!r} exists")
        h = self.hosts[name] = Host(self, name, rate)
        return h

    def unstall(self) -> None:
        """Send on what the stalled links held, in order, where the link is no longer stalled."""
        held, self._stalled = self._stalled, []
        for src, dest, frames in held:
            self._route(src, dest, frames)

    def resumed(self, host: Host) -> None:
        for dest, frames in self._held.pop(host.name, []):
            self._deliver(dest, frames)

    # ---- wires --------------------------------------------------------------------------
    def transmit(self, src: SimSocket, dest: SimSocket, frames: list[Any]) -> None:
        for watch in self.watchers:  # what was sent, when it was sent
            watch(src, dest, frames)
        self._route(src, dest, frames)

    def _route(self, src: SimSocket, dest: SimSocket, frames: list[Any]) -> None:
        f, a, b = self.faults, src.host.name, dest.host.name
        if (a, b) in f.cut:
            self._log_message("cut", src, dest, frames)
            return
        if (a, b) in f.stall:
            self._stalled.append((src, dest, frames))
            return
        touched = f.only is None or f.only(a, b)
        r = self.rng.random
        if touched and f.drop and r() < f.drop:
            self._log_message("drop", src, dest, frames)
            return
        latency = f.latency_s[0] + r() * (f.latency_s[1] - f.latency_s[0])
        if touched and f.delay and r() < f.delay:
            latency += r() * f.delay_s
        channel = (id(src), id(dest))
        when = self.time + latency
        if not (touched and f.reorder and r() < f.reorder):
            when = max(when, self._last.get(channel, 0.0))  # TCP: in order on a connection
            self._last[channel] = when
        self.at(when, self._arrive, src, dest, frames)
        if touched and f.duplicate and r() < f.duplicate:
            self.at(when + r() * latency, self._arrive, src, dest, frames)

    def _arrive(self, src: SimSocket, dest: SimSocket, frames: list[Any]) -> None:
        if dest.closed or dest.host.state == "crashed":
            self._log_message("lost", src, dest, frames)
            return
        if (src.host.name, dest.host.name) in self.faults.cut:
            self._log_message("cut", src, dest, frames)
            return
        if dest.host.state == "paused":
            self._held.setdefault(dest.host.name, []).append((dest, frames))
            return
        self._deliver(dest, frames, src)

    def _deliver(self, dest: SimSocket, frames: list[Any], src: SimSocket | None = None) -> None:
        if dest.closed:
            return
        if src is not None:
            self._log_message("", src, dest, frames)
        dest.inbox.append(frames)
        dest.host.wake()

    def _log_message(self, what: str, src: SimSocket, dest: SimSocket, frames: list[Any]) -> None:
        if self.trace is None:
            return
        body = frames[1:] if dest.bound else frames
        try:
            h = decode(body).header
            desc = f"{h.get('op')} id={h.get('id')}" + (f" seq={h['seq']}" if "seq" in h else "")
        except Exception:
            desc = "undecodable"
        self.log(f"{src.host.name} -> {dest.host.name} {desc}{' [' + what + ']' if what else ''}")
