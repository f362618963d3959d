"""An emulated host's relay: delay and jitter on its links, where the kernel has no ``netem``.

Every TCP connection the host opens to another host is redirected to this relay (an nftables
``redirect`` in the host's output hook, ``Hosts.relays``); the relay learns where the
connection was going (``SO_ORIGINAL_DST``), opens it itself, marked so that its own connection
is not redirected again, and copies the bytes both ways.  Each chunk it reads is written on
after the delay set for that peer, plus a uniform jitter, and never before the chunk ahead of
it: a TCP stream keeps its order, as a delayed link's would.  With no delay set a chunk goes
on at once.

    python -m paramserver.testing.nemesis.relay PORT CONTROL

``CONTROL`` is a JSON file ``{"PEER_IP": [delay_ms, jitter_ms], ...}``, written whole
(``os.replace``) by the run and read again when it changes; a peer it does not name has no
delay.  The relay prints ``ready`` once it listens.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

MARK = 0x4E  # the relay's own connections carry this mark: the redirect skips them
PORT = 7799
SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
CHUNK = 1 << 16
HELD_BYTES = 8 << 20  # a direction holding this much stops reading until it drains
#: asyncio's sleep wakes on the selector's timeout, which epoll takes in whole milliseconds,
#: rounded up: a hold of 25 µs took ~1 ms, and a link of 1 ms round trip (0.5 ms each way)
#: measured 2.4 ms.  The last ``FINE_S`` of a hold is slept in a thread (``time.sleep``, on
#: the nanosecond clock), which wakes the loop through its self-pipe (``sleep_until``)
FINE_S = 0.003
_SLEEPERS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="hold")  # a direction sleeps in one at a time


class _Hop:
    """What the thread's round trip adds to a hold (submitted, woken, the loop woken in turn):
    0.3 ms on this project's 2-core VM, far less on a quiet machine; learnt from each wake."""

    seconds = 0.0002

    @classmethod
    def woke(cls, late: float) -> None:
        """A hold slept ``seconds`` short woke ``late`` after its due time (negative: early)."""
        cls.seconds = min(0.001, max(0.0, cls.seconds + late / 8))


async def sleep_until(due: float) -> None:
    """Wake at ``due`` (monotonic), to a tenth of a millisecond or so rather than the loop's one."""
    wait = due - time.monotonic()
    if wait > FINE_S:
        await asyncio.sleep(wait - FINE_S)
        wait = due - time.monotonic()
    if wait > _Hop.seconds:
        await asyncio.get_running_loop().run_in_executor(_SLEEPERS, time.sleep, wait - _Hop.seconds)
        _Hop.woke(time.monotonic() - due)


class Delays:
    """The delay and jitter of each peer, from the control file (read again when it changes)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stamp: float = -1.0
        self.table: dict[str, tuple[float, float]] = {}

    def of(self, peer: str) -> tuple[float, float]:
        try:
            stamp = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            return 0.0, 0.0
        if stamp != self.stamp:
            with open(self.path) as f:
                raw = json.load(f)
            self.table = {ip: (float(d) / 1000.0, float(j) / 1000.0) for ip, (d, j) in raw.items()}
            self.stamp = stamp
        return self.table.get(peer, (0.0, 0.0))


class Path(Protocol):
    """What one direction of a relayed connection goes through (a delayed link here; every
    fault of ``proxy.py``'s links there)."""

    def due(self) -> float:
        """When a chunk read now may go on (monotonic; 0: at once), before the order is kept."""

    async def send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        """Write ``data`` on, once the path lets it through."""


class Delayed:
    """A relay's path to ``peer``: the delay and jitter its control file sets."""

    def __init__(self, delays: Delays, peer: str) -> None:
        self.delays, self.peer = delays, peer

    def due(self) -> float:
        delay, jitter = self.delays.of(self.peer)
        return time.monotonic() + max(0.0, delay + random.uniform(-jitter, jitter)) if delay else 0.0

    async def send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: Path) -> None:
    """Copy ``reader`` to ``writer`` through ``path``: each chunk held until it is due, in order
    (a TCP stream keeps its order, as a delayed link's would); at most ``HELD_BYTES`` held,
    past which reading stops until it drains (as a full TCP window)."""
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
    room = asyncio.Semaphore(HELD_BYTES // CHUNK)

    async def release() -> None:
        broken = False  # the far side went away: what is still read is dropped, as its kernel would
        while True:
            due, data = await held.get()
            if not broken:
                await sleep_until(due)
            if not data:
                break
            try:
                if not broken:
                    await path.send(writer, data)
            except (ConnectionError, OSError):
                broken = True
            room.release()
        writer.close()

    sender = asyncio.create_task(release())
    last = 0.0
    try:
        while True:
            await room.acquire()
            data = await reader.read(CHUNK)
            last = max(last, path.due())
            await held.put((last, data))
            if not data:
                break
    except (ConnectionError, OSError):
        await held.put((last, b""))
    await sender


async def _serve(port: int, delays: Delays) -> None:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        dst_port, dst_ip = struct.unpack("!H", raw[2:4])[0], socket.inet_ntoa(raw[4:8])
        out = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        out.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, MARK)
        out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(out, (dst_ip, dst_port))
            up_reader, up_writer = await asyncio.open_connection(sock=out)
        except OSError:
            out.close()
            writer.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        path = Delayed(delays, dst_ip)
        await asyncio.gather(pipe(reader, up_writer, path), pipe(up_reader, writer, path), return_exceptions=True)

    server = await asyncio.start_server(connection, "0.0.0.0", port, reuse_address=True)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    asyncio.run(_serve(int(argv[0]), Delays(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
