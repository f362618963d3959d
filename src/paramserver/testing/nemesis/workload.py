"""The counters a nemesis run checks: a real client that adds 1 to every key of a replicas-2 and a
replicas-3 table, one acknowledged push after another, and writes each push's outcome.

    python -m paramserver.testing.nemesis.workload tcp://SCHEDULER:PORT FOLDER

It writes ``FOLDER/acks.jsonl``, a line a push: ``{"t": monotonic seconds, "table": ..., "ok": true}``
for an acknowledged add, ``"ok": false`` with ``"why"`` for one whose fate is unknown (an error or
no answer within ``WAIT_S``: it may still be applied, once); and after each add a read of every
key, ``{"t", "table", "read": [lowest, highest], "acked": ..., "unknown": ...}``.  A client that was closed (declared
dead while cut off) is replaced by a new one, as a restarted worker would be.  It stops when
``FOLDER/stop`` exists; ``check`` then reads every key back.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import IO, Any

import numpy as np

from paramserver.errors import ClosedError, ParamServerError

N_KEYS = 512
KEYS = np.arange(N_KEYS, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # over every vnode
TABLES = {"c2": 2, "c3": 3}
WAIT_S = 30.0  # an add unanswered this long is a hang (the check reports it)
CONNECT_S = 60.0


def connect(scheduler: str) -> Any:
    """A client of the emulated cluster, patient with a scheduler that is cut off or paused."""
    from paramserver.client.client import Client

    return Client(scheduler, connect_timeout_s=CONNECT_S)


class Counters:
    """The adds and reads of one client, and what it has seen acknowledged so far (over every
    client of the run: a replaced one goes on from the counts of the one before)."""

    def __init__(self, log: IO[str]) -> None:
        self.log = log
        self.acked = dict.fromkeys(TABLES, 0)
        self.unknown = dict.fromkeys(TABLES, 0)
        self.grads = -np.ones((N_KEYS, 1), np.float32)  # SGD at lr 1: +1 a push

    def write(self, line: dict[str, Any]) -> None:
        self.log.write(json.dumps(line) + "\n")
        self.log.flush()

    def step(self, client: Any) -> bool:
        """One add to each table, then a read of it; False once the client is closed."""
        for table in TABLES:
            if not self._add(client, table) or not self._read(client, table):
                return False
        return True

    def _add(self, client: Any, table: str) -> bool:
        started, closed = time.monotonic(), False
        try:
            client.push(table, KEYS, self.grads).result(timeout=WAIT_S)
            line: dict[str, Any] = {"table": table, "ok": True}
            self.acked[table] += 1
        except (FutureTimeout, ParamServerError) as e:
            why = f"no answer in {WAIT_S:.0f} s" if isinstance(e, FutureTimeout) else f"{type(e).__name__}: {e}"
            line = {"table": table, "ok": False, "why": why[:300]}
            self.unknown[table] += 1
            closed = isinstance(e, ClosedError)
        now = time.monotonic()
        self.write({"t": now, **line, "wait": round(now - started, 3)})
        return not closed

    def _read(self, client: Any, table: str) -> bool:
        """Every key read back: it must hold at least the adds acknowledged before the read, and no
        more than those and the unknown ones (``check.reads``)."""
        started = time.monotonic()
        try:
            values = client.pull(table, KEYS).result(timeout=WAIT_S)[:, 0]
        except (FutureTimeout, ParamServerError) as e:
            self.write({"t": time.monotonic(), "table": table, "read_failed": f"{type(e).__name__}: {e}"[:300]})
            return not isinstance(e, ClosedError)
        self.write({"t": time.monotonic(), "table": table, "read": [float(values.min()), float(values.max())],
                    "acked": self.acked[table], "unknown": self.unknown[table],
                    "wait": round(time.monotonic() - started, 3)})
        return True


def run(scheduler: str, folder: str, stop: Callable[[], bool]) -> None:
    client = connect(scheduler)
    for table, replicas in TABLES.items():
        client.create_table(table, dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=replicas)
    with open(os.path.join(folder, "acks.jsonl"), "a") as log:
        counters = Counters(log)
        while not stop():
            if not counters.step(client):
                client.close()
                client = _reconnect(scheduler, stop, log)
                if client is None:
                    return
    client.close()


def _reconnect(scheduler: str, stop: Callable[[], bool], log: IO[str]) -> Any:
    while not stop():
        try:
            return connect(scheduler)
        except ParamServerError as e:
            log.write(json.dumps({"t": time.monotonic(), "event": f"reconnect failed: {e}"[:300]}) + "\n")
            log.flush()
    return None


def read_back(scheduler: str) -> dict[str, list[float]]:
    """Every key's value, per table, from a new client."""
    client = connect(scheduler)
    try:
        return {t: client.pull(t, KEYS).result(timeout=WAIT_S)[:, 0].tolist() for t in TABLES}
    finally:
        client.close()


def main(argv: list[str]) -> int:
    scheduler, folder = argv[0], argv[1]
    if len(argv) > 2 and argv[2] == "--read":
        with open(os.path.join(folder, "values.json"), "w") as f:
            json.dump(read_back(scheduler), f)
        return 0
    run(scheduler, folder, lambda: os.path.exists(os.path.join(folder, "stop")))
    return 0


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s workload %(levelname)s %(message)s")
    sys.exit(main(sys.argv[1:]))
