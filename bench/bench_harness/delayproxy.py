"""A userspace link between nodes: TCP relays that add a one-way delay and cap the rate,
for machines whose kernel has no ``netem`` (this one: ``tc`` knows ``tbf``, not ``netem``)
or where network namespaces cannot be made (issue 47).

    python bench/bench_harness/delayproxy.py --delay-ms 5 --rate-mbit 100 \\
        127.0.0.2:7000=127.0.0.1:7000 127.0.0.2:7001=127.0.0.1:7001

Each ``LISTEN=TARGET`` pair accepts connections at LISTEN and relays each to TARGET, both
ways.  What a side sends is held ``--delay-ms`` and then written in the order it came (a
TCP link delays, it does not reorder), no faster than ``--rate-mbit`` a direction of a
connection.  A node reached through it advertises the LISTEN host (``--advertise-host``),
so every peer's traffic crosses the relay.  It prints ``ready`` once every pair listens,
and runs until killed.

``delayrelay.c`` is the same link in C, which the benchmarks use where a C compiler is
(``relays.py``): this one takes a quarter to a third of a core at 1 Gbit/s (asyncio's work
for each chunk, and the holds slept in threads), which a job measured beside it on two cores
loses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time

from paramserver.testing.nemesis.relay import pipe, sleep_until


class Paced:
    """One direction of a relayed connection: each chunk held ``delay_s``, then written no
    faster than ``rate_bps`` (0: no cap); ``relay.pipe`` keeps the order and the hold."""

    def __init__(self, delay_s: float, rate_bps: float) -> None:
        self.delay_s, self.rate_bps = delay_s, rate_bps
        self.free_at = 0.0  # when the link has sent what it was given (the rate cap)

    def due(self) -> float:
        return time.monotonic() + self.delay_s if self.delay_s else 0.0

    async def send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        start = max(time.monotonic(), self.free_at)
        await sleep_until(start)  # not asyncio.sleep: it rounds up to the millisecond (``relay.FINE_S``)
        writer.write(data)
        await writer.drain()
        if self.rate_bps:
            self.free_at = start + len(data) / self.rate_bps


async def _relay(target: tuple[str, int], delay_s: float, rate_bps: float,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection(*target)
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(pipe(reader, up_writer, Paced(delay_s, rate_bps)),
                             pipe(up_reader, writer, Paced(delay_s, rate_bps)))
    except (ConnectionError, OSError):
        pass
    finally:
        for w in (writer, up_writer):
            w.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(pairs: list[tuple[tuple[str, int], tuple[str, int]]], delay_s: float, rate_bps: float) -> None:
    servers = [await asyncio.start_server(lambda r, w, t=target: _relay(t, delay_s, rate_bps, r, w), *listen)
               for listen, target in pairs]
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay a direction")
    ap.add_argument("--rate-mbit", type=float, default=0.0, help="cap a direction of a connection (0: none)")
    ap.add_argument("pairs", nargs="+", metavar="LISTEN=TARGET")
    args = ap.parse_args()
    pairs = [(_address(p.split("=")[0]), _address(p.split("=")[1])) for p in args.pairs]
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(pairs, args.delay_ms / 1000, args.rate_mbit * 1e6 / 8))
    sys.exit(0)


if __name__ == "__main__":
    main()
