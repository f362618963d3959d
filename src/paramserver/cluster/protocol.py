"""``Cluster``: what every launcher offers, whatever runs its nodes.

``LocalCluster`` (processes on this machine) and ``RayCluster`` (Ray actors) start the
same nodes with the same command; a job (``apps/``, ``cli/``) asks for one by name
(``launch.open_cluster``) and must not care which it got.  This protocol is that promise,
written down where mypy checks it: ``open_cluster`` returns a ``Cluster``, so a launcher
that drifts from the other (a method renamed, a signal argument dropped) fails the type
check rather than the job that first runs on it.  It names only what both have; each
launcher has more of its own (``LocalCluster.procs``, ``http_url``; ``RayCluster.scale``).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, Self

if TYPE_CHECKING:
    from paramserver.client.client import Client


class Cluster(Protocol):
    """A scheduler, servers and workers, started by ``start`` (or ``with``) and ended by
    ``stop``; a node is named ``"scheduler"``, ``"server-N"`` or ``"worker-N"``."""

    n_servers: int  # asked for when it was made (``add_server``/``remove_server`` change the ring, not these)
    n_workers: int
    address: str  # the scheduler's, once started ("" before)
    log_dir: str  # where the nodes' logs go

    def __enter__(self) -> Self: ...

    def __exit__(self, exc_type: Any, *exc: Any) -> None: ...

    def start(self) -> None:
        """Start every node and a driver client; raise ``ConnectError`` (with the nodes'
        logs) if they did not come up within ``startup_timeout_s``."""

    def stop(self, timeout_s: float = 10.0, keep_logs: bool = False) -> None:
        """Stop every node, by request first, then by signal; idempotent."""

    def release_workers(self) -> None:
        """The workers will run no more functions: they may leave now, while the scheduler
        and the servers go on answering the driver (a job's end, before its test rows are
        scored from the servers); ``stop`` then waits for them as ever."""

    @property
    def client(self) -> Client:
        """A driver client of the cluster (create tables, inspect, pull results)."""

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]:
        """``fn(client, *args)`` on every worker; the results in rank order (``runs.RunsFunctions``)."""

    def run_elastic(self, fn: Callable[..., Any], *args: Any,
                    timeout_s: float | None = None) -> tuple[list[Any], list[str]]:
        """As ``run``, a worker's death tolerated while another finishes; the survivors'
        results and one line per death."""

    def add_worker(self) -> str:
        """Start one more worker, which joins a running function; its name."""

    def add_server(self, timeout_s: float | None = None) -> str:
        """Start one more server; its name once it serves on the ring."""

    def remove_server(self, server: int | str, timeout_s: float | None = None) -> int:
        """Take a server out of the ring live: its node id, or the name ``add_server``
        returned (``"server-2"``); the ring's new version."""

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one node (fault injection); ``KeyError`` for a name it does not have."""
