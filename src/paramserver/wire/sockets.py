"""ZeroMQ socket helpers: every node has a ROUTER it binds, and DEALERs it connects.

Arrays go out zero-copy (pyzmq copies frames below its 64 KiB threshold anyway, where
copying is cheaper than tracking).  ``MAXMSGSIZE`` is a hard memory guard at twice the
protocol limit; anything between the two is refused with an error reply by ``decode``.
"""

from __future__ import annotations

import re
from typing import Any

import zmq

from paramserver.errors import ConfigError, ProtocolError
from paramserver.wire.security import Keys, secure_client, secure_server

_TCP = re.compile(r"^tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9._-]*):([0-9]{1,5})$")


def check_endpoint(address: Any) -> str:
    """``address`` if it is an endpoint a peer can connect to: ``tcp://HOST:PORT`` (port
    1–65535, a host name or address, not the wildcard 0.0.0.0), ``ipc://PATH`` or
    ``inproc://NAME``; else ``ProtocolError`` naming the rule."""
    if not isinstance(address, str) or len(address) > 1024:
        raise ProtocolError(f"an address must be a string like tcp://HOST:PORT, got {str(address)[:100]!r}")
    m = _TCP.match(address)
    if m:
        if not 1 <= int(m.group(2)) <= 65535:
            raise ProtocolError(f"address {address!r}: the port must be in [1, 65535]")
        if m.group(1) in ("0.0.0.0", "*", "[::]"):
            raise ProtocolError(f"address {address!r} is a wildcard, not an address peers can reach; "
                                "advertise the host's address (--advertise-host)")
        return address
    if re.match(r"^(ipc|inproc)://\S+$", address):
        return address
    raise ProtocolError(f"address {address[:100]!r} is not tcp://HOST:PORT, ipc://PATH or inproc://NAME")


def bind_router(ctx: zmq.Context, host: str, port: int, max_message_bytes: int,
                keys: Keys | None = None) -> tuple[zmq.Socket, str]:
    """A ROUTER bound on ``host:port`` (port 0: the OS picks); returns it and its address.
    With ``keys``, a CurveZMQ server (``security.py``)."""
    sock = ctx.socket(zmq.ROUTER)
    _tune(sock, max_message_bytes)
    if keys is not None:
        try:
            secure_server(sock, keys)
        except BaseException:
            sock.close(linger=0)
            raise
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a reply to a vanished peer is dropped, not raised
    try:
        sock.bind(f"tcp://{host}:{port or '*'}")
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        fix = ("another process listens there: pick another --port, or 0 for any free port"
               if exc.errno == zmq.EADDRINUSE else "check --host (an address of this machine, or 0.0.0.0)")
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; {fix}") from None
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def connect_dealer(ctx: zmq.Context, address: str, max_message_bytes: int, keys: Keys | None = None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    _tune(sock, max_message_bytes)
    if keys is not None:
        secure_client(sock, keys)
    sock.connect(address)
    return sock


def _tune(sock: zmq.Socket, max_message_bytes: int) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # never drop: flow control is request/reply
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, 2 * max_message_bytes)
    sock.setsockopt(zmq.SNDBUF, 4 << 20)
    sock.setsockopt(zmq.RCVBUF, 4 << 20)
    sock.copy_threshold = COPY_BELOW


# Frames smaller than this are copied into ZeroMQ's buffers; larger ones go out zero-copy.
# pyzmq copies below 64 KiB by default; above that, it tracks each frame and frees it from
# a garbage-collector thread once sent (a message between threads per frame).  A training
# batch's pulls and pushes are 0.1-0.3 MB: copying them is cheaper than tracking them
# (paramserver train on 10^6 heavy-tailed rows, 5 interleaved runs: 629k -> 647k examples/s).
COPY_BELOW = 1 << 20


WILDCARDS = ("0.0.0.0", "*", "::", "[::]", "")


def advertised(bound: str, advertise_host: str, scheduler: str) -> str:
    """The address peers should connect to for a socket bound at ``bound``
    (``tcp://HOST:PORT``): ``advertise_host`` if given; else, for a wildcard bind, the
    address of this machine's interface that routes to the scheduler (a UDP socket
    "connected" there sends nothing and says which source address the kernel picks)."""
    m = _TCP.match(bound)
    if not m:
        return bound
    host, port = m.group(1), m.group(2)
    if advertise_host:
        host = advertise_h = advertise_host.strip()
        if ":" in advertise_h and not advertise_h.startswith("["):
            host = f"[{advertise_h}]"
    elif host in WILDCARDS:
        host = route_to(scheduler)
    return f"tcp://{host}:{port}"


def route_to(address: str) -> str:
    """This machine's source address towards ``address`` (tcp://HOST:PORT), 127.0.0.1 when
    that cannot be told (no route: the peers are then local, or the user must say)."""
    import socket

    m = _TCP.match(address or "")
    if not m:
        return "127.0.0.1"
    target = m.group(1).strip("[]")
    try:
        infos = socket.getaddrinfo(target, int(m.group(2)), type=socket.SOCK_DGRAM)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(sockaddr)
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def refused_for(address: str, grace_s: float) -> None:
    """Raise ``ConnectError`` if every TCP connection to ``address`` is refused for
    ``grace_s`` (nothing listens there); a host that does not answer at all is left to the
    connect timeout (it may be starting, or a firewall may drop the probe)."""
    import socket
    import time

    from paramserver.errors import ConnectError

    m = _TCP.match(address)
    if not m:
        return
    deadline = time.monotonic() + grace_s
    while True:
        try:
            with socket.create_connection((m.group(1).strip("[]"), int(m.group(2))), timeout=grace_s):
                return
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise ConnectError(f"nothing listens at {address} (connection refused for {grace_s:g} s): is the "
                                   "scheduler running, and is the address right? (--scheduler, "
                                   "PARAMSERVER_SCHEDULER)") from None
            time.sleep(0.1)  # a scheduler that is starting: look again, within the grace
        except OSError:  # no answer, no route, no such host: the connect timeout decides
            return
