"""One node of a ``LocalCluster`` as an operating-system process: started, logged, ended.

A node runs the command a user would type (``paramserver server --scheduler ...``), its
output in its own log file, in a session of its own (a Ctrl-C at the driver's terminal is
the driver's to handle).  It starts in one of two ways: forked from the driver while the
driver has one thread (milliseconds, with numpy, numba and the kernels already loaded),
else as a fresh interpreter (``subprocess``).  Either way the cluster holds the same
``NodeProcess``; it ends its nodes with ``end_all`` (asked, then SIGTERM, then SIGKILL),
and a node ends itself once the driver is gone (``exit_with_parent``, ``--parent-pid``).
Kept apart from the cluster's lifecycle (``cluster/local.py``) because this is about one
process and the operating system, not about what a cluster of them does.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from paramserver._runtime.proctitle import prepare as prepare_title
from paramserver._runtime.warm import inherited as warm_inherited
from paramserver.errors import ConfigError
from paramserver.store.memory import available_memory
from paramserver.wire.ending import deliver_queued

logger = logging.getLogger(__name__)
#: the node command a forked child runs: ``paramserver``'s entry point, handed in from above
#: (``use_command``; the command line is the layer above every launcher, which must not name it)
_node_command: Callable[[list[str]], int] | None = None


def use_command(main: Callable[[list[str]], int]) -> None:
    """Set the command a forked node runs with its arguments (``paramserver server ...``):
    the package hands in its command line's ``main`` when it loads."""
    global _node_command
    _node_command = main


class Forked:
    """A forked node: the part of ``subprocess.Popen``'s interface ``LocalCluster`` uses."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        try:
            self._exit_fd: int | None = os.pidfd_open(pid)  # readable once the process exits
        except (AttributeError, OSError):
            self._exit_fd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                if self._exit_fd is not None:
                    os.close(self._exit_fd)
                    self._exit_fd = None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            if self._exit_fd is not None:
                select.select([self._exit_fd], [], [], left)  # wakes when it exits
            else:
                time.sleep(min(0.01, left) if left is not None else 0.01)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


@dataclass
class NodeProcess:
    """A node the cluster started: its process, its log and (a worker's) control pipe."""

    name: str
    popen: subprocess.Popen[bytes] | Forked
    log_path: str
    to_child: Connection | None = None
    from_child: Connection | None = None

    def tail(self, lines: int = 25) -> str:
        return tail_log(self.log_path, lines)


def tail_log(path: str, lines: int = 25) -> str:
    """The last ``lines`` of a node's log (``""`` when it cannot be read): what an error about
    the node quotes."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def fork_safe() -> bool:
    """Whether a child forked now is sound: this process has no other thread (a fork copies
    the calling thread alone, and a lock another thread held would stay locked in the child
    forever), and has not loaded torch."""
    # torch's OpenMP pool is not fork-safe: a child of a process that has run a parallel torch
    # op hangs in its first one (its pool's threads are gone, its state says they are there)
    return threading.active_count() == 1 and hasattr(os, "fork") and "torch" not in sys.modules


def limit_memory(memory_limit_mb: int | None) -> None:
    """In a node's process, before it runs: cap its data (``RLIMIT_DATA``: heap and private
    mappings, not the libraries' code) at ``memory_limit_mb``."""
    if memory_limit_mb is not None:  # resource is imported already: no import lock in a child
        limit = memory_limit_mb << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def spawn_node(name: str, args: list[str], log_path: str, env: dict[str, str], pass_fds: tuple[int, ...],
               memory_limit_mb: int | None) -> NodeProcess:
    """Run ``python -m paramserver ARGS`` as a fresh interpreter, its output in ``log_path``."""
    with open(log_path, "ab") as log:
        popen = subprocess.Popen([sys.executable, "-m", "paramserver", *args, "--parent-pid", str(os.getpid())],
                                 env=env,
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 pass_fds=pass_fds, start_new_session=True,
                                 preexec_fn=functools.partial(limit_memory, memory_limit_mb))
    return NodeProcess(name, popen, log_path)


def fork_node(name: str, args: list[str], log_path: str, env: dict[str, str], pass_fds: tuple[int, ...],
              memory_limit_mb: int | None, warmed: bool,
              prepare: Callable[[list[str]], list[str]] | None = None) -> NodeProcess:
    """Run ``paramserver ARGS`` in a child forked from this process (only while
    ``fork_safe``).  The child gets a new session, the log file as stdout and stderr, the
    nodes' environment, and no file descriptor of ours but ``pass_fds`` (a worker must not
    hold another worker's control pipe); ``warmed``: it skips the warm-up it inherited;
    ``prepare``: run in the child before the command, given the command's arguments and
    returning them: its own warm-up (the command then skips its own), and what it learns
    only then (a server forked before its scheduler listens: the scheduler's address)."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        _be_the_node(log_fd, [*args, "--parent-pid", str(parent)], env, pass_fds, memory_limit_mb, warmed, prepare)
    os.close(log_fd)
    return NodeProcess(name, Forked(pid), log_path)


def _be_the_node(log_fd: int, argv: list[str], env: dict[str, str], pass_fds: tuple[int, ...],
                 memory_limit_mb: int | None, warmed: bool, prepare: Callable[[list[str]], list[str]] | None
                 ) -> NoReturn:
    """The forked child: become the node, run its command, exit with its code; never returns."""
    code: Any = 1
    try:
        prepare_title()  # before the environment changes (os.environ.update below)
        limit_memory(memory_limit_mb)
        os.setsid()
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        # this process's sys.stdout and sys.stderr may not be files 1 and 2 (pytest's capture,
        # a notebook's streams): the node's prints and logs go to its log file
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        keep = {0, 1, 2, *pass_fds}
        for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.environ.update(env)
        if prepare is not None:
            argv = prepare(argv)
        if warmed or prepare is not None:
            warm_inherited()
        logging.root.handlers.clear()  # the node configures its own logging
        code = _command()(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        _leave_forked_child(code)


def _command() -> Callable[[list[str]], int]:
    """The ``paramserver`` command's entry point, as handed in by ``use_command`` (a spawned
    node runs it as ``python -m paramserver``)."""
    if _node_command is None:
        raise RuntimeError("no node command: paramserver/__init__.py hands cluster.process its command line "
                           "(use_command); import paramserver before starting a node")
    return _node_command


def _leave_forked_child(code: Any) -> NoReturn:
    """End a forked node without the parent's exit handlers (they would, say, remove the
    parent's temporary folders), but as an interpreter exit would for the node: zmq
    delivers what its sockets still hold (a reply to SHUTDOWN, STOPs), logs are flushed."""
    deliver_queued()  # what its sockets still hold (wire/ending.py)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code if isinstance(code, int) else 1)


def read_when_written(path: str, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> str | None:
    """The text a process writes to ``path`` (atomically: a scheduler's address once it
    listens), once there; None if it is not within ``timeout_s`` or ``alive()`` turns false."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                return f.read().strip()
        if not alive():
            return None
        time.sleep(0.005)  # polling a file the writer renames into place; bounded above
    return None


def wait_all(procs: list[NodeProcess], timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for every process to exit by itself; whether all did."""
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
    return True


def end_all(procs: list[NodeProcess], polite: bool, timeout_s: float) -> None:
    """Wait until every process has exited: ``polite`` (they were asked to stop) for up to
    ``timeout_s``, then after SIGTERM, then after SIGKILL, 5 s each; never longer."""
    deadline = time.monotonic() + timeout_s
    for sig in ((None,) if polite else ()) + (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            if proc.popen.poll() is None and sig is not None:
                proc.popen.send_signal(sig)
        if wait_all(procs, max(0.1, deadline - time.monotonic()) if sig is None else 5):
            break


def exit_with_parent(pid: int, interval_s: float = 0.5) -> None:
    """In a node ``LocalCluster`` started: exit once the process that started it is gone.

    ``stop()`` ends every node, but a parent killed outright (SIGKILL, or SIGTERM to a
    Python driver, which skips ``finally``) cannot; its nodes would live on holding ports
    and tables.  A daemon thread notices the parent is gone (this process was handed to
    another parent) and ends this one.  Polling rather than ``PR_SET_PDEATHSIG``: that
    fires when the *thread* that started the child exits, and Linux only.
    """
    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(interval_s)  # nothing to wait on: a parent's death sends no event here
        logger.error("the process that started this node (pid %d) is gone: exiting", pid)
        logging.shutdown()
        os._exit(3)

    threading.Thread(target=watch, name="paramserver-parent-watch", daemon=True).start()


#: memory a node takes of its own at the least (its private pages, forked from this process:
#: a scheduler's 23 MB idle, a server's 53 MB and a worker's 112-120 MB in the default job)
NODE_BYTES = 32 << 20


def check_room(servers: int, workers: int) -> None:
    """Refuse nodes that this machine's free memory cannot hold, before any starts: 10^5
    workers otherwise fork until the machine is out of memory, the command silent."""
    free = available_memory()
    nodes = servers + workers + 1  # and the scheduler
    if free and nodes * NODE_BYTES > free:
        raise ConfigError(f"{servers:,} server(s) and {workers:,} worker(s) on this machine: each node is a process "
                          f"of {NODE_BYTES >> 20} MiB at the least, {nodes * NODE_BYTES / 2**30:,.1f} GiB together, "
                          f"and {free / 2**30:,.1f} GiB are free; start fewer (--workers, --servers), or run them on "
                          "more machines (--cluster tcp://HOST:PORT)")
