"""The transport seam: how nodes reach each other, and what time it is.

A node binds one listening socket (peers reach it by the address it returns) and
connects sockets to other nodes' addresses.  A listening socket receives
``[identity, *frames]`` (``identity``: ``bytes``, the sender's connection) and answers
with ``send(frames, identity)``; a connected socket sends and receives bare frames.  A
``Poller`` says which sockets have something to read.  ``now()`` is the node's clock:
every deadline, lease and timer in the protocols reads it, never ``time`` directly.

Two implementations:

* ``ZmqTransport``: ZeroMQ ROUTER/DEALER sockets (``tcp://``, ``ipc://``, ``inproc://``)
  and the monotonic clock; what every real node uses.
* ``paramserver.testing.sim``: an in-memory network under a seeded virtual clock, where
  a fault plan drops, delays, duplicates and reorders messages, partitions and pauses
  nodes (``sim://NAME`` addresses).

``scheme_of`` checks an address's scheme and names the known ones.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

import zmq

from paramserver.errors import ConfigError
from paramserver.wire.liveness import process_alive, process_token
from paramserver.wire.security import load_keys
from paramserver.wire.sockets import COPY_BELOW, bind_router, check_endpoint, connect_dealer, source_host

logger = logging.getLogger(__name__)

#: Bytes of zero-copy replies (frames of ``COPY_BELOW`` or more) that ZeroMQ still holds
#: for one peer, at most: a further one is dropped, unless none is pending (one reply
#: always goes, however large).  With the ROUTER's SNDHWM this bounds what a peer that
#: does not read costs; a peer that reads frees its budget as TCP carries the bytes.
PEER_REPLY_BYTES = 64 << 20
#: ... and only once the oldest of them has waited this long: a client that reads (its I/O
#: thread drains every reply as TCP brings it) is never refused a reply for pipelining big
#: pulls, which it could not tell from a lost one (a client declared dead closes sooner).
PEER_STALLED_S = 5.0
#: Past this, a reply is dropped however recent the unread ones (a burst from a peer that
#: does not read must not cost the server more than this before the ``PEER_STALLED_S`` mark).
PEER_REPLY_BYTES_MAX = 3 * PEER_REPLY_BYTES
_SWEEP_EVERY = 256  # zero-copy sends between sweeps of the peers whose replies all went

#: The schemes ZeroMQ serves, and the in-memory network's.
ZMQ_SCHEMES = ("tcp", "ipc", "inproc")
SIM_SCHEME = "sim"
SCHEMES = (*ZMQ_SCHEMES, SIM_SCHEME)


def scheme_of(address: str) -> str:
    """The scheme of ``address`` (``tcp://HOST:PORT`` -> ``tcp``); ``ConfigError`` naming the
    known schemes if it has none or an unknown one."""
    scheme, sep, _ = str(address).partition("://")
    known = ", ".join(s + "://" for s in SCHEMES)
    if not sep:
        raise ConfigError(f"address {str(address)[:100]!r} has no scheme: write it like tcp://HOST:PORT "
                          f"(known schemes: {known})")
    if scheme not in SCHEMES:
        raise ConfigError(f"address {str(address)[:100]!r}: unknown transport scheme {scheme!r}; known: {known} "
                          "(sim:// exists only inside paramserver.testing)")
    return scheme


class Socket(Protocol):
    def send(self, frames: Sequence[Any], identity: bytes | None = None) -> None: ...

    def try_send(self, frames: Sequence[Any]) -> bool: ...  # a connecting socket's; False: no link yet

    def recv(self) -> list[Any]: ...

    def try_recv(self) -> list[Any] | None: ...  # None: nothing is waiting

    def poll(self, timeout_ms: int = 0) -> bool: ...

    def close(self) -> None: ...


class Poller(Protocol):
    def register(self, sock: Any) -> None: ...

    def unregister(self, sock: Any) -> None: ...

    def poll(self, timeout_ms: int) -> set[Any]: ...


class Transport(Protocol):
    def bind(self, host: str, port: int, max_message_bytes: int) -> tuple[Any, str]: ...

    def connect(self, address: str, max_message_bytes: int) -> Any: ...

    def poller(self) -> Poller: ...

    def now(self) -> float: ...

    def check(self, address: Any) -> str: ...  # an address peers can reach on it, else ProtocolError

    def process(self) -> str: ...  # who this node's process is, for ``alive`` elsewhere ("" if unknown)

    def alive(self, process: str) -> bool | None: ...  # False: gone for certain; None: cannot tell


class ZmqSocket:
    """A ZeroMQ ROUTER (``bound``) or DEALER.  Arrays go out zero-copy.

    A ROUTER's send never blocks and never queues without bound: a reply to a peer whose
    queue is at the high-water mark, or whose zero-copy replies still held pass
    ``PEER_REPLY_BYTES``, or to a peer that is gone, is dropped and counted (``dropped``)."""

    __slots__ = ("raw", "bound", "dropped", "_pending", "_sends")

    def __init__(self, raw: zmq.Socket[bytes], bound: bool) -> None:
        self.raw, self.bound = raw, bound
        self.dropped = 0
        # peer -> [(tracker, bytes)] of zero-copy replies ZeroMQ has not released yet
        self._pending: dict[bytes, collections.deque[tuple[zmq.MessageTracker, int, float]]] = {}
        self._sends = 0

    def send(self, frames: Sequence[Any], identity: bytes | None = None) -> None:
        if identity is None:
            self.raw.send_multipart(list(frames), copy=False)
            return
        sizes = [memoryview(f).nbytes for f in frames]
        big = sum(n for n in sizes if n >= COPY_BELOW)
        held = self.pending_bytes(identity) if big else 0
        if held and held + big > PEER_REPLY_BYTES and (self._stalled(identity) or held + big > PEER_REPLY_BYTES_MAX):
            self._drop(identity, f"{held >> 20} MiB of its earlier replies are still unread")
            return
        trackers: list[tuple[zmq.MessageTracker, int, float]] = []
        try:
            if not big:  # copied frames only: one call, nothing to track
                self.raw.send_multipart([identity, *frames], zmq.NOBLOCK, copy=False)
                return
            self.raw.send(identity, zmq.NOBLOCK | zmq.SNDMORE)
            last = len(frames) - 1
            for i, (frame, n) in enumerate(zip(frames, sizes)):
                flags = 0 if i == last else zmq.SNDMORE
                if n >= COPY_BELOW:
                    trackers.append((self.raw.send(frame, flags, copy=False, track=True), n, time.monotonic()))
                else:
                    self.raw.send(frame, flags, copy=False)
        except zmq.Again:  # at the high-water mark: the peer does not read
            self._drop(identity, "it has not read its last replies")
            return
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            self._pending.pop(identity, None)  # the peer is gone: what it had is freed
            return
        if trackers:
            self._pending.setdefault(identity, collections.deque()).extend(trackers)
            self._sends += 1
            if self._sends % _SWEEP_EVERY == 0:
                for peer in list(self._pending):
                    self.pending_bytes(peer)

    def pending_bytes(self, identity: bytes) -> int:
        """Bytes of zero-copy replies to ``identity`` ZeroMQ still holds (a peer with
        none left is forgotten)."""
        queue = self._pending.get(identity)
        if queue is None:
            return 0
        while queue and queue[0][0].done:
            queue.popleft()
        if not queue:
            del self._pending[identity]
            return 0
        return sum(n for tracker, n, _ in queue if not tracker.done)

    def _stalled(self, identity: bytes) -> bool:
        """The oldest reply ZeroMQ still holds for ``identity`` has waited ``PEER_STALLED_S``."""
        queue = self._pending.get(identity)
        return queue is not None and bool(queue) and time.monotonic() - queue[0][2] > PEER_STALLED_S

    def _drop(self, identity: bytes, why: str) -> None:
        self.dropped += 1
        if self.dropped & (self.dropped - 1) == 0:  # 1, 2, 4, 8...: a flood logs a few lines
            logger.warning("reply to peer %s dropped: %s (%d replies dropped so far)", identity.hex()[:16], why,
                           self.dropped)

    def try_send(self, frames: Sequence[Any]) -> bool:
        """Send unless no link can take it now (a connecting socket whose peer has not
        finished its handshake, or refused it): then False, and nothing is sent."""
        try:
            self.raw.send_multipart(list(frames), zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True

    def recv(self) -> list[Any]:
        frames: list[Any] = self.raw.recv_multipart(copy=False)
        if self.bound:
            frames[0] = frames[0].bytes
        return frames

    def try_recv(self) -> list[Any] | None:
        """The next message, or None if none is waiting (one call, no poll first)."""
        try:
            frames: list[Any] = self.raw.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        if self.bound:
            frames[0] = frames[0].bytes
        return frames

    def poll(self, timeout_ms: int = 0) -> bool:
        return bool(self.raw.poll(timeout_ms))

    def fd(self) -> int:
        """ZeroMQ's descriptor of the socket: readable when it may have something to say
        (an edge: look at ``readable`` after every use of the socket)."""
        return int(self.raw.getsockopt(zmq.FD))

    def readable(self) -> bool:
        """A message waits (ZeroMQ's ``EVENTS``)."""
        return bool(int(self.raw.getsockopt(zmq.EVENTS)) & zmq.POLLIN)

    def close(self, linger: int = 0) -> None:
        self.raw.close(linger=linger)


class ZmqPoller:
    __slots__ = ("_poller", "_by_raw")

    def __init__(self) -> None:
        self._poller = zmq.Poller()
        self._by_raw: dict[zmq.Socket[bytes], ZmqSocket] = {}

    def register(self, sock: ZmqSocket) -> None:
        self._by_raw[sock.raw] = sock
        self._poller.register(sock.raw, zmq.POLLIN)

    def unregister(self, sock: ZmqSocket) -> None:
        if self._by_raw.pop(sock.raw, None) is not None:
            self._poller.unregister(sock.raw)

    def poll(self, timeout_ms: int) -> set[ZmqSocket]:
        return {self._by_raw[raw] for raw, _ in self._poller.poll(timeout_ms)}


class ZmqTransport:
    """Real sockets and real time."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]] | None = None, secret_file: str = "",
                 source: str | None = None) -> None:
        self.ctx = ctx or zmq.Context.instance()
        self.keys = load_keys(secret_file) if secret_file else None  # CurveZMQ on every link (security.py)
        self.source = source_host(source)  # where its connections leave from ("": the kernel picks)

    def bind(self, host: str, port: int, max_message_bytes: int) -> tuple[ZmqSocket, str]:
        raw, address = bind_router(self.ctx, host, port, max_message_bytes, self.keys)
        return ZmqSocket(raw, True), address

    def connect(self, address: str, max_message_bytes: int) -> ZmqSocket:
        return ZmqSocket(connect_dealer(self.ctx, address, max_message_bytes, self.keys, self.source), False)

    def poller(self) -> ZmqPoller:
        return ZmqPoller()

    def check(self, address: Any) -> str:
        return check_endpoint(address)

    def process(self) -> str:
        return process_token()

    def alive(self, process: str) -> bool | None:
        return process_alive(process)

    def now(self) -> float:
        return time.monotonic()


def transport_for(address: str, given: Transport | None = None, secret_file: str = "") -> Transport:
    """The transport that reaches ``address``: ``given`` if any (a simulation passes its
    own), else ZeroMQ for its schemes; ``ConfigError`` for a scheme nothing here serves."""
    if given is not None:
        return given
    scheme = scheme_of(address)
    if scheme == SIM_SCHEME:
        raise ConfigError(f"address {address!r} is a simulated one: only paramserver.testing.SimCluster "
                          "runs nodes on sim://; use tcp://HOST:PORT")
    return ZmqTransport(secret_file=secret_file)

