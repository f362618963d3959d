"""A function's run on a ``LocalCluster``'s worker processes, through each worker's two
control pipes: the function goes down one (``ActiveRun.send``), its result or its
traceback comes up the other, and a worker that joins while the run goes on is sent it
too (``ActiveRun.wake``).  ``collect`` waits for every worker's answer, or its death
(an EOF on its pipe, or a pipe broken before it was sent anything), within the run's
deadline; ``reap`` closes a dead worker's pipes, so that later runs skip it.

What a run's outcome means (strict or elastic) is ``cluster/runs.py``'s, for every
launcher; how a node's process starts and ends is ``cluster/process.py``'s.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

import cloudpickle

from paramserver.cluster.process import NodeProcess
from paramserver.cluster.runs import Tally
from paramserver.errors import WorkerError

logger = logging.getLogger(__name__)


@dataclass
class ActiveRun:
    """The function ``run`` is running: workers added meanwhile are sent it too."""

    payload: bytes
    call: int  # this run's number: a reply tagged with another is late, from a run given up on
    wake: Connection  # written to when a worker joins, so the waiting loop looks again
    waiting: dict[Connection, NodeProcess] = field(default_factory=dict)
    died: list[NodeProcess] = field(default_factory=list)  # could not even be sent the function

    def send(self, proc: NodeProcess, joined: bool = False) -> None:
        """Send the function to ``proc`` (under the cluster's lock); ``joined``: it joins the
        run midway, which its first byte says (``Client.joined_midway``)."""
        assert proc.to_child is not None and proc.from_child is not None
        try:
            proc.to_child.send_bytes((b"J" if joined else b"-") + self.payload)
            self.waiting[proc.from_child] = proc
        except OSError:  # it is dead already (a broken pipe)
            self.died.append(proc)


def collect(active: ActiveRun, lock: threading.Lock, wake: Connection, timeout_s: float | None,
            died: Callable[[NodeProcess, Tally], None]) -> Tally:
    """Every worker's answer to ``active`` (``wake``: the other end of ``active.wake``), until
    none is left to wait for or one raised (the others may wait on it for ever); ``died``
    records a worker whose pipe ended.  ``WorkerError`` names those still out at the deadline."""
    tally = Tally()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        with lock:
            dead, active.died = active.died, []
            waiting = dict(active.waiting)
        for proc in dead:
            died(proc, tally)
        if not waiting:
            return tally
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait([*waiting, wake], timeout=left)
        if not ready:
            raise WorkerError(f"{sorted(p.name for p in waiting.values())} did not finish within {timeout_s} s")
        for conn in ready:
            if conn is wake:
                wake.recv_bytes()
                continue
            _answer(active, lock, conn, tally, died)  # type: ignore[arg-type]
        if tally.raised:
            return tally


def _answer(active: ActiveRun, lock: threading.Lock, conn: Connection, tally: Tally,
            died: Callable[[NodeProcess, Tally], None]) -> None:
    """What came up ``conn``: a result, an error, or its end (the worker died)."""
    with lock:
        proc = active.waiting.pop(conn)
    try:
        call, status, rank, value = cloudpickle.loads(conn.recv_bytes())
    except EOFError:
        died(proc, tally)
        return
    if call != active.call:  # the late reply of a run that timed out: not ours
        logger.info("%s: dropped a late result of an earlier run", proc.name)
        with lock:
            active.waiting[conn] = proc
        return
    tally.answered(proc.name, status, rank, value)


def reap(proc: NodeProcess, tally: Tally, lock: threading.Lock) -> None:
    """``proc`` died during a run: its exit code and log's tail in ``tally``, its pipes closed
    (later runs skip it)."""
    try:
        proc.popen.wait(5)
    except subprocess.TimeoutExpired:
        pass
    tally.died(f"{proc.name} died (exit code {proc.popen.returncode})", proc.tail())
    with lock:
        for conn in (proc.to_child, proc.from_child):
            if conn is not None:
                conn.close()
        proc.to_child = proc.from_child = None
