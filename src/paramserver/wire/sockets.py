"""ZeroMQ socket helpers: every node has a ROUTER it binds, and DEALERs it connects.

Arrays go out zero-copy (pyzmq copies frames below its 64 KiB threshold anyway, where
copying is cheaper than tracking).  ``MAXMSGSIZE`` is a hard memory guard at twice the
protocol limit; anything between the two is refused with an error reply by ``decode``.
"""

from __future__ import annotations

from typing import Any, Sequence

import zmq

from paramserver.errors import ConfigError


def bind_router(ctx: zmq.Context, host: str, port: int, max_message_bytes: int) -> tuple[zmq.Socket, str]:
    """A ROUTER bound on ``host:port`` (port 0: the OS picks); returns it and its address."""
    sock = ctx.socket(zmq.ROUTER)
    _tune(sock, max_message_bytes)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a reply to a vanished peer is dropped, not raised
    try:
        sock.bind(f"tcp://{host}:{port or '*'}")
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        fix = ("another process listens there: pick another --port, or 0 for any free port"
               if exc.errno == zmq.EADDRINUSE else "check --host (an address of this machine, or 0.0.0.0)")
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; {fix}") from None
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def connect_dealer(ctx: zmq.Context, address: str, max_message_bytes: int) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    _tune(sock, max_message_bytes)
    sock.connect(address)
    return sock


def _tune(sock: zmq.Socket, max_message_bytes: int) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # never drop: flow control is request/reply
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, 2 * max_message_bytes)
    sock.setsockopt(zmq.SNDBUF, 4 << 20)
    sock.setsockopt(zmq.RCVBUF, 4 << 20)


def send(sock: zmq.Socket, frames: Sequence[Any], identity: bytes | None = None) -> None:
    parts = [identity, *frames] if identity is not None else list(frames)
    sock.send_multipart(parts, copy=False)
