"""The processes a benchmark starts: each in a session of its own with its stderr in a log
file, all stopped in ``finally`` (SIGTERM to the process group, a bounded wait, then SIGKILL);
waiting on a condition (never a bare sleep), a command that must finish, free ports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

PS = [sys.executable, "-m", "paramserver"]


def log(msg: str) -> None:
    """A progress line on stderr, with the time."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Procs:
    """Every process this script starts, each in its own session; ``stop_all`` in finally."""

    def __init__(self, logs: str) -> None:
        self.procs: list[subprocess.Popen] = []
        self.logs = logs  # each process's stderr goes to a file here (a pipe nobody reads could fill)
        os.makedirs(logs, exist_ok=True)

    def start(self, argv: list[str], env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen:
        kw.setdefault("stdout", subprocess.DEVNULL)
        name = os.path.basename(argv[0]) if argv[0] != sys.executable else argv[3]
        path = os.path.join(self.logs, f"{len(self.procs):03d}-{name}.log")
        with open(path, "wb") as err:
            proc = subprocess.Popen(argv, env=env, start_new_session=True, stderr=err, **kw)
        proc.log_path = path  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
        """SIGTERM to its process group, a bounded wait, then SIGKILL of the group."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # what is left of its group (nodes it forked)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.stdout is not None:
            with contextlib.suppress(Exception):
                proc.stdout.close()

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(Exception):
                self.stop(proc, grace=10.0)
        self.procs.clear()


def stop(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """Wait for each process to end (they were told to), killing one that does not."""
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def wait_for(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.02,
             proc: subprocess.Popen | None = None) -> Any:
    """Poll ``cond()`` until true (bounded); fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the process exited ({proc.returncode}) while waiting for {what}: "
                               f"{tail(proc)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
    return value


def tail(proc: subprocess.Popen) -> str:
    """The end of a process's stderr (its log file, for a process ``Procs`` started)."""
    with contextlib.suppress(Exception), open(proc.log_path, "rb") as f:  # type: ignore[attr-defined]
        return f.read()[-3000:].decode(errors="replace")
    return ""


def finish(proc: subprocess.Popen, timeout: float, what: str) -> None:
    """Wait for a command that ends on its own; its stderr's tail if it failed."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        Procs.stop(proc)
        raise TimeoutError(f"{what} did not finish in {timeout:g} s") from None
    if proc.returncode:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {tail(proc)}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """True once something accepts connections on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def env_with(*paths: str) -> dict[str, str]:
    """This environment with ``paths`` first on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
