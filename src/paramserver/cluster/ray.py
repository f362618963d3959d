"""``RayCluster``: the cluster ``LocalCluster`` starts, with Ray as the resource manager.

The scheduler, every server and every worker is a Ray actor.  The servers and workers sit
in a placement group (``SPREAD`` by default, ``PACK`` to keep them on few machines), each
with the resources its role is given.  An actor runs the same node command a user would
type (``python -m paramserver server --scheduler ...``) as its child process, bound on its
machine's IP: the hot path then shares its interpreter with none of Ray's threads, and the
actor is the node's supervisor (placement, resources, restarts).  The scheduler actor
reports the address its node bound; the others are given it.  What each role asks Ray for,
and the placement group, are ``cluster/placement.py``'s.

What Ray does and what we do on a failure:

* a node process that dies takes its actor with it, and a killed actor (``ray.kill``, a
  lost machine) takes its node (``--parent-pid``).  Ray restarts the actor
  (``max_restarts``) with a fresh node: a server *joins* the ring as an elastic join (our
  failover has already promoted the dead one's replicas, with ``--replicas 2`` or more);
  a worker joins the running function, and the task queue has re-queued the dead one's
  shard;
* the scheduler is not replicated yet: its actor's death ends ``run`` with a clear error.

The function given to ``run`` travels through Ray's own serialisation to the worker
actor, which hands it to its child over a pipe; the parameter wire never unpickles.

Example:
    >>> with RayCluster(servers=2, workers=2) as cluster:      # doctest: +SKIP
    ...     cluster.client.create_table("w", dim=1)
    ...     cluster.run(train)
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
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayError

from paramserver.client.client import Client
from paramserver.cluster.actor import NodeActor
from paramserver.cluster.placement import Placement, free
from paramserver.cluster.runs import Outcome, RunsFunctions, Tally
from paramserver.config import load_config
from paramserver.errors import ClosedError, ConfigError, ConnectError, NodeLostError, WorkerError

logger = logging.getLogger(__name__)

NAMESPACE = "paramserver"  # every node's actor is named here: paramserver-<cluster id>-server-0, ...


@dataclass
class _Member:
    """One node of the cluster, as the driver sees it."""

    name: str
    role: str
    actor: Any
    restarts_left: int
    drained: bool = False  # taken out on purpose (scale): its exit is no death
    dead: bool = False  # gone for good (no restart left)


@dataclass
class _Active:
    """The function ``run`` is running: workers added meanwhile are sent it too."""

    payload: bytes
    call: int
    elastic: bool
    wake: Future[None] = field(default_factory=Future)
    waiting: dict[Future[Any], _Member] = field(default_factory=dict)


class RayCluster(RunsFunctions):
    """A cluster whose nodes are Ray actors; the interface of ``LocalCluster``.

    Args:
        servers, workers: nodes of each role started now (``scale``/``add_*`` add more).
        address: the Ray cluster to join: ``"auto"`` (the one ``ray start`` runs here),
            ``"ray://host:10001"`` or ``"host:6379"``; ``None`` joins the one this process
            is connected to, else the one ``RAY_ADDRESS`` names or ``ray start`` runs here,
            else starts a local one (stopped again by ``stop``); ``"local"`` always starts one.
        strategy: the placement group's: ``"SPREAD"`` (default: servers and workers on as
            many machines as may be), ``"PACK"``, ``"STRICT_SPREAD"`` or ``"STRICT_PACK"``.
        resources: per role (``"scheduler"``, ``"server"``, ``"worker"``), Ray's actor
            resources: ``{"num_cpus": 2, "memory": 4 << 30, "resources": {"ssd": 1}}``.
            Unset CPUs: 1 a server and a worker, or an equal share of the Ray cluster's
            free CPUs when they are fewer (4 nodes on a 2-CPU machine get 0.5 each); the
            scheduler asks for none.
        max_restarts: how often Ray brings back a server's or a worker's actor (each time
            as a new node that joins); the scheduler's is never restarted.
        niceness: the nodes' nice value (default 0, as ``LocalCluster``'s and the driver's).
            Ray runs its worker processes at 15; a node asks for this where the OS allows
            (``CAP_SYS_NICE``, or start Ray with ``RAY_worker_niceness=0``), ``None`` keeps 15.
        init_options: more ``ray.init`` arguments, when this class calls it.
        Others: as ``LocalCluster``.
    """

    def __init__(self, servers: int = 1, workers: int = 0, *, address: str | None = None,
                 strategy: str = "SPREAD", resources: dict[str, dict[str, Any]] | None = None,
                 max_restarts: int = 3, vnodes_per_server: int = 64, heartbeat_interval_s: float = 0.5,
                 heartbeat_timeout_s: float = 5.0, startup_timeout_s: float = 60.0, log_level: str = "INFO",
                 log_dir: str | None = None, niceness: int | None = 0, init_options: dict[str, Any] | None = None):
        if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
            raise ValueError(f"servers must be an int >= 1, got {servers!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be an int >= 0, got {workers!r}")
        self.placement = Placement(strategy, resources, max_restarts)  # checks them
        self.n_servers, self.n_workers = servers, workers
        self.ray_address, self.strategy = address, strategy
        self.resources, self.max_restarts = self.placement.resources, max_restarts
        self.vnodes_per_server = vnodes_per_server
        self.heartbeat_interval_s, self.heartbeat_timeout_s = heartbeat_interval_s, heartbeat_timeout_s
        self.startup_timeout_s, self.log_level = startup_timeout_s, log_level
        self._keep_dir = log_dir is not None
        self.cluster_id = uuid.uuid4().hex[:8]  # in the actors' names: paramserver-<id>-server-0, ...
        self.log_dir = log_dir or os.path.join(tempfile.gettempdir(), f"paramserver-ray-{self.cluster_id}")
        self.init_options = dict(init_options or {})
        self.niceness = niceness
        self.address = ""
        self.members: dict[str, _Member] = {}
        self._scheduler: _Member | None = None
        self._scheduler_exit: Future[Any] | None = None
        self._started_ray = False
        self._client: Client | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._active: _Active | None = None
        self._calls = 0
        self._counts = {"server": 0, "worker": 0}
        self._actor_class: Any = None

    # ---- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> RayCluster:
        self.start()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        said = (ConfigError, WorkerError, ClosedError)
        self.stop(keep_logs=exc_type is not None and not issubclass(exc_type, said))

    def start(self) -> None:
        if not ray.is_initialized():
            options = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False,
                       **self.init_options}
            ray.init(address=self.ray_address, **options)
            self._started_ray = True
        self._actor_class = ray.remote(NodeActor)
        try:
            self.placement.reserve(self.n_servers, self.n_workers, self.startup_timeout_s)
            self._scheduler = self._start("scheduler", "scheduler", [
                "--servers", str(self.n_servers), "--workers", str(self.n_workers),
                "--vnodes-per-server", str(self.vnodes_per_server)], bundle=None)
            self.address = self._get(self._scheduler.actor.address.remote(self.startup_timeout_s), "the scheduler")
            self._scheduler_exit = self._scheduler.actor.wait_exit.remote().future()
            for i in range(self.n_servers):
                self._start(f"server-{i}", "server", ["--scheduler", self.address], bundle=i)
            for i in range(self.n_workers):
                self._start(f"worker-{i}", "worker", ["--scheduler", self.address], bundle=self.n_servers + i)
            self._counts = {"server": self.n_servers, "worker": self.n_workers}
            for member in self.members.values():  # every actor constructed (its node started), or its error
                self._get(member.actor.info.remote(), member.name)
            self._client = Client(role="driver", config=load_config(
                scheduler=self.address, connect_timeout_s=self.startup_timeout_s,
                heartbeat_interval_s=self.heartbeat_interval_s, heartbeat_timeout_s=self.heartbeat_timeout_s))
            if self.n_workers:
                self._client.admin.wait_for_workers(self.n_workers, timeout_s=self.startup_timeout_s)
        except BaseException as exc:
            logs = self._logs()
            self.stop()
            if isinstance(exc, (ConnectError, TimeoutError)):
                raise ConnectError(f"ray cluster did not start: {exc}\n{logs}") from exc
            raise

    def _start(self, name: str, role: str, args: list[str], bundle: int | None) -> _Member:
        """Start node ``name``'s actor, in ``bundle`` of the placement group (``None``: outside it)."""
        options = self.placement.actor_options(role, bundle)
        actor = self._actor_class.options(name=f"paramserver-{self.cluster_id}-{name}", namespace=NAMESPACE,
                                          **options).remote(
            name, role, args, self._env(), os.path.join(self.log_dir, f"{name}.log"), self.niceness)
        member = _Member(name, role, actor, restarts_left=options["max_restarts"])
        self.members[name] = member
        return member

    def _env(self) -> dict[str, str]:
        return {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                "PARAMSERVER_HEARTBEAT_INTERVAL_S": str(self.heartbeat_interval_s),
                "PARAMSERVER_HEARTBEAT_TIMEOUT_S": str(self.heartbeat_timeout_s),
                "PARAMSERVER_CONNECT_TIMEOUT_S": str(self.startup_timeout_s),
                "PARAMSERVER_LOG_LEVEL": self.log_level}

    def _get(self, ref: Any, what: str, timeout_s: float | None = None) -> Any:
        try:
            return ray.get(ref, timeout=timeout_s or self.startup_timeout_s)
        except GetTimeoutError:
            raise ConnectError(f"{what} did not start within {timeout_s or self.startup_timeout_s:g} s (Ray may "
                               f"have no room for it: free {free()})") from None
        except RayError as exc:
            raise ConnectError(f"{what} failed to start: {exc}") from None

    def _logs(self) -> str:
        lines = []
        for member in self.members.values():
            try:
                lines.append(f"--- {member.name}:\n{ray.get(member.actor.tail.remote(), timeout=5)}")
            except Exception:
                lines.append(f"--- {member.name}: (its actor is gone)")
        return "\n".join(lines)

    def release_workers(self) -> None:
        """``protocol.Cluster.release_workers``: nothing to do early here (an actor's worker
        leaves when ``stop`` asks it to)."""

    def stop(self, timeout_s: float = 10.0, keep_logs: bool = False) -> None:
        """Stop every node (by request, then by signal), every actor and the placement
        group; and Ray, if ``start`` started it."""
        if self._closed:
            return
        self._closed = True
        members = list(self.members.values())
        self._quietly([m.actor.prepare_stop.remote() for m in members])  # no restart from here on
        scheduler_gone = self._scheduler_exit is not None and self._scheduler_exit.done()
        if self._client is not None and not scheduler_gone:
            try:
                self._client.admin.shutdown_cluster()
            except Exception as exc:
                logger.debug("shutdown request failed: %s", exc)
        if self._client is not None:
            self._client.close()
        patience = 0.5 if scheduler_gone else timeout_s  # nobody told the nodes to stop: signals at once
        self._quietly([m.actor.stop.remote(patience, keep_logs) for m in members], patience + 12)
        for member in members:
            try:
                ray.kill(member.actor, no_restart=True)
            except Exception:
                pass
        self.placement.remove()
        if not keep_logs and not self._keep_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)  # this machine's part; each actor removed its own
        elif keep_logs:
            logger.warning("the nodes' logs are kept in %s on each machine", self.log_dir)
        if self._started_ray:
            ray.shutdown()

    @staticmethod
    def _quietly(refs: list[Any], timeout_s: float = 10.0) -> None:
        """Wait for calls to actors some of which may be dead already."""
        for ref in refs:
            try:
                ray.get(ref, timeout=timeout_s)
            except Exception:
                pass

    # ---- use ---------------------------------------------------------------------------
    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float | None,
             elastic: bool) -> Outcome:
        with self._lock:
            workers = [m for m in self.members.values() if m.role == "worker" and not (m.dead or m.drained)]
            call, payload = self._begin_run(workers, fn, args)
            active = self._active = _Active(payload, call, elastic)
            for member in workers:
                self._submit(member, joined=False)
        tally = Tally()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        assert self._scheduler_exit is not None
        try:
            while True:
                with self._lock:
                    waiting, wake = dict(active.waiting), active.wake
                if not waiting:
                    break
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, _ = wait_futures([*waiting, wake, self._scheduler_exit], timeout=left,
                                       return_when=FIRST_COMPLETED)
                if not done:
                    raise WorkerError(f"{sorted(m.name for m in waiting.values())} did not finish within "
                                      f"{timeout_s} s")
                if self._scheduler_exit in done:
                    raise NodeLostError("the scheduler's actor died, so the job cannot go on (the scheduler is "
                                        "not replicated yet); the nodes are being stopped")
                if wake in done:
                    with self._lock:
                        active.wake = Future()
                for fut in done:
                    if fut is wake or fut not in waiting:
                        continue
                    with self._lock:
                        member = active.waiting.pop(fut)
                    try:
                        answer = fut.result()
                    except RayError as exc:
                        answer, why = None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                    else:
                        why = "its node exited"
                    if answer is None:
                        self._died(member, why, tally)
                        continue
                    _, status, rank, value = cloudpickle.loads(answer)  # one answer a call: no late ones
                    tally.answered(member.name, status, rank, value)
                if tally.raised:
                    break
        finally:
            self._end_run()
        return tally.outcome()

    def _submit(self, member: _Member, joined: bool) -> None:
        """Send the active function to a worker actor (under ``_lock``)."""
        active = self._active
        assert active is not None
        fut = member.actor.run.remote((b"J" if joined else b"-") + active.payload).future()
        active.waiting[fut] = member

    def _died(self, member: _Member, why: str, tally: Tally) -> None:
        if member.drained:  # scale() took it out: its shard is re-queued, no death to report
            return
        line = f"{member.name} died ({why})"
        tally.died(line)
        with self._lock:
            if member.restarts_left <= 0:
                member.dead = True
                return
            member.restarts_left -= 1  # Ray brings its actor back (in a strict run too), with a fresh worker
            rejoin = self._active is not None and self._active.elastic  # ... that joins the running function
        if not rejoin:
            return
        logger.warning("%s; Ray restarts it and it joins the running function", line)
        if not self._restarted(member):
            tally.died(f"{member.name} did not come back within {self.startup_timeout_s:g} s of its restart")
            with self._lock:
                member.dead = True
            return
        with self._lock:
            if self._active is not None:
                self._submit(member, joined=True)

    def _restarted(self, member: _Member) -> bool:
        """Wait until a dying worker's actor answers again, as its restarted self.  A call sent
        while Ray is still restarting it fails at once ("the actor is restarting"), and that is
        the same death, not a second one, so the function is handed to it only once it is up."""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            try:
                ray.get(member.actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
                return True
            except ActorUnavailableError:  # restarting: ask again, after a beat so as not to spin
                time.sleep(0.05)
            except (GetTimeoutError, RayError):  # died for good, or never came back
                return False
        return False

    def add_worker(self) -> str:
        """Start one more worker actor; it joins a running function (see ``LocalCluster.add_worker``)."""
        with self._lock:
            if self._closed or not self.address:
                raise ClosedError("the cluster is not running")
            name = f"worker-{self._counts['worker']}"
            self._counts["worker"] += 1
            member = self._start(name, "worker", ["--scheduler", self.address], bundle=None)
            if self._active is not None:
                self._submit(member, joined=True)
                self._active.wake.set_result(None)
        return name

    def add_server(self, timeout_s: float | None = None) -> str:
        """Start one more server actor; it joins the ring (an elastic join).  Returns its
        name once it serves."""
        wait_s = timeout_s or self.startup_timeout_s
        name = f"server-{self._counts['server']}"
        self._counts["server"] += 1
        member = self._start(name, "server", ["--scheduler", self.address], bundle=None)
        info = self._get(member.actor.info.remote(), name, wait_s)
        # this server on the settled ring, not a count (another server dying meanwhile is no failure)
        self.client.admin.server_joined(address=str(info["address"])).result(timeout=wait_s)
        self.client.admin.cluster_info()
        return name

    def remove_server(self, server: int | str, timeout_s: float | None = None) -> int:
        """Take a server out of the ring live (see ``Client.remove_server``): its node id,
        or its actor's name (``add_server``'s answer); its actor then ends."""
        servers = self.client.admin.cluster_info().get("servers", {})
        if isinstance(server, str):
            member = self.members.get(server)
            if member is None or member.role != "server":
                raise ConfigError(f"no server actor {server!r} (servers: "
                                  f"{sorted(n for n, m in self.members.items() if m.role == 'server')})")
            mine = self._address_of(member)
            found = [int(i) for i, a in servers.items() if a == mine]
            if not found:
                raise ConfigError(f"{server} is not serving on the ring")
            server = found[0]
        node_id = int(server)
        address = servers.get(str(node_id), "")
        for member in self.members.values():
            if member.role == "server" and not member.drained and self._address_of(member) == address:
                member.drained = True
                self._quietly([member.actor.prepare_stop.remote()])
        version = self.client.admin.remove_server(node_id, timeout_s=timeout_s or self.startup_timeout_s)
        for member in self.members.values():
            if member.drained and member.role == "server" and not member.dead:
                member.dead = True
                self._quietly([member.actor.stop.remote(10.0, False)], 20)
                ray.kill(member.actor, no_restart=True)
        return int(version)

    @staticmethod
    def _address_of(member: _Member) -> str:
        """A server's address now (a restarted actor's node has a new one)."""
        try:
            return str(ray.get(member.actor.info.remote(), timeout=10)["address"])
        except Exception:
            return ""

    def scale(self, servers: int | None = None, workers: int | None = None, timeout_s: float | None = None) -> None:
        """Join or drain nodes live until the cluster has ``servers`` servers and ``workers``
        workers (an autoscaler's hook).  A drained server's vnodes move to the others
        first; a drained worker stops, and its shard goes back to the queue."""
        if servers is not None:
            if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
                raise ConfigError(f"servers must be a whole number >= 1, got {servers!r}")
            ring = [int(s) for s in self.client.admin.cluster_info().get("ring_servers", [])]
            for _ in range(servers - len(ring)):
                self.add_server(timeout_s)
            for node_id in sorted(ring, reverse=True)[:max(0, len(ring) - servers)]:
                self.remove_server(node_id, timeout_s)
        if workers is not None:
            if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
                raise ConfigError(f"workers must be a whole number >= 0, got {workers!r}")
            live = [m for m in self.members.values() if m.role == "worker" and not (m.dead or m.drained)]
            for _ in range(workers - len(live)):
                self.add_worker()
            for member in live[workers:] if workers < len(live) else []:
                member.drained = member.dead = True
                ray.kill(member.actor, no_restart=True)  # its node exits with it; the queue re-queues its shard

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one node (``"server-0"``, ``"worker-1"``, ``"scheduler"``): fault
        injection, as ``LocalCluster.kill``.  ``SIGKILL`` (the default) kills the node's
        actor, as a lost machine would, and the node goes with it; another signal goes to
        the node's process, whose exit ends its actor.  Ray restarts the actor if it may."""
        if name not in self.members:
            raise KeyError(f"no node {name!r} (have {sorted(self.members)})")
        if sig == signal.SIGKILL:
            ray.kill(self.members[name].actor, no_restart=False)
        else:  # an actor already gone has no node to signal, as a dead process ignores a signal
            self._quietly([self.members[name].actor.send_signal.remote(int(sig))])
