"""The stream side of ``bench/online.py``: a ``redis-server`` of its own (a free port, no
persistence, its data in the run's temporary folder), rows XADDed to it pipelined, or at a
steady rate by a thread (the busy and recovery runs' streams), and a command's report.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from bench_harness.procs import Procs, free_port, log, wait_for


@contextlib.contextmanager
def redis_server(tmp: str, procs: Procs) -> Iterator[tuple[str, Any]]:
    import redis

    port = free_port()
    folder = os.path.join(tmp, "redis")
    os.makedirs(folder, exist_ok=True)
    proc = procs.start(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                        "no", "--dir", folder])
    client = redis.Redis(port=port)

    def up() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(up, 20, "redis-server to answer", proc=proc)
        log(f"redis-server on port {port}")
        yield f"redis://127.0.0.1:{port}", client
    finally:
        client.close()
        procs.stop(proc)


def read_lines(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        return f.read().splitlines()


def feed(client: Any, stream: str, lines: list[bytes], chunk: int = 2000) -> float:
    """XADD every line (field ``line``), pipelined; seconds taken."""
    t0 = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for i in range(0, len(lines), chunk):
        for row in lines[i:i + chunk]:
            pipe.xadd(stream, {"line": row})
        pipe.execute()
    return time.perf_counter() - t0


def read_report(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


class RateFeeder(threading.Thread):
    """XADDs ``lines`` round and round at ``rate`` rows/s until stopped (the busy runs' stream)."""

    def __init__(self, client: Any, stream: str, lines: list[bytes], rate: float, limit: int | None = None) -> None:
        super().__init__(daemon=True, name="bench-feeder")
        self.client, self.stream, self.lines, self.rate, self.limit = client, stream, lines, rate, limit
        self.halt = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            t0 = time.monotonic()
            while not self.halt.is_set():
                due = int(self.rate * (time.monotonic() - t0))
                n = min(due - self.sent, 5000)
                if self.limit is not None:
                    n = min(n, self.limit - self.sent)
                    if n <= 0 and self.sent >= self.limit:
                        return
                for k in range(n):
                    pipe.xadd(self.stream, {"line": self.lines[(self.sent + k) % len(self.lines)]})
                if n > 0:
                    pipe.execute()
                    self.sent += n
                self.halt.wait(0.02)
        except BaseException as exc:  # noqa: BLE001 -- reported by the section
            self.error = exc
