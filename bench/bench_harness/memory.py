"""A command run while the peak memory of its whole process tree is sampled: RSS and PSS
(a JVM or a TF server forks; the tree's sum is the system's footprint), wall seconds, and
whatever it left in its session killed (``bench/seeds.py``; psutil, in the seeds extra).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Run:
    """One command's outcome: wall seconds, peak RSS and PSS of its process tree (bytes)."""

    wall: float = 0.0
    rss: int = 0
    pss: int = 0
    code: int = 0
    out: str = ""
    err: str = ""
    timed_out: bool = False


def tree(proc: Any) -> list[Any]:
    """A psutil process and all its descendants (none if it ended meanwhile)."""
    try:
        return [proc, *proc.children(recursive=True)]
    except Exception:  # noqa: BLE001  (the process ended between two samples)
        return []


def memory(procs: list[Any], pss: bool) -> tuple[int, int]:
    """The RSS and (``pss``) PSS summed over ``procs``, bytes."""
    rss = sh = 0
    for p in procs:
        try:
            if pss:
                full = p.memory_full_info()
                rss += full.rss
                sh += full.pss
            else:
                rss += p.memory_info().rss
        except Exception:  # noqa: BLE001  (gone, or not ours to read)
            continue
    return rss, sh


def measure(cmd: list[str], timeout: float, env: dict[str, str] | None = None, cwd: str | None = None) -> Run:
    """Run ``cmd`` in a session of its own; sample its tree's memory every 50 ms (PSS every
    4th sample: reading smaps costs more); kill the whole session past ``timeout``."""
    import psutil

    run = Run()
    t0 = time.perf_counter()
    with open(os.devnull, "rb") as null:
        proc = subprocess.Popen(cmd, stdin=null, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=cwd, start_new_session=True)
    ps = psutil.Process(proc.pid)
    chunks: dict[str, list[str]] = {"out": [], "err": []}
    readers = [threading.Thread(target=lambda s=s, k=k: chunks[k].extend(iter(s.readline, "")), daemon=True)
               for s, k in ((proc.stdout, "out"), (proc.stderr, "err"))]
    for r in readers:
        r.start()
    tick = 0
    while proc.poll() is None:
        rss, pss = memory(tree(ps), pss=tick % 4 == 0)
        run.rss, run.pss = max(run.rss, rss), max(run.pss, pss)
        tick += 1
        if time.perf_counter() - t0 > timeout:
            run.timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.05)
    run.wall = time.perf_counter() - t0
    for r in readers:
        r.join(5)
    run.code, run.out, run.err = proc.returncode, "".join(chunks["out"]), "".join(chunks["err"])
    reap(proc.pid)
    return run


def reap(pgid: int) -> None:
    """Whatever the command left behind in its session (a JVM, a TF server) is killed."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
