"""The userspace links themselves (issue 47): round trips and a bulk transfer through each
relay ``bench_harness/relays.py`` can start, and the CPU the relay took for it.

    .venv/bin/python bench/link_relays.py [--holds 0 0.025 0.5 5] [--rate-mbit 1000] [--mb 100]

For each relay (``delayrelay.c``, where a C compiler is, and ``delayproxy.py``) and each
one-way hold: the median of 200 round trips of 100 bytes through it (after 20 unmeasured),
then ``--mb`` MB sent one way at ``--rate-mbit``, its rate, and the relay's CPU time over
the transfer as a share of one core (from ``/proc``; Linux only).  An echo server on
127.0.0.1 answers; the relay listens on 127.0.0.2.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import threading
import time

from bench_harness.procs import free_port
from bench_harness.relays import is_python, relay_command

BULK = b"B"  # a connection whose first byte is this is a bulk transfer: counted, answered once


def _echo(listener: socket.socket, total: int) -> None:
    def serve(conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            first = conn.recv(1)
            if first == BULK:
                got = 1
                while got < total:
                    data = conn.recv(1 << 20)
                    if not data:
                        return
                    got += len(data)
                conn.sendall(b"k")
                return
            conn.sendall(first)
            while data := conn.recv(1 << 16):
                conn.sendall(data)

    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def one(command: list[str], port: int, total: int) -> dict[str, float]:
    """``command``'s relay: round trips, then the bulk transfer."""
    relay = subprocess.Popen(command, stdout=subprocess.PIPE)
    try:
        assert relay.stdout is not None and relay.stdout.readline().strip() == b"ready", "the relay did not start"
        with socket.create_connection(("127.0.0.2", port), timeout=30) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            trips = []
            for _ in range(220):
                t = time.perf_counter()
                c.sendall(b"x" * 100)
                got = 0
                while got < 100:
                    data = c.recv(4096)
                    assert data, "the relay closed the connection"
                    got += len(data)
                trips.append(time.perf_counter() - t)
        with socket.create_connection(("127.0.0.2", port), timeout=120) as b:
            blob = b"y" * (256 << 10)
            cpu, t = _cpu_s(relay.pid), time.perf_counter()
            b.sendall(BULK + blob[1:])
            sent = len(blob)
            while sent < total:
                b.sendall(blob)
                sent += len(blob)
            assert b.recv(1) == b"k", "the bulk transfer was not counted whole"
            seconds = time.perf_counter() - t
            cpu = _cpu_s(relay.pid) - cpu
        return {"round_trip_ms": 1e3 * statistics.median(trips[20:]), "mbit_s": 8 * sent / seconds / 1e6,
                "relay_core": cpu / seconds}
    finally:
        relay.kill()
        relay.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--holds", nargs="+", type=float, default=[0.0, 0.025, 0.5, 5.0], help="one-way holds, ms")
    ap.add_argument("--rate-mbit", type=float, default=1000.0)
    ap.add_argument("--mb", type=int, default=100, help="MB of the bulk transfer")
    args = ap.parse_args()
    total = args.mb << 20
    port = free_port()
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(16)
        threading.Thread(target=_echo, args=(listener, total), daemon=True).start()
        print("| relay | one-way hold ms | round trip ms (median) | bulk Mbit/s | relay's CPU, share of a core |")
        print("|---|---|---|---|---|")
        for kind in ("c", "python"):
            if kind == "c" and is_python(relay_command(0.0, 0.0, [], kind)):
                print("| delayrelay.c | not built: no C compiler | | | |")
                continue
            name = "delayproxy.py" if kind == "python" else "delayrelay.c"
            for hold in args.holds:
                r = one(relay_command(hold, args.rate_mbit, [f"127.0.0.2:{port}=127.0.0.1:{port}"], kind), port, total)
                print(f"| {name} | {hold} | {r['round_trip_ms']:.3f} | {r['mbit_s']:.0f} | "
                      f"{100 * r['relay_core']:.0f} % |", flush=True)


if __name__ == "__main__":
    main()
