"""``LocalCluster.stop``: the workers leave while the scheduler and the servers still
answer, then the rest is stopped (a worker whose last messages found its peers gone held
its exit until its sockets' linger ran out: up to 0.4 s of every command's end)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from paramserver.cluster import local
from paramserver.cluster.local import LocalCluster
from paramserver.cluster.process import NodeProcess

#: a stand-in worker: it reads its control pipe until EOF, then takes ``argv[2]`` s to exit
WORKER = "import os, sys, time\nwhile os.read(int(sys.argv[1]), 1): pass\ntime.sleep(float(sys.argv[2]))\n"


Asked = list[tuple[int | None, float]]  # the worker's exit code when the scheduler was asked, and when


class _Admin:
    def __init__(self, worker: subprocess.Popen[bytes], asked: Asked):
        self.worker, self.asked = worker, asked

    def shutdown_cluster(self) -> None:
        self.asked.append((self.worker.poll(), time.monotonic()))


class _Driver:
    def __init__(self, admin: _Admin):
        self.admin = admin

    def close(self) -> None:
        pass


def _stopped(monkeypatch: Any, leaves_after_s: float, leave_s: float, stop_s: float = 10.0) -> tuple[Asked, float]:
    """Stop a cluster of one stand-in worker; what the scheduler saw when asked to shut
    down (the worker's exit code then, and when), and when ``stop`` began."""
    monkeypatch.setattr(local, "WORKERS_LEAVE_S", leave_s)
    down_r, down_w = os.pipe()
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(down_r), str(leaves_after_s)], pass_fds=(down_r,))
    os.close(down_r)
    asked: Asked = []
    cluster = LocalCluster(servers=1, workers=1)
    control = Connection(down_w, readable=False)
    cluster.procs = {"worker-0": NodeProcess("worker-0", worker, os.devnull, to_child=control)}
    monkeypatch.setattr(cluster, "_client", _Driver(_Admin(worker, asked)))
    began = time.monotonic()
    try:
        cluster.stop(timeout_s=stop_s)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(5)
    return asked, began


def test_the_workers_have_left_before_the_cluster_is_asked_to_shut_down(monkeypatch):
    asked, _ = _stopped(monkeypatch, leaves_after_s=0.2, leave_s=10.0)
    assert [code for code, _ in asked] == [0], "the scheduler was asked to stop while the worker was still leaving"


def test_a_worker_that_does_not_leave_delays_the_stop_by_the_bound_only(monkeypatch):
    asked, began = _stopped(monkeypatch, leaves_after_s=30.0, leave_s=0.3, stop_s=1.0)
    assert [code for code, _ in asked] == [None], "the worker should still have been running"
    assert 0.3 <= asked[0][1] - began < 3.0, "the wait for the workers is bounded by WORKERS_LEAVE_S"
