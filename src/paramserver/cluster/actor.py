"""The Ray actor behind every node of a ``RayCluster`` (``paramserver.cluster.ray``).

It runs the node command a user would type (``python -m paramserver server ...``) as its
child process, so that the node's hot path shares its interpreter with none of Ray's
threads.  The child's exit, unless asked for, ends the actor, so that Ray restarts it with
a new node; the actor's death ends the child (``--parent-pid``).  A worker's functions
arrive through Ray and go to the child over a pipe, as ``LocalCluster`` sends them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import ray

from paramserver.cluster.process import tail_log
from paramserver.errors import ConnectError


class NodeActor:
    """A Ray actor that runs one node of the cluster as its child process.

    The child's exit, unless asked for, ends the actor (so Ray restarts it, with a new
    node); the actor's death ends the child (its ``--parent-pid`` watch)."""

    def __init__(self, name: str, role: str, args: list[str], env: dict[str, str], log_path: str,
                 niceness: int | None):
        self.name, self.role = name, role
        self.ip = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        self.log_path = log_path
        self.port = 0
        self.address_file = ""
        argv = [sys.executable, "-m", "paramserver", role, *args, "--parent-pid", str(os.getpid())]
        if role == "scheduler":
            self.address_file = f"{log_path}.addr"
            if os.path.exists(self.address_file):
                os.remove(self.address_file)
            argv += ["--host", self.ip, "--address-file", self.address_file]
        elif role == "server":  # its port chosen here, so its address is known (scale-down finds it by that)
            self.port = _free_port(self.ip)
            argv += ["--host", self.ip, "--port", str(self.port)]
        fds: tuple[int, ...] = ()
        self.down: Connection | None = None
        self.up: Connection | None = None
        if role == "worker":
            down_r, down_w = os.pipe()
            up_r, up_w = os.pipe()
            argv += ["--control-fds", f"{down_r},{up_w}"]
            fds = (down_r, up_w)
            self.down, self.up = Connection(down_w, readable=False), Connection(up_r, writable=False)
        self.stopping = False
        self.run_lock = threading.Lock()  # one function at a time through the pipe
        with open(log_path, "ab") as log:
            log.write(f"--- {name} starting on {self.ip}, actor pid {os.getpid()}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, pass_fds=fds, start_new_session=True,
                                          preexec_fn=None if niceness is None else lambda: _renice(niceness))
        for fd in fds:
            os.close(fd)
        threading.Thread(target=self._watch, name="paramserver-node-watch", daemon=True).start()

    def _watch(self) -> None:
        code = self.popen.wait()
        if not self.stopping:  # it died: so does this actor, and Ray brings back a fresh node
            with open(self.log_path, "ab") as log:
                log.write(f"--- {self.name} exited with code {code}: its actor ends\n".encode())
            os._exit(1)

    def info(self) -> dict[str, Any]:
        """Where it runs: the machine's IP, the node's pid and (a server's) address."""
        return {"ip": self.ip, "pid": self.popen.pid, "actor_pid": os.getpid(),
                "address": f"tcp://{self.ip}:{self.port}" if self.port else ""}

    def address(self, timeout_s: float) -> str:
        """The scheduler's: the address its node bound, once it listens."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(self.address_file):
                with open(self.address_file) as f:
                    return f.read().strip()
            if self.popen.poll() is not None:
                raise ConnectError(f"the scheduler exited with code {self.popen.returncode}:\n{self.tail()}")
            time.sleep(0.02)  # polling a file the child writes atomically; bounded above
        raise ConnectError(f"the scheduler did not report its address within {timeout_s:g} s:\n{self.tail()}")

    def run(self, payload: bytes) -> bytes | None:
        """A worker's: send one ``(call, fn, args)`` payload to the node, return its answer
        (``None``: the node died first)."""
        assert self.down is not None and self.up is not None
        with self.run_lock:
            try:
                self.down.send_bytes(payload)
                return self.up.recv_bytes()
            except (EOFError, OSError):
                return None

    def wait_exit(self) -> int:
        """Returns once the node process has exited (the scheduler actor's death watch)."""
        return self.popen.wait()

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the node process (``RayCluster.kill``); its exit, unless asked
        for, ends this actor."""
        self.popen.send_signal(sig)

    def tail(self, lines: int = 25) -> str:
        return tail_log(self.log_path, lines)

    def prepare_stop(self) -> None:
        """From now on the node's exit is asked for: no restart; a worker's pipe is closed
        (it finishes and leaves)."""
        self.stopping = True
        if self.down is not None:
            self.down.close()

    def stop(self, timeout_s: float, keep_logs: bool) -> int | None:
        self.prepare_stop()
        for step in ("wait", "terminate", "kill"):
            if step != "wait":
                getattr(self.popen, step)()
            try:
                self.popen.wait(timeout_s if step == "wait" else 5)
                break
            except subprocess.TimeoutExpired:
                continue
        if not keep_logs:
            for path in (self.log_path, self.address_file):
                if path and os.path.exists(path):
                    os.remove(path)
            try:
                os.rmdir(os.path.dirname(self.log_path))
            except OSError:
                pass  # another node's log is still there, or logs are kept
        return self.popen.poll()


def _renice(niceness: int) -> None:
    """In a node's process before it runs: Ray runs its workers at nice 15 (below its own
    daemons), and a node would inherit that; back to ``niceness`` where the OS allows."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except OSError:
        pass  # no CAP_SYS_NICE: it runs at Ray's worker niceness (RAY_worker_niceness at `ray start`)


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])
