"""``LocalCluster``: a scheduler, servers and workers as real processes on 127.0.0.1.

The embedded default backend.  Every node runs the same command a user would type
(``python -m paramserver scheduler|server|worker ...``): forked from this process when it
has no other thread yet (a child then starts in milliseconds with numpy, numba and the
project already imported), else started as a fresh interpreter; ports are chosen by the
OS; everything started is stopped on exit, by request first, then by signal.
``run`` is strict (a worker that dies fails it); ``run_elastic`` goes on without the
dead, and ``add_worker`` starts a worker that joins a running function.  How one node's
process is forked or spawned, logged and ended is ``cluster/process.py``'s; how a run's
function travels to the workers and their answers back, ``cluster/pipe_runs.py``'s.

Example:
    >>> def train(client):                                         # doctest: +SKIP
    ...     client.push("w", [1, 2], [[1.0], [1.0]]).result()
    ...     return client.rank
    >>> with LocalCluster(servers=2, workers=2) as cluster:          # doctest: +SKIP
    ...     cluster.client.create_table("w", dim=1)
    ...     cluster.run(train)
    [0, 1]
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, Pipe
from typing import Any, Self

from paramserver._runtime import collector
from paramserver._runtime.warm import Warmup, servers_apart
from paramserver.client.client import Client
from paramserver.client.warmup import warm_client
from paramserver.cluster.pipe_runs import ActiveRun, collect, reap
from paramserver.cluster.process import NodeProcess, check_room, end_all, wait_all
from paramserver.cluster.process import exit_with_parent as exit_with_parent  # cli.main's import
from paramserver.cluster.runs import Outcome, RunsFunctions
from paramserver.cluster.starting import NodeStarts
from paramserver.config import load_config
from paramserver.data.reader import DataError
from paramserver.data.warmup import sample_batches
from paramserver.errors import ClosedError, ConfigError, ConnectError, WorkerError
from paramserver.server.warmup import warm_server
from paramserver.wire.security import http_token, load_keys

logger = logging.getLogger(__name__)

#: how long ``stop`` lets the workers leave on their own before it stops the cluster
WORKERS_LEAVE_S = 2.0


class LocalCluster(RunsFunctions):
    """Start a cluster of processes; use as a context manager.

    Args:
        servers: number of server processes.
        workers: number of worker processes that ``run`` sends functions to.
        vnodes_per_server: ring vnodes per server.
        heartbeat_interval_s, heartbeat_timeout_s: failure detection.
        startup_timeout_s: how long to wait for every node to register.
        log_level: level of the nodes' logs (written to ``log_dir``).
        log_dir: where node logs go (default: a temporary folder removed on exit).
        start_method: ``"fork"`` (default: nodes started while this process has no
            other thread, and has not loaded torch, are forked from it, ready in
            milliseconds; later ones, such as ``add_worker``'s, are spawned) or
            ``"spawn"`` (always a fresh interpreter).
        memory_limit_mb: cap every node process's data (``RLIMIT_DATA``) at this many MiB
            (tests that show no process holds a table whole; shared machines).
        http_port: serve the dashboard and the cluster's Prometheus metrics from the
            scheduler on this port of 127.0.0.1 (0: any free one): ``http_url`` says where.
        secret_file: the cluster's keys (``paramserver keygen``): every link, the driver's
            included, is CurveZMQ, authenticated and encrypted (``wire/security.py``).
        warm: what this process loads before it forks the servers, then the workers, which
            then skip their own warm-up (default ``warm.Warmup()``: every kernel of training
            and serving; a job that knows its format and model loads less, ``warm.warm_job``).
        cold_dir: where the servers keep the rows of tables over their memory budget
            (``docs/tiers.md``; default: ``PARAMSERVER_COLD_DIR``, else ``$TMPDIR`` or ``/var/tmp``).
    """

    def __init__(self, servers: int = 1, workers: int = 0, *, vnodes_per_server: int = 64,
                 heartbeat_interval_s: float = 0.5, heartbeat_timeout_s: float = 5.0,
                 startup_timeout_s: float = 60.0, log_level: str = "INFO", log_dir: str | None = None,
                 start_method: str = "fork", memory_limit_mb: int | None = None, http_port: int | None = None,
                 secret_file: str | None = None, warm: Warmup | None = None, cold_dir: str | None = None):
        if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
            raise ValueError(f"servers must be an int >= 1, got {servers!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be an int >= 0, got {workers!r}")
        if start_method not in ("fork", "spawn"):
            raise ValueError(f"start_method must be 'fork' or 'spawn', got {start_method!r}")
        check_room(servers, workers)
        if memory_limit_mb is not None and (isinstance(memory_limit_mb, bool) or not isinstance(memory_limit_mb, int)
                                            or memory_limit_mb < 64):
            raise ValueError(f"memory_limit_mb must be an int >= 64 (or None), got {memory_limit_mb!r}")
        if http_port is not None and (isinstance(http_port, bool) or not isinstance(http_port, int)
                                      or not 0 <= http_port <= 65535):
            raise ValueError(f"http_port must be a port in [0, 65535] (0: any free one) or None, got {http_port!r}")
        secret_file = secret_file or os.environ.get("PARAMSERVER_SECRET_FILE") or None  # the nodes read it too
        keys = load_keys(secret_file) if secret_file else None  # a missing or damaged file: said now
        if keys is not None:
            self._check_keys(keys, secret_file)
        self.secret_file = secret_file or ""
        self.http_token = http_token(keys) if keys is not None else ""  # what http_url asks for
        self.warm = warm
        # how the nodes start (fork or spawn, memory cap): its start_method and memory_limit_mb are read through it
        self._starts = NodeStarts(start_method, memory_limit_mb, self.secret_file, startup_timeout_s)
        self.cold_dir = cold_dir
        self.http_port = http_port
        self.http_url = ""  # the dashboard's, with the cluster's metrics at http_url + "metrics"
        self.n_servers, self.n_workers = servers, workers
        self.vnodes_per_server = vnodes_per_server
        self.heartbeat_interval_s, self.heartbeat_timeout_s = heartbeat_interval_s, heartbeat_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.log_level = log_level
        self._own_dir = log_dir is None
        self._say_where = True  # where kept logs are is logged (not after an error that says it all)
        self.log_dir = log_dir or ""
        self.procs: dict[str, NodeProcess] = {}
        self.address = ""
        self._client: Client | None = None
        self._closed = False
        self._lock = threading.Lock()  # procs and the active run, for add_worker from any thread
        self._active: ActiveRun | None = None
        self._next_worker = 0
        self._calls = 0  # runs started: each run's payload and replies carry its number
        self._workers_before = 0  # workers the scheduler had before this cluster started its own

    @property
    def start_method(self) -> str:
        return self._starts.start_method

    @property
    def memory_limit_mb(self) -> int | None:
        return self._starts.memory_limit_mb

    @property
    def _failed_start(self) -> str:
        return "local cluster did not start"

    def _check_keys(self, keys: Any, secret_file: str | None) -> None:
        if not keys.server_secret:
            raise ConfigError(f"secret_file {secret_file} is a {keys.role} key file: a local cluster runs a "
                              "scheduler and servers, and only the cluster's file (paramserver keygen) has the key "
                              "they serve with")

    # ---- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        # a job that failed, or was interrupted, keeps its nodes' logs, as `--log-dir`'s help
        # promises (the folder the progress line named is still there); where is said when
        # the logs may tell why: not for bad input or a user function's error, whose own
        # message says it all, and is then the one line a user reads
        said = (ConfigError, DataError, WorkerError, ClosedError)
        failed = exc_type is not None and not issubclass(exc_type, ClosedError)
        self._say_where = not failed or not issubclass(exc_type, said)
        self.stop(keep_logs=failed)

    def start(self) -> None:
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
        else:
            self.log_dir = tempfile.mkdtemp(prefix="paramserver-")
        try:
            with collector.paused():  # loading the kernels makes ~100 000 objects: none is collected meanwhile
                self._start_nodes()
            client = self._client or self._driver()
            if self.http_port is not None:
                self.http_url = client.admin.cluster_info().get("http", "")
            if self.n_workers:  # every worker in, so all start at clock 0 and take part from the start
                client.admin.wait_for_workers(self._workers_before + self.n_workers, timeout_s=self.startup_timeout_s)
        except BaseException as exc:
            logs = "\n".join(f"--- {p.name} (exit {p.popen.poll()}):\n{p.tail()}" for p in self.procs.values())
            self.stop()
            if isinstance(exc, (ConnectError, TimeoutError)):
                raise ConnectError(f"{self._failed_start}: {exc}\n{logs}") from exc
            raise

    def _driver(self) -> Client:
        """The driver's client of the cluster at ``address``."""
        self._client = Client(role="driver", config=load_config(
            scheduler=self.address, connect_timeout_s=self.startup_timeout_s, secret_file=self.secret_file or None,
            heartbeat_interval_s=self.heartbeat_interval_s, heartbeat_timeout_s=self.heartbeat_timeout_s))
        return self._client

    def _start_nodes(self) -> None:
        """Fork (or spawn) the scheduler, then the servers once their kernels are loaded here,
        then the workers once theirs are (``warm.Warmup``); where the servers load apart, the
        servers at once, each loading its own (``cluster/starting.py``)."""
        starts = self._starts
        starts.address_file = addr_file = os.path.join(self.log_dir, "scheduler.addr")
        if os.path.exists(addr_file):  # a --log-dir used before: its scheduler's address is not this one's
            os.remove(addr_file)
        self._spawn("scheduler", ["scheduler", "--servers", str(self.n_servers), "--workers", str(self.n_workers),
                                  "--vnodes-per-server", str(self.vnodes_per_server), "--address-file", addr_file]
                    + ([] if self.http_port is None else ["--http-port", str(self.http_port)]))
        warmup = self.warm or Warmup(servers=warm_server, workers=warm_workers)
        apart = starts.fork_ok and servers_apart()
        if apart:  # at once: each server loads its own kernels, then reads the scheduler's address
            starts.server_warmup = warmup.servers  # every server forked from now on
            for i in range(self.n_servers):
                self._spawn(f"server-{i}", ["server"])
        else:
            if starts.fork_ok:  # while the scheduler starts: the nodes forked next inherit the kernels
                warmup.servers()
                starts.warmed = True
            self.address = starts.scheduler_address(self.procs["scheduler"])
            for i in range(self.n_servers):
                self._spawn(f"server-{i}", ["server", "--scheduler", self.address])
        if starts.fork_ok:  # while the servers start
            warmup.workers()
            starts.warmed = True
        if apart:
            self.address = starts.scheduler_address(self.procs["scheduler"])
        for i in range(self.n_workers):
            self._spawn_worker(i)
        if warmup.forked is not None:
            warmup.forked()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env["PARAMSERVER_HEARTBEAT_INTERVAL_S"] = str(self.heartbeat_interval_s)
        env["PARAMSERVER_HEARTBEAT_TIMEOUT_S"] = str(self.heartbeat_timeout_s)
        env["PARAMSERVER_CONNECT_TIMEOUT_S"] = str(self.startup_timeout_s)
        env["PARAMSERVER_LOG_LEVEL"] = self.log_level
        if self.cold_dir:
            env["PARAMSERVER_COLD_DIR"] = self.cold_dir
        return env

    def _spawn(self, name: str, args: list[str], pass_fds: tuple[int, ...] = ()) -> NodeProcess:
        """Start node ``name`` (``paramserver ARGS``): forked while that is sound, else spawned."""
        proc = self._starts.node(name, args, self.log_dir, self._env(), pass_fds)
        self.procs[name] = proc
        return proc

    def _spawn_worker(self, i: int) -> NodeProcess:
        self._next_worker = max(self._next_worker, i + 1)
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        try:
            proc = self._spawn(f"worker-{i}", ["worker", "--scheduler", self.address,
                                               "--control-fds", f"{down_r},{up_w}"],
                               pass_fds=(down_r, up_w))
        finally:
            os.close(down_r)
            os.close(up_w)
        proc.to_child, proc.from_child = Connection(down_w, readable=False), Connection(up_r, writable=False)
        return proc

    def stop(self, timeout_s: float = 10.0, keep_logs: bool = False) -> None:
        """Stop every process: ask the scheduler, then SIGTERM, then SIGKILL.  The node logs
        of a temporary folder are removed, unless ``keep_logs`` (then their folder is logged,
        unless the job failed on an error whose message says it all: ``__exit__``)."""
        if self._closed:
            return
        self._closed = True
        leaving = [proc for proc in self.procs.values() if proc.to_child is not None]
        for proc in leaving:
            assert proc.to_child is not None, "a worker this cluster runs functions on"
            proc.to_child.close()  # EOF: the worker finishes and leaves
        # the workers leave while the scheduler and the servers still answer: a worker whose
        # last clock or LEAVE found them gone held its exit until its sockets' linger ran out
        wait_all(leaving, min(timeout_s, WORKERS_LEAVE_S))  # then what is left is stopped as ever
        end_all(list(self.procs.values()), self._ask_to_shut_down(), timeout_s)
        for proc in self.procs.values():
            if proc.from_child is not None:
                proc.from_child.close()
        if self._own_dir and self.log_dir and not keep_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        elif keep_logs and self.log_dir and self._say_where:
            logger.warning("the nodes' logs are kept in %s", self.log_dir)

    def release_workers(self) -> None:
        """``protocol.Cluster.release_workers``: each worker's pipe closed, the EOF it leaves
        on; ``stop`` waits for them as ever.  A command whose job is done lets them go
        before it scores its test rows: the 16-18 ms they took to leave (their last clock,
        their LEAVE, their sockets' close) were the first part of its stop."""
        with self._lock:
            if self._active is not None:
                raise WorkerError("a function is running on this cluster's workers; wait for it to return")
            for proc in self.procs.values():
                if proc.to_child is not None:
                    proc.to_child.close()

    def _ask_to_shut_down(self) -> bool:
        """Ask the scheduler to stop every node, and close the driver's client; False when
        there was nobody to ask (the nodes then get signals at once)."""
        if self._client is None:
            return False
        polite = False
        try:
            self._client.admin.shutdown_cluster()
            polite = True
        except Exception as exc:  # no scheduler to pass the word on: signals at once
            logger.debug("shutdown request failed: %s", exc)
        self._client.close()
        return polite

    # ---- use ---------------------------------------------------------------------------
    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float | None,
             elastic: bool) -> Outcome:
        wake_r, wake_w = Pipe(duplex=False)
        with self._lock:
            workers = [p for p in self.procs.values() if p.from_child is not None]
            call, payload = self._begin_run(workers, fn, args)
            active = self._active = ActiveRun(payload, call, wake_w)
            for proc in workers:
                active.send(proc)
        try:
            tally = collect(active, self._lock, wake_r, timeout_s, lambda proc, t: reap(proc, t, self._lock))
        finally:
            self._end_run()
            wake_r.close()
            wake_w.close()
        return tally.outcome()

    def add_worker(self) -> str:
        """Start one more worker process and return its name (``"worker-N"``).

        It registers with the scheduler like the first ones (and resynchronises its clock);
        if a function is running (``run``/``run_elastic``) it is sent that function too, so
        in a training job it asks the task queue for shards at once.
        """
        with self._lock:
            if self._closed or not self.address:
                raise ClosedError("the cluster is not running")
            proc = self._spawn_worker(self._next_worker)
            if self._active is not None:
                self._active.send(proc, joined=True)
                self._active.wake.send_bytes(b"")
        return proc.name

    def add_server(self, timeout_s: float | None = None) -> str:
        """Start one more server; it joins the running ring (its share of vnodes is
        copied to it, then the ring flips).  Returns its process name, once it serves."""
        name = f"server-{sum(n.startswith('server-') for n in self.procs)}"
        proc = self._spawn(name, ["server", "--scheduler", self.address])
        # wait for *this* server on the settled ring, not for a count: another server dying
        # during the join must not turn a join that completed into an error
        ready = self.client.admin.server_joined(pid=proc.popen.pid)
        deadline = time.monotonic() + (timeout_s or self.startup_timeout_s)
        while True:  # the answer, or the joiner's exit (before it registered, nobody else would notice)
            try:
                ready.result(timeout=max(0.0, min(0.25, deadline - time.monotonic())))
                break
            except TimeoutError:
                if proc.popen.poll() is not None:
                    raise ConnectError(f"{name} exited with code {proc.popen.returncode} before it joined the "
                                       f"ring:\n{proc.tail()}") from None
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{name} did not join the ring within {timeout_s or self.startup_timeout_s:g} "
                                       "s") from None
        self.client.admin.cluster_info()
        return name

    def remove_server(self, server: int | str, timeout_s: float | None = None) -> int:
        """Take a server out of the ring live (see ``Client.remove_server``): its node id,
        or its process name (``add_server``'s answer, ``"server-0"``...)."""
        if isinstance(server, str):
            proc = self.procs.get(server)
            if proc is None or not server.startswith("server-"):
                raise ConfigError(f"no server process {server!r} (servers: "
                                  f"{sorted(n for n in self.procs if n.startswith('server-'))}); pass a name "
                                  "add_server returned, or a node id")
            server = node_of_pid(self.client, proc.popen.pid, server)
        return self.client.admin.remove_server(server, timeout_s=timeout_s or self.startup_timeout_s)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one node (``"server-0"``, ``"worker-1"``): fault injection."""
        if name not in self.procs:
            raise KeyError(f"no process {name!r} (have {sorted(self.procs)})")
        self.procs[name].popen.send_signal(sig)


def node_of_pid(client: Client, pid: int, name: str) -> int:
    """The node id of the server whose process is ``pid`` (its stats say), or ``ConfigError``."""
    for stats in client.stats.server_stats():
        if int(stats.get("pid", -1)) == pid:
            return int(stats["node_id"])
    raise ConfigError(f"{name} (pid {pid}) is not serving on the ring")


def warm_workers() -> None:
    """What every worker runs whatever its function: the readers' parsers and the client's
    routing (a job that knows its model hands in more: ``apps/ctr/warmup.warm_job``)."""
    sample_batches()
    warm_client()


def run(fn: Callable[..., Any], *args: Any, servers: int = 1, workers: int = 1,
        setup: Callable[[Client], Any] | None = None, **cluster_kw: Any) -> list[Any]:
    """Run ``fn(client, *args)`` on every worker of a fresh local cluster; return the results.

    Args:
        setup: called with a driver client before the workers start (create tables here).
    """
    with LocalCluster(servers=servers, workers=workers, **cluster_kw) as cluster:
        if setup is not None:
            setup(cluster.client)
        return cluster.run(fn, *args)
