"""The faults of a network between emulated hosts, where namespaces cannot be made (no root):
a userspace proxy in front of every node's port (``paramserver nemesis --network proxy``).

Host ``i`` is two loopback addresses (``proxied.ProxyHosts``): a public one, which its nodes
advertise and peers dial, and a private one, which they bind.  The proxy listens on the public
address and port of each node (``listen``) and connects on to the private one.  Every process
on a host makes its connections from the host's public address (``PARAMSERVER_SOURCE_HOST``),
so the proxy tells from a connection's source which pair of hosts it joins, and puts that
pair's faults on each of its two directions:

- **cut** ``src → dst``: nothing ``src`` sends to ``dst`` goes on, and no connection between
  them is made (a SYN or its answer dropped), until the cut heals.  What was sent waits, as
  TCP would send it again: a cut link loses no byte of a connection that outlives it;
- **loss** ``p`` %: a chunk is held TCP's minimum retransmission timeout (200 ms) with
  probability ``p``, and again, doubled, each time its copy is lost too;
- **rate**: a host's sending and its receiving each pass a token bucket (``tc tbf``'s, with a
  16 KiB burst), shared by all its connections;
- **delay** ± jitter: each chunk, each way, in order; a pair's is the larger of its hosts'.

    python -m paramserver.testing.nemesis.proxy

Commands come on standard input, a JSON object a line; each is answered on standard output,
``ok`` once it is in force, or ``error: WHAT``:

    {"hosts": {"127.1.2.1": 0, ...}}                    the hosts' public addresses
    {"listen": [PUBLIC, PORT, PRIVATE]}                 a node's port (the same on both addresses)
    {"faults": {"cut": [[S, D]], "loss": [[S, D, PERCENT]], "rate": [[H, BYTES_PER_S]],
                "delay": [[H, MS, JITTER_MS]]}}         every fault now in force (the rest healed)

It exits when its standard input closes: its run is over, or gone.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import socket
import sys
import time
from typing import Any

from paramserver.testing.nemesis.relay import pipe

RTO_S = 0.2  # Linux's minimum retransmission timeout: what a lost segment costs at least
MAX_RETRIES = 6
BURST = 16 << 10
PIECE = 4096  # a rate-limited chunk goes on in pieces of this, each paying its tokens


class Bucket:
    """A token bucket of ``rate`` bytes a second; a take past the tokens waits for them."""

    def __init__(self, rate: float) -> None:
        self.rate, self.tokens, self.at = rate, float(BURST), time.monotonic()

    async def take(self, n: int) -> None:
        now = time.monotonic()
        self.tokens = min(float(BURST), self.tokens + (now - self.at) * self.rate) - n
        self.at = now
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


class Network:
    """The faults in force, and the hosts' addresses."""

    def __init__(self) -> None:
        self.hosts: dict[str, int] = {}
        self.cut: set[tuple[int, int]] = set()
        self.loss: dict[tuple[int, int], float] = {}
        self.delay: dict[int, tuple[float, float]] = {}  # host -> (s, jitter s)
        self.rates: dict[int, float] = {}
        self.buckets: dict[tuple[int, str], Bucket] = {}  # (host, "out" | "in")
        self.changed = asyncio.Event()

    def set(self, faults: dict[str, Any]) -> None:
        self.cut = {(int(s), int(d)) for s, d in faults.get("cut", [])}
        self.loss = {(int(s), int(d)): float(p) / 100.0 for s, d, p in faults.get("loss", [])}
        self.delay = {int(h): (float(ms) / 1000.0, float(j) / 1000.0) for h, ms, j in faults.get("delay", [])}
        rates = {int(h): float(r) for h, r in faults.get("rate", [])}
        if rates != self.rates:
            self.rates = rates
            self.buckets = {(h, way): Bucket(r) for h, r in rates.items() for way in ("out", "in")}
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()  # every held direction looks again

    async def open(self, src: int, dst: int) -> None:
        """Returns once ``src → dst`` is not cut."""
        while True:
            changed = self.changed
            if (src, dst) not in self.cut:
                return
            await changed.wait()


class Link:
    """One direction of a connection between two hosts: the ``relay.Path`` its chunks take."""

    def __init__(self, net: Network, src: int, dst: int) -> None:
        self.net, self.src, self.dst = net, src, dst

    def due(self) -> float:
        net, extra = self.net, 0.0
        delays = [net.delay[h] for h in (self.src, self.dst) if h in net.delay]
        if delays:
            delay, jitter = max(delays)
            extra += max(0.0, delay + random.uniform(-jitter, jitter))
        p, rto = net.loss.get((self.src, self.dst), 0.0), RTO_S
        for _ in range(MAX_RETRIES):
            if not p or random.random() >= p:
                break
            extra, rto = extra + rto, rto * 2
        return time.monotonic() + extra if extra else 0.0

    async def send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        net = self.net
        await net.open(self.src, self.dst)
        if not net.buckets:
            writer.write(data)
            await writer.drain()
            return
        for at in range(0, len(data), PIECE):
            piece = data[at:at + PIECE]
            for bucket in (net.buckets.get((self.src, "out")), net.buckets.get((self.dst, "in"))):
                if bucket is not None:
                    await bucket.take(len(piece))
            await net.open(self.src, self.dst)
            writer.write(piece)
            await writer.drain()


async def _connection(net: Network, dst: int, private: str, port: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
    src = net.hosts.get(writer.get_extra_info("peername")[0], -1)  # -1: not an emulated host's; no fault
    await net.open(src, dst)  # the SYN ...
    await net.open(dst, src)  # ... and its answer
    try:
        up_reader, up_writer = await asyncio.open_connection(private, port)
    except OSError:  # nobody listens (a node down): refused, as the host's kernel would
        writer.close()
        return
    for w in (writer, up_writer):
        w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await asyncio.gather(pipe(reader, up_writer, Link(net, src, dst)), pipe(up_reader, writer, Link(net, dst, src)),
                         return_exceptions=True)


async def _command(net: Network, servers: list[asyncio.Server], cmd: dict[str, Any]) -> None:
    if "hosts" in cmd:
        net.hosts = {str(ip): int(h) for ip, h in cmd["hosts"].items()}
    elif "listen" in cmd:
        public, port, private = str(cmd["listen"][0]), int(cmd["listen"][1]), str(cmd["listen"][2])
        serve = functools.partial(_connection, net, net.hosts[public], private, port)
        servers.append(await asyncio.start_server(serve, public, port, reuse_address=True))
    elif "faults" in cmd:
        net.set(cmd["faults"])
    else:
        raise ValueError(f"unknown command {sorted(cmd)}: one of hosts, listen, faults")


async def _main() -> None:
    net = Network()
    servers: list[asyncio.Server] = []
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    while line := await commands.readline():
        try:
            await _command(net, servers, json.loads(line))
            reply = "ok"
        except Exception as e:  # noqa: BLE001 - the run reads the error and raises it there
            reply = f"error: {e!r}"
        sys.stdout.write(reply + "\n")
        sys.stdout.flush()
    for server in servers:
        server.close()


def main() -> int:
    asyncio.run(_main())
    return 0


if __name__ == "__main__":
    sys.exit(main())
