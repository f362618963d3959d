"""``StandingCluster``: a job's workers, started on this machine, on a cluster that runs already.

``--cluster tcp://HOST:PORT`` on a command that trains: the scheduler at that address and its
servers were started where they run (``paramserver scheduler``, ``paramserver server
--scheduler ...``, a launcher's pods); the job brings its driver and its workers, forked here as
``LocalCluster`` forks its own, and leaves with them.  The scheduler and the servers stay up for
the next job, which is why:

- every table the job's driver creates must be new (``Admin.fresh_tables``): a job never trains on
  an earlier job's rows by accident (``paramserver cluster drop-table NAME`` clears one);
- ``stop`` ends the workers (they finish and leave once their pipe closes) and the driver, never
  the cluster;
- the servers are the cluster's: ``add_server`` says where one is started instead, and
  ``n_servers`` is what the ring has once the driver is connected.

Example:
    >>> with StandingCluster("tcp://10.0.0.1:7000", workers=2) as cluster:   # doctest: +SKIP
    ...     cluster.client.create_table("w", dim=1)
    ...     cluster.run(train)
"""

from __future__ import annotations

from typing import Any

from paramserver._runtime.warm import Warmup
from paramserver.cluster.local import LocalCluster, warm_workers
from paramserver.config import load_config
from paramserver.errors import ConfigError, ConnectError


def running_address(value: str) -> str | None:
    """``"tcp://HOST:PORT"`` → itself (a running cluster's scheduler); anything else → ``None``."""
    if not value.startswith("tcp://"):
        return None
    host, _, port = value[len("tcp://"):].rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--cluster {value}: a running cluster is named by its scheduler's address, "
                          "tcp://HOST:PORT (the address `paramserver scheduler` prints)")
    return value


class StandingCluster(LocalCluster):
    """``workers`` worker processes here, joined to the scheduler at ``address``; the rest as
    ``LocalCluster`` (``run``, ``run_elastic``, ``add_worker``, ``kill`` of its own workers).

    Args:
        address: the running scheduler's ``tcp://HOST:PORT``.
        workers: worker processes this job starts here.
        startup_timeout_s: how long to wait for the scheduler, then for the workers to register.
        secret_file: the cluster's key file (``paramserver keygen``): a job's driver creates tables
            and its workers register, which a driver's or a worker's file alone does not allow.
        heartbeats: the environment's (``PARAMSERVER_HEARTBEAT_*``), as the cluster's nodes were
            started with.
    """

    def __init__(self, address: str, workers: int = 1, *, startup_timeout_s: float = 60.0,
                 log_level: str = "INFO", log_dir: str | None = None, start_method: str = "fork",
                 memory_limit_mb: int | None = None, secret_file: str | None = None, warm: Warmup | None = None):
        given = running_address(address)
        if given is None:
            raise ConfigError(f"StandingCluster({address!r}): give the running scheduler's tcp://HOST:PORT")
        config = load_config()
        super().__init__(servers=1, workers=workers, heartbeat_interval_s=config.heartbeat_interval_s,
                         heartbeat_timeout_s=config.heartbeat_timeout_s, startup_timeout_s=startup_timeout_s,
                         log_level=log_level, log_dir=log_dir, start_method=start_method,
                         memory_limit_mb=memory_limit_mb, secret_file=secret_file, warm=warm)
        self.address = given

    @property
    def _failed_start(self) -> str:
        return f"could not join the cluster at {self.address}"

    def _check_keys(self, keys: Any, secret_file: str | None) -> None:
        if keys.role != "cluster":
            raise ConfigError(f"secret_file {secret_file} is a {keys.role} key file: a job's driver creates tables "
                              "and its workers register, which only the cluster's file (paramserver keygen) allows "
                              "both of")

    def _start_nodes(self) -> None:
        """Connect the driver (no scheduler there is said now), count the workers the cluster
        has already, then fork this job's once their kernels are loaded."""
        try:
            client = self._driver()
        except ConnectError as exc:
            raise ConnectError(f"{exc}; or leave out --cluster for a cluster of the job's own") from None
        client.admin.fresh_tables = True
        info = client.admin.cluster_info()
        self.n_servers = len(info.get("ring_servers", []))
        self._workers_before = len(info.get("workers", {}))
        warmup = self.warm or Warmup(servers=_none, workers=warm_workers)
        if self._starts.fork_ok:
            warmup.workers()
            self._starts.warmed = True
        for i in range(self.n_workers):
            self._spawn_worker(i)

    def _ask_to_shut_down(self) -> bool:
        """The cluster stays up: only the driver leaves (the workers were told by their pipes)."""
        if self._client is not None:
            self._client.close()
        return True

    def add_server(self, timeout_s: float | None = None) -> str:
        raise ConfigError(f"the cluster at {self.address} runs its own servers: start one where it should run "
                          f"(paramserver cluster add-server --scheduler {self.address})")


def _none() -> None:
    """A standing cluster forks no server: nothing of theirs to load."""
