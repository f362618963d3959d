"""Issue 47.1 without root: emulated hosts as loopback addresses, with a userspace proxy between
them that puts the faults on each connection (``proxied.py``, ``proxy.py``).  A connection
between two hosts pays each fault and is free of it once undone; a cut loses nothing; and a
process's connections leave from its host's address (``PARAMSERVER_SOURCE_HOST``), which is
how the proxy tells the hosts apart."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import zmq

from paramserver.errors import ConfigError
from paramserver.testing.nemesis.hosts import missing
from paramserver.testing.nemesis.proxied import ProxyHosts, emulated, rate_bytes
from paramserver.wire.sockets import SOURCE_HOST_VAR
from paramserver.wire.transport import ZmqTransport

pytestmark = pytest.mark.timeout(120)

_ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 0)); s.listen()
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
while (d := c.recv(65536)):
    c.sendall(d)
"""
# A client on host 0: "ping" prints the median round trip (ms) of 15, "one" one round trip,
# "bulk N" the seconds N bytes take to go there and back.
_CLIENT = """
import os, socket, sys, threading, time
s = socket.socket(); s.bind((os.environ["PARAMSERVER_SOURCE_HOST"], 0))
s.connect((sys.argv[1], int(sys.argv[2]))); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def back(n):
    got = 0
    while got < n:
        more = len(s.recv(min(65536, n - got)))
        assert more, "the connection closed"
        got += more
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "bulk":
        n = int(cmd[1]); t = time.monotonic()
        threading.Thread(target=s.sendall, args=(b"x" * n,)).start(); back(n)
        print(time.monotonic() - t, flush=True)
        continue
    took = []
    for _ in range(15 if cmd[0] == "ping" else 1):
        t = time.monotonic(); s.sendall(b"x" * 100); back(100)
        took.append(time.monotonic() - t)
    print(sorted(took)[len(took) // 2] * 1000, flush=True)
"""


class Pair:
    """An echo server on host 1 and a client on host 0, through the proxy."""

    def __init__(self, hosts: ProxyHosts) -> None:
        self.echo = subprocess.Popen([*hosts.exec(1), sys.executable, "-c", _ECHO, hosts.private(1)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.echo.stdout is not None
        port = int(self.echo.stdout.readline())
        hosts.listen(1, port)
        self.client = subprocess.Popen([*hosts.exec(0), sys.executable, "-c", _CLIENT, hosts.address(1), str(port)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, cmd: str, within_s: float = 20.0) -> float | None:
        """The client's answer to ``cmd``, or None if none came within ``within_s``."""
        assert self.client.stdin is not None
        self.client.stdin.write(cmd + "\n")
        self.client.stdin.flush()
        return self.answer(within_s)

    def answer(self, within_s: float) -> float | None:
        assert self.client.stdout is not None
        ready, _, _ = select.select([self.client.stdout], [], [], within_s)
        return float(self.client.stdout.readline()) if ready else None

    def stop(self) -> None:
        self.client.kill()
        self.echo.kill()
        self.client.wait(timeout=10)
        self.echo.wait(timeout=10)


@pytest.fixture
def pair() -> Iterator[tuple[ProxyHosts, Pair]]:
    with ProxyHosts(3, prefix="pt") as hosts:
        p = Pair(hosts)
        try:
            yield hosts, p
        finally:
            p.stop()


def test_the_proxy_tells_a_connections_hosts_apart_by_its_source(pair):
    hosts, p = pair
    elsewhere = hosts.partition([2], [0, 1])  # host 2 cut off: not this connection's pair
    assert (x := p.ask("one")) is not None and x < 10, x
    hosts.undo(elsewhere)
    undo = hosts.cut(0, 1)  # the client's host to the echo's
    assert p.ask("one", within_s=0.5) is None
    hosts.undo(undo)
    assert p.answer(5.0) is not None


def test_a_delay_holds_each_way_and_its_undo_lifts_it(pair):
    hosts, p = pair
    plain = p.ask("ping")
    undo = hosts.delay(1, 25, 5)
    delayed = p.ask("ping")
    hosts.undo(undo)
    lifted = p.ask("ping")
    assert plain is not None and delayed is not None and lifted is not None
    assert plain < 10 and 40 <= delayed <= 80 and lifted < 10, (plain, delayed, lifted)


def test_a_one_way_cut_holds_what_was_sent_and_its_heal_delivers_it_whole(pair):
    hosts, p = pair
    assert p.ask("one") is not None
    undo = hosts.cut(1, 0)  # the answers' way only
    assert p.ask("one", within_s=1.0) is None  # the echo's answer is held
    hosts.undo(undo)
    held = p.answer(5.0)  # ... and arrives once healed: nothing was lost
    assert held is not None and held >= 900.0, held
    assert (again := p.ask("one")) is not None and again < 10, again


def test_loss_costs_retransmission_timeouts_and_a_slow_host_its_rate(pair):
    hosts, p = pair
    undo = hosts.lose(0, 1, 40)
    late = [p.ask("one") for _ in range(20)]
    hosts.undo(undo)
    assert all(x is not None for x in late)
    assert sum(1 for x in late if x is not None and x >= 190) >= 2, late  # 40 % held 200 ms (or more)
    undo = hosts.slow(1, "1mbit")  # 125 kB/s in and out of host 1
    slowed = p.ask("bulk 250000")
    hosts.heal()
    fast = p.ask("bulk 250000")
    assert slowed is not None and fast is not None
    assert slowed >= 1.5 and fast < 0.5, (slowed, fast)


def test_rates_are_read_as_tc_writes_them():
    assert rate_bytes("200kbit") == 25_000 and rate_bytes("1mbit") == 125_000 and rate_bytes("10kbps") == 10_000
    with pytest.raises(ValueError, match="200kbit"):
        rate_bytes("fast")


def test_auto_picks_namespaces_where_it_can_and_the_proxy_is_asked_for_by_name():
    assert emulated(3, "proxy").kind == "proxy"
    assert emulated(3, "auto").kind == ("namespaces" if missing() is None else "proxy")
    with pytest.raises(ValueError, match="one of auto, namespaces, proxy"):
        emulated(3, "tunnel")


def test_a_zeromq_connection_leaves_from_the_source_host_and_a_bad_one_is_named(monkeypatch):
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_HANDOVER, 1)
    router.bind("tcp://127.0.0.1:0")
    address = router.getsockopt_string(zmq.LAST_ENDPOINT)
    monitor = router.get_monitor_socket(zmq.EVENT_ACCEPTED)
    monkeypatch.setenv(SOURCE_HOST_VAR, "127.0.9.7")
    dealer = ZmqTransport(ctx).connect(address, 1 << 20)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not monitor.poll(100):
            pass
        event = monitor.recv_multipart()
        fd = int.from_bytes(event[0][2:6], "little")  # the accepted connection's descriptor
        import socket as plain

        peer = plain.socket(fileno=os.dup(fd)).getpeername()[0]
        assert peer == "127.0.9.7"
    finally:
        dealer.close()
        router.disable_monitor()
        monitor.close(linger=0)
        router.close(linger=0)
        ctx.term()
    monkeypatch.setenv(SOURCE_HOST_VAR, "10.255.255.254")  # not this machine's
    with pytest.raises(ConfigError, match=r"PARAMSERVER_SOURCE_HOST='10.255.255.254' is not an IP address of this"):
        ZmqTransport(zmq.Context.instance())
    monkeypatch.setenv(SOURCE_HOST_VAR, "box-1")
    with pytest.raises(ConfigError, match="unset it to let the kernel pick"):
        ZmqTransport(zmq.Context.instance())


def test_a_handshake_apart_leaves_from_the_source_host_too(monkeypatch):
    """``wire/handshake.py``'s look at a silent scheduler is a connection of its own: it
    leaves from the node's host as the node's links do, or the proxy would not know it."""
    import socket as plain

    from paramserver.wire.handshake import UNKNOWN, handshake
    from paramserver.wire.security import Keys

    listener = plain.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(10)
    monkeypatch.setenv(SOURCE_HOST_VAR, "127.0.9.8")
    keys = Keys("driver", zmq.curve_keypair()[0], *zmq.curve_keypair())
    try:
        assert handshake(f"tcp://127.0.0.1:{listener.getsockname()[1]}", keys, timeout_s=0.3) == UNKNOWN
        conn, (peer, _) = listener.accept()  # queued by the kernel while the handshake waited
        conn.close()
        assert peer == "127.0.9.8"
    finally:
        listener.close()
