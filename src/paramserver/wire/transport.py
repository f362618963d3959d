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

import time
from collections.abc import Sequence
from typing import Any, Protocol

import zmq

from paramserver.errors import ConfigError
from paramserver.wire.liveness import process_alive, process_token
from paramserver.wire.security import load_keys
from paramserver.wire.sockets import bind_router, check_endpoint, connect_dealer

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
    """A ZeroMQ ROUTER (``bound``) or DEALER.  Arrays go out zero-copy."""

    __slots__ = ("raw", "bound")

    def __init__(self, raw: zmq.Socket[bytes], bound: bool) -> None:
        self.raw, self.bound = raw, bound

    def send(self, frames: Sequence[Any], identity: bytes | None = None) -> None:
        self.raw.send_multipart([identity, *frames] if identity is not None else list(frames), copy=False)

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

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]] | None = None, secret_file: str = "") -> None:
        self.ctx = ctx or zmq.Context.instance()
        self.keys = load_keys(secret_file) if secret_file else None  # CurveZMQ on every link (security.py)

    def bind(self, host: str, port: int, max_message_bytes: int) -> tuple[ZmqSocket, str]:
        raw, address = bind_router(self.ctx, host, port, max_message_bytes, self.keys)
        return ZmqSocket(raw, True), address

    def connect(self, address: str, max_message_bytes: int) -> ZmqSocket:
        return ZmqSocket(connect_dealer(self.ctx, address, max_message_bytes, self.keys), False)

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

