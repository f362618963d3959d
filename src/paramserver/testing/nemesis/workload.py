"""The counters a nemesis run checks: a real client that adds 1 to every key of a replicas-2 and a
replicas-3 table, one acknowledged push after another, and writes each push's outcome.

    python -m paramserver.testing.nemesis.workload tcp://SCHEDULER:PORT FOLDER

It writes ``FOLDER/acks.jsonl``, a line a push: ``{"t": monotonic seconds, "table": ..., "ok": true}``
for an acknowledged add, ``"ok": false`` with ``"why"`` for one whose fate is unknown (an error or
no answer within ``WAIT_S``: it may still be applied, once).  A client that was closed (declared
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

N_KEYS = 512
KEYS = np.arange(N_KEYS, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # over every vnode
TABLES = {"c2": 2, "c3": 3}
WAIT_S = 30.0  # an add unanswered this long is a hang (the check reports it)
CONNECT_S = 60.0


def _client(scheduler: str) -> Any:
    from paramserver.client.client import Client

    return Client(scheduler, connect_timeout_s=CONNECT_S)


def _push_all(client: Any, grads: np.ndarray, log: IO[str]) -> bool:
    """One add to each table; False once the client is closed (a new one is needed)."""
    from paramserver.errors import ClosedError, ParamServerError

    for table in TABLES:
        started = time.monotonic()
        try:
            client.push(table, KEYS, grads).result(timeout=WAIT_S)
            line: dict[str, Any] = {"t": time.monotonic(), "table": table, "ok": True}
        except FutureTimeout:
            line = {"t": time.monotonic(), "table": table, "ok": False, "why": f"no answer in {WAIT_S:.0f} s"}
        except ParamServerError as e:
            line = {"t": time.monotonic(), "table": table, "ok": False, "why": f"{type(e).__name__}: {e}"[:300]}
            if isinstance(e, ClosedError) or getattr(client, "closed", False):
                log.write(json.dumps({**line, "wait": round(line["t"] - started, 3)}) + "\n")
                return False
        log.write(json.dumps({**line, "wait": round(line["t"] - started, 3)}) + "\n")
        log.flush()
    return True


def run(scheduler: str, folder: str, stop: Callable[[], bool]) -> None:
    grads = -np.ones((N_KEYS, 1), np.float32)  # SGD at lr 1: +1 a push
    client = _client(scheduler)
    for table, replicas in TABLES.items():
        client.create_table(table, dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=replicas)
    with open(os.path.join(folder, "acks.jsonl"), "a") as log:
        while not stop():
            if not _push_all(client, grads, log):
                client.close()
                client = _reconnect(scheduler, stop, log)
                if client is None:
                    return
    client.close()


def _reconnect(scheduler: str, stop: Callable[[], bool], log: IO[str]) -> Any:
    from paramserver.errors import ParamServerError

    while not stop():
        try:
            return _client(scheduler)
        except ParamServerError as e:
            log.write(json.dumps({"t": time.monotonic(), "event": f"reconnect failed: {e}"[:300]}) + "\n")
            log.flush()
    return None


def read_back(scheduler: str) -> dict[str, list[float]]:
    """Every key's value, per table, from a new client."""
    client = _client(scheduler)
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
