"""ZeroMQ socket helpers: every node has a ROUTER it binds, and DEALERs it connects.

Arrays go out zero-copy (pyzmq copies frames below its 64 KiB threshold anyway, where
copying is cheaper than tracking).  ``MAXMSGSIZE`` is a hard memory guard at twice the
protocol limit; anything between the two is refused with an error reply by ``decode``.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import sys
from typing import Any

import zmq

from paramserver.errors import ConfigError, ProtocolError
from paramserver.wire.security import Keys, secure_client, secure_server

_PORT = r"([0-9]{1,5})"
_TCP = re.compile(r"tcp://(\[[^\]]*\]|[^:/\[\]]*):" + _PORT)
_HTTP = re.compile(r"(https?)://(\[[^\]]*\]|[^:/\[\]@]*):" + _PORT + r"(/[^?#]*)?(\?[^#]*)?")
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_CONTROL = re.compile(r"[\x00-\x20\x7f-\x9f]")  # control characters and whitespace (zmq, HTTP and logs choke)
#: The longest ``ipc://`` path a Unix socket takes: ``sun_path`` (108 bytes on Linux, 104 on
#: macOS and the BSDs) less the terminating NUL.  zmq refuses a longer one (ENAMETOOLONG).
IPC_PATH_MAX = 107 if sys.platform.startswith("linux") else 103
MAX_ADDRESS = 1024
MAX_METRICS_URL = 512
_WILDCARDS = ("0.0.0.0", "*", "[::]")


def _host_problem(host: str) -> str:
    """Why ``host`` is not a host name, an IPv4 address or a bracketed IPv6 one ("" if it is one)."""
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return "the part in [] must be an IPv6 address, like [::1]"
        return ""
    if not host:
        return "the host is empty"
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "a numeric host must be an IPv4 address (four numbers 0-255, like 10.0.0.7)"
        return ""
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return ("a host name is dot-separated labels of letters, digits, '-' and '_' (at most 63 characters "
                "each, 253 in all)")
    return ""


def _one_token(value: Any, limit: int, what: str, like: str) -> tuple[str, str]:
    """``value`` and its form shown for messages, if it is a string of 1 to ``limit``
    characters with no whitespace or control character; else ``ProtocolError`` naming it,
    the rule and the fix."""
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise ProtocolError(f"{what} must be a string of 1-{limit} characters like {like}, got {str(value)[:100]!r}")
    shown = repr(value[:100])
    if _CONTROL.search(value):
        raise ProtocolError(f"{what} {shown} has whitespace or a control character: it is one token like {like}; "
                            "strip it (a trailing newline from a file or a shell?)")
    return value, shown


def check_endpoint(address: Any) -> str:
    """``address`` if it is an endpoint a peer can connect to, exactly as ZeroMQ takes it:
    ``tcp://HOST:PORT`` (``HOST`` a host name, an IPv4 address or a bracketed IPv6 one, not
    a wildcard; ``PORT`` in 1-65535), ``ipc://PATH`` (at most ``IPC_PATH_MAX`` bytes) or
    ``inproc://NAME``, with no whitespace or control character anywhere; else
    ``ProtocolError`` naming the value, the rule and the fix.  The one check every
    advertised address goes through (a bad one would reach every peer's connect)."""
    endpoint, shown = _one_token(address, MAX_ADDRESS, "address", "tcp://HOST:PORT")
    scheme, sep, rest = endpoint.partition("://")
    if scheme == "tcp":
        m = _TCP.fullmatch(endpoint)
        if not m:
            raise ProtocolError(f"address {shown} is not tcp://HOST:PORT (IPv6 in brackets: tcp://[::1]:PORT)")
        host, port = m.group(1), int(m.group(2))
        if not 1 <= port <= 65535:
            raise ProtocolError(f"address {shown}: the port must be in [1, 65535], got {port}")
        if host in _WILDCARDS:
            raise ProtocolError(f"address {shown} is a wildcard, not an address peers can reach; "
                                "advertise the host's address (--advertise-host)")
        problem = _host_problem(host)
        if problem:
            raise ProtocolError(f"address {shown}: {problem}; write tcp://HOST:PORT with this machine's name "
                                "or address")
        return endpoint
    if scheme == "ipc":
        size = len(rest.encode("utf-8", "surrogatepass"))
        if rest in ("", "*") or size > IPC_PATH_MAX:
            raise ProtocolError(f"address {shown}: an ipc:// path must be 1-{IPC_PATH_MAX} bytes (a Unix socket's "
                                f"limit on this platform), got {size}; use a shorter path, under /tmp")
        return endpoint
    if scheme == "inproc" and rest:
        return endpoint
    raise ProtocolError(f"address {shown} is not tcp://HOST:PORT, ipc://PATH or inproc://NAME")


def check_metrics_url(url: Any) -> str:
    """``url`` if it is "" (no metrics served) or ``http(s)://HOST:PORT/PATH`` with a valid
    host and port, no whitespace or control character, at most ``MAX_METRICS_URL``
    characters (it is listed by ``cluster status`` and linked by the dashboard); else
    ``ProtocolError`` naming the value, the rule and the fix."""
    if url is None or url == "":
        return ""
    text, shown = _one_token(url, MAX_METRICS_URL, "metrics URL", "http://HOST:PORT/metrics")
    m = _HTTP.fullmatch(text)
    if not m:
        raise ProtocolError(f"metrics URL {shown} is not http(s)://HOST:PORT/PATH; send the URL the metrics "
                            "server printed, or nothing")
    port = int(m.group(3))
    problem = "the port must be in [1, 65535]" if not 1 <= port <= 65535 else _host_problem(m.group(2))
    if problem:
        raise ProtocolError(f"metrics URL {shown}: {problem}; send the URL the metrics server printed, or nothing")
    return text


def bind_router(ctx: zmq.Context[zmq.Socket[bytes]], host: str, port: int, max_message_bytes: int,
                keys: Keys | None = None) -> tuple[zmq.Socket[bytes], str]:
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
    # Bounded per peer: a peer that does not read its replies must not grow this process
    # without end (300 pulls of 200k keys from a peer that never read: +580 MB, kept after
    # it left).  At the mark a reply to that peer is dropped; ROUTER_MANDATORY makes the
    # drop (and a reply to a vanished peer) an error ``ZmqSocket.send`` sees, counts and
    # drops, instead of a silent one.  A peer that reads is drained by the I/O thread as
    # fast as TCP carries the bytes, so its pipe stays far below the mark.
    sock.setsockopt(zmq.SNDHWM, ROUTER_SNDHWM)
    sock.setsockopt(zmq.RCVHWM, ROUTER_RCVHWM)  # a peer that floods requests waits (TCP), nothing is lost
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    try:
        sock.bind(f"tcp://{host}:{port or '*'}")
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        fix = ("another process listens there: pick another --port, or 0 for any free port"
               if exc.errno == zmq.EADDRINUSE else "check --host (an address of this machine, or 0.0.0.0)")
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; {fix}") from None
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def connect_dealer(ctx: zmq.Context[zmq.Socket[bytes]], address: str, max_message_bytes: int,
                   keys: Keys | None = None, source: str = "") -> zmq.Socket[bytes]:
    """A DEALER connected to ``address``; its TCP connections leave from the local address
    ``source`` if one is given (``source_host``), else from the one the kernel picks."""
    sock = ctx.socket(zmq.DEALER)
    _tune(sock, max_message_bytes)
    if keys is not None:
        secure_client(sock, keys)
    sock.connect(leaving_from(address, source))
    return sock


def leaving_from(address: str, source: str) -> str:
    """``address`` as ZeroMQ's connect takes it so that the connection leaves from the
    local address ``source`` (``tcp://SRC:0;HOST:PORT``); unchanged without a source, or
    for an address that is not TCP."""
    if source and address.startswith("tcp://"):
        return f"tcp://{f'[{source}]' if ':' in source else source}:0;{address[len('tcp://'):]}"
    return address


SOURCE_HOST_VAR = "PARAMSERVER_SOURCE_HOST"


def source_host(value: str | None = None) -> str:
    """The local address a process's outgoing connections leave from: ``value``, else
    ``$PARAMSERVER_SOURCE_HOST``, else "" (the kernel picks, by the route).  For a host with
    several addresses where peers tell nodes apart by address, and for ``paramserver
    nemesis --network proxy``, which tells the emulated hosts apart so.  ``ConfigError``
    names a value that is not an IP address of this machine."""
    raw = os.environ.get(SOURCE_HOST_VAR, "") if value is None else value
    text = raw.strip().strip("[]")
    if not text:
        return ""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(text).version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((text, 0))
    except (ValueError, OSError) as e:
        raise ConfigError(f"{SOURCE_HOST_VAR}={raw!r} is not an IP address of this machine ({e}): set it to one "
                          "of this host's addresses (ip -brief addr), or unset it to let the kernel pick") from None
    return text


#: Replies queued for one peer that has not read them yet, at most (a ROUTER's SNDHWM; each
#: frame under ``COPY_BELOW`` is copied, so this bounds what small replies hold; the bytes
#: of bigger, zero-copy replies are bounded by ``ZmqSocket``'s per-peer budget).
ROUTER_SNDHWM = 4096
#: Requests from one peer read off TCP and not yet handled, at most: past it ZeroMQ stops
#: reading that peer's connection (back-pressure to it alone; nothing is dropped).
ROUTER_RCVHWM = 16


def _tune(sock: zmq.Socket[bytes], max_message_bytes: int) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # a DEALER never drops: flow control is request/reply (ROUTER: bounded)
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


def listens(address: str, timeout_s: float = 1.0) -> bool:
    """Whether a TCP connection to ``address`` is accepted now (something listens there)."""
    import socket

    m = _TCP.match(address)
    if not m:
        return False
    try:
        with socket.create_connection((m.group(1).strip("[]"), int(m.group(2))), timeout=timeout_s):
            return True
    except OSError:
        return False


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
