"""The client's calls on the cluster's membership: who is there (servers' stats, the ring,
workers), servers leaving and joining, and the cluster's shutdown.  The control plane's
calls, apart from the data plane's (pull, push, clocks) in ``client.py``; ``Client``
inherits them."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from paramserver.errors import ConfigError
from paramserver.wire.message import Message, Op

if TYPE_CHECKING:
    from paramserver.config import Config


class ClusterCalls:
    """Membership calls of a ``Client`` (it provides the transport underneath)."""

    if TYPE_CHECKING:
        config: Config
        _cluster_stopped: bool

        def _call(self, address: str, header: dict[str, Any], timeout_s: float | None = None,
                  connecting: bool = False) -> dict[str, Any]: ...

        def _request(self, address: str, header: dict[str, Any]) -> Future[Message]: ...

        def _on_every_server(self, header: dict[str, Any], timeout_s: float | None = None) -> list[Message]: ...

        def _apply_view(self, view: dict[str, Any]) -> None: ...

    def server_stats(self, samples: bool = False) -> list[dict[str, Any]]:
        """Per-server table sizes, clocks and resident memory; with ``samples`` also each
        server's metric families (``metrics.py``)."""
        return [m.header for m in self._on_every_server({"op": Op.STATS.value, "samples": samples})]

    def wait_for_workers(self, count: int, timeout_s: float | None = None) -> int:
        """Block until ``count`` workers have registered; return how many have."""
        return int(self._call(self.config.scheduler, {"op": Op.WAIT_WORKERS.value, "count": count},
                              timeout_s=timeout_s)["workers"])

    # ---- elastic servers ------------------------------------------------------------
    def cluster_info(self) -> dict[str, Any]:
        """The ring version and servers, their addresses, and whether vnodes are moving."""
        info = self._call(self.config.scheduler, {"op": Op.CLUSTER_INFO.value})
        if "ring" in info:
            self._apply_view(info)
        return info

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
        return int(self._call(self.config.scheduler, {"op": Op.REMOVE_SERVER.value, "node_id": int(node_id)},
                              timeout_s=timeout_s).get("ring_version", 0))

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
        return self._request(self.config.scheduler, {"op": Op.WAIT_SERVERS.value, "count": count})

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
        return self._request(self.config.scheduler, {"op": Op.WAIT_SERVERS.value, "joiner": joiner})

    def shutdown_cluster(self) -> None:
        """Ask the scheduler to stop every node (used by launchers)."""
        self._call(self.config.scheduler, {"op": Op.SHUTDOWN.value}, timeout_s=10)
        self._cluster_stopped = True  # nobody left to say goodbye to
