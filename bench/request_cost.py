"""What one request costs, apart from its keys: a 1-key pull through ``Client.pull``
against the same pull's frames sent to the same server from the calling thread on a
DEALER of its own, and a bare pyzmq echo between two processes (loopback TCP, as the
cluster's links are); and a training worker's step, a push and the next pull as one
envelope (``together``), of 1 key each and of ``--keys`` each (a default ``train`` batch has
~5 000 distinct keys), timed to the pull's answer.

Run: ``.venv/bin/python bench/request_cost.py [--n 5000] [--keys 5000]``

The frames are the ones ``Client.pull`` sends (kept by wrapping ``ZmqSocket.try_send`` for
one call), so the server does the same work both ways; what differs is the client's
machinery: routing, the future, and the answer's way back through the I/O thread (the
request itself goes from the calling thread when the sockets are free; on an idle machine
the I/O thread would have woken at once, so this does not show what that saves).  Each line
gives the round trip and the CPU this process spent a request (all its threads,
``/proc/self/stat``), medians of ``--repeat`` runs of ``--n`` requests.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from bench_harness.procs import free_port
from paramserver import LocalCluster
from paramserver.wire import transport


def cpu_s() -> float:
    fields = open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn: Callable[[], Any], n: int, repeat: int) -> tuple[float, float]:
    """Median µs a call and µs of this process's CPU a call."""
    for _ in range(100):
        fn()
    walls, cpus = [], []
    for _ in range(repeat):
        c0, t0 = cpu_s(), time.perf_counter()
        for _ in range(n):
            fn()
        walls.append((time.perf_counter() - t0) / n * 1e6)
        cpus.append((cpu_s() - c0) / n * 1e6)
    return statistics.median(walls), statistics.median(cpus)


def _echo(address: str, ready: Any) -> None:
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(address)
    ready.set()
    while (frames := sock.recv_multipart())[-1] != b"stop":
        sock.send_multipart(frames)


def bare_echo(n: int, repeat: int) -> tuple[float, float]:
    """A pyzmq DEALER -> ROUTER echo of one small frame over loopback TCP, the other side a
    process of its own."""
    address = f"tcp://127.0.0.1:{free_port()}"
    ready = multiprocessing.get_context("fork").Event()
    echo = multiprocessing.get_context("fork").Process(target=_echo, args=(address, ready), daemon=True)
    echo.start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        if not ready.wait(10):
            raise SystemExit("the echo process did not start within 10 s")
        sock.connect(address)
        return timed(lambda: (sock.send(b"x"), sock.recv()), n, repeat)
    finally:
        sock.send(b"stop")
        echo.join(5)
        if echo.is_alive():
            echo.kill()
        sock.close(0)


def train_step(client: Any, k: int) -> Callable[[], Any]:
    """What a training worker sends a batch: a push of ``k`` distinct keys and the next
    batch's pull of ``k`` others as one envelope (``together``), then the wait for that pull."""
    rng = np.random.default_rng(k)
    batches = [np.unique(rng.integers(1, 1 << 40, k).astype(np.uint64)) for _ in range(8)]
    grads = np.full((k, 1), 0.01, np.float32)
    turn = [0]

    def step() -> Any:
        i = turn[0] = turn[0] + 1
        pushed, pulled = batches[i % 8], batches[(i + 1) % 8]
        with client.together():
            client.push("cost", pushed, grads[:pushed.size], distinct=True)
            rows = client.pull("cost", pulled)
        return rows.result(timeout=60)

    return step


def through_client_and_raw(n: int, repeat: int, n_keys: int) -> dict[str, tuple[float, float]]:
    kept: list[tuple[str, list[bytes]]] = []
    original = transport.ZmqSocket.try_send

    def keep(self: transport.ZmqSocket, frames: Any) -> bool:
        kept.append((self.raw.getsockopt_string(zmq.LAST_ENDPOINT), [bytes(f) for f in frames]))
        return original(self, frames)

    with LocalCluster(servers=1, workers=0, log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("cost", dim=1, optimizer="sgd")
        keys = np.arange(1, 2, dtype=np.uint64)
        transport.ZmqSocket.try_send = keep  # type: ignore[method-assign]
        try:
            client.pull("cost", keys).result(timeout=60)
        finally:
            transport.ZmqSocket.try_send = original  # type: ignore[method-assign]
        endpoint, frames = next(k for k in reversed(kept) if b"pull" in k[1][0])
        out = {"Client.pull": timed(lambda: client.pull("cost", keys).result(timeout=60), n, repeat)}
        for k in (1, n_keys):
            out[f"push+pull, {k:,} keys each"] = timed(train_step(client, k), max(200, n // 4), repeat)
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.connect(endpoint)
        try:
            out["its frames, calling thread"] = timed(lambda: (sock.send_multipart(frames), sock.recv_multipart()),
                                                      n, repeat)
        finally:
            sock.close(0)
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5000, help="requests a run")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each, the median reported")
    ap.add_argument("--keys", type=int, default=5000, help="keys of the bigger push+pull (a default train batch's)")
    args = ap.parse_args(argv)
    rows = {"bare pyzmq echo": bare_echo(args.n, args.repeat),
            **through_client_and_raw(args.n, args.repeat, args.keys)}
    for name, (wall, cpu) in rows.items():
        print(f"{name:<30} {wall:7.0f} µs a round trip  {cpu:6.0f} µs of this process's CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
