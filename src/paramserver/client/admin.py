"""``client.admin``: the cluster's administration, apart from the data plane's calls
(pull, push, clocks) on the client itself: who is there (the ring, servers joining and
leaving, workers), namespaces and their quotas, a table made from a whole spec and what its
push filters take, and the cluster's shutdown."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from paramserver.errors import ConfigError
from paramserver.tables.namespaces import Quota, check_name, summarize
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message, Op

if TYPE_CHECKING:
    from paramserver.client.rpc import Rpc
    from paramserver.client.state import ClientState
    from paramserver.client.stats import Stats
    from paramserver.routing.ring import Ring


class Admin:
    """The administration calls of a client, through its ``rpc``, on its ``state``'s view
    (``stats``: the servers' figures, which a namespace's summary reads)."""

    def __init__(self, rpc: Rpc, state: ClientState, stats: Stats, spec: Callable[[str], TableSpec]) -> None:
        self._rpc, self._state, self._stats, self._spec = rpc, state, stats, spec
        self.stopped = False  # shutdown_cluster ran: nobody is left to say goodbye to
        # every table this client creates must be new (a job's driver on a cluster that runs already,
        # ``cluster/standing.py``): the scheduler refuses a name it holds rather than hand back its rows
        self.fresh_tables = False

    @property
    def ring(self) -> Ring:
        """The ring this client routes with (the newest it was told of)."""
        return self._state.ring()

    def cluster_info(self, timeout_s: float | None = None) -> dict[str, Any]:
        """The ring version and servers, their addresses, and whether vnodes are moving
        (``TimeoutError``: no answer within ``timeout_s``; None: as ``Job.status``)."""
        info = self._rpc.scheduler({"op": Op.CLUSTER_INFO.value}, timeout_s)
        if "ring" in info:
            self._state.apply_view(info)
        return info

    def wait_for_workers(self, count: int, timeout_s: float | None = None) -> int:
        """Block until ``count`` workers have registered; return how many have."""
        return int(self._rpc.scheduler({"op": Op.WAIT_WORKERS.value, "count": count}, timeout_s)["workers"])

    def remove_server(self, node_id: int, timeout_s: float | None = None) -> int:
        """Take a server out of the ring while jobs run: its vnodes are copied to the
        others (writes made meanwhile included), the ring flips, then it stops.
        Returns the new ring version.

        Raises:
            ConfigError: ``node_id`` is not a node id (a launcher's ``remove_server`` takes
                the process name its ``add_server`` returned)."""
        if isinstance(node_id, bool) or not isinstance(node_id, (int, np.integer)):
            raise ConfigError(f"remove_server takes the server's node id (an int, as `cluster status` lists them), "
                              f"got {node_id!r}; LocalCluster.remove_server and RayCluster.remove_server also take "
                              "the name add_server returned")
        return int(self._rpc.scheduler({"op": Op.REMOVE_SERVER.value, "node_id": int(node_id)},
                                       timeout_s).get("ring_version", 0))

    def wait_for_servers(self, count: int, timeout_s: float | None = None) -> int:
        """Block until the ring has ``count`` servers and no vnode is moving; return its ring version.

        Raises:
            NodeLostError: a server died meanwhile and the ring no longer heads for
                ``count`` (a joiner died while its vnodes were being copied).
        """
        answer = self.servers_ready(count).result(timeout=timeout_s)
        self.cluster_info()
        return int(answer.header["ring_version"])

    def servers_ready(self, count: int) -> Future[Message]:
        """``wait_for_servers`` without blocking: a future of the scheduler's answer."""
        return self._rpc.request(self._rpc.config.scheduler, {"op": Op.WAIT_SERVERS.value, "count": count})

    def server_joined(self, pid: int = 0, address: str = "") -> Future[Message]:
        """A future answered once the server with process id ``pid`` (and/or advertised
        ``address``) is on the ring and no vnode is moving: how a launcher waits for the
        server it started to join.  Another server dying meanwhile does not fail it (the
        join is re-planned and completes); it fails with ``NodeLostError`` only if that
        server itself dies after registering."""
        joiner: dict[str, Any] = {"pid": int(pid)} if pid else {}
        if address:
            joiner["address"] = address
        if not joiner:
            raise ConfigError("server_joined needs the joining server's pid or address")
        return self._rpc.request(self._rpc.config.scheduler, {"op": Op.WAIT_SERVERS.value, "joiner": joiner})

    def shutdown_cluster(self) -> None:
        """Ask the scheduler to stop every node (used by launchers)."""
        self._rpc.scheduler({"op": Op.SHUTDOWN.value}, timeout_s=10)
        self.stopped = True

    # ---- tables and namespaces ------------------------------------------------------------
    def create_table_spec(self, spec: TableSpec) -> TableSpec:
        """Create the table ``spec`` describes, every field of it (a job's table, a
        checkpoint's): the one path by which a spec reaches the scheduler."""
        self._rpc.scheduler({"op": Op.CREATE_TABLE.value, "spec": spec.to_wire()}
                            | ({"fresh": True} if self.fresh_tables else {}))
        with self._state.lock:
            self._state.tables[spec.name] = spec
        return spec

    def takes_packed(self, table: str) -> bool:
        """Whether ``client.push(table, keys, PackedRows, op="add", distinct=True)`` sends the
        rows as they are packed (``filters/packed.py``: the table's push filters start with
        ``sparse``); elsewhere they are made dense first, and a producer that has them dense
        pushes them so for less."""
        return self._state.filters.takes_packed(self._spec(table))

    def create_namespace(self, name: str, *, max_keys: int | None = None, max_bytes: int | None = None) -> None:
        """Set the quota of namespace ``name`` (its tables are named ``"name/..."``): a
        push that would take it past ``max_keys`` keys or ``max_bytes`` bytes is refused
        with ``QuotaError`` and changes nothing (``paramserver.tables.namespaces``).  Again, to
        change it; with no limit, to lift it."""
        quota = Quota(max_keys, max_bytes)
        self._rpc.scheduler({"op": Op.CREATE_NAMESPACE.value, "name": check_name(name), "quota": quota.to_wire()})

    def drop_namespace(self, name: str) -> list[str]:
        """Drop every table of namespace ``name`` and its quota; return the tables dropped."""
        return list(self._rpc.scheduler({"op": Op.DROP_NAMESPACE.value, "name": check_name(name)})["tables"])

    def namespaces(self) -> dict[str, dict[str, Any]]:
        """Each namespace's tables, keys, bytes and quota (``""``: tables with no ``/``)."""
        info = self.cluster_info()
        return summarize(info.get("tables", {}), info.get("namespaces", {}), self._stats.server_stats())
