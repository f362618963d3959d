"""Which launcher starts a command's cluster: ``--cluster local`` (the default: processes on
this machine, ``LocalCluster``) or ``--cluster ray[:ADDRESS]`` (Ray actors, ``RayCluster``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paramserver.errors import ConfigError

if TYPE_CHECKING:
    from paramserver.cluster.protocol import Cluster

CLUSTER_HELP = ("where the nodes run: local (default: processes on this machine) or ray[:ADDRESS] (Ray actors "
                "in a placement group; ADDRESS auto joins the Ray cluster `ray start` runs here, ray://HOST:PORT "
                "a remote one; none: the Ray that RAY_ADDRESS names or `ray start` runs here, else a new local Ray)")


def parse_cluster(value: str) -> tuple[str, str | None]:
    """``"local"`` → ``("local", None)``; ``"ray"`` → ``("ray", None)``; ``"ray:auto"`` →
    ``("ray", "auto")``; ``"ray:ray://h:10001"`` → ``("ray", "ray://h:10001")``."""
    kind, sep, address = value.partition(":")
    if kind == "local" and not sep:
        return "local", None
    if kind == "ray" and (not sep or address):
        return "ray", address or None
    raise ConfigError(f"--cluster {value!r}: must be local, ray, or ray:ADDRESS (ray:auto for the Ray cluster "
                      "`ray start --head` runs on this machine, ray:ray://HOST:10001 for a remote one)")


def open_cluster(*, servers: int, workers: int, cluster: str = "local", **options: Any) -> Cluster:
    """A ``LocalCluster`` or a ``RayCluster`` (not started: use it as a context manager);
    what a job may use of either is ``protocol.Cluster`` (mypy checks both launchers
    against it here)."""
    kind, address = parse_cluster(cluster)
    if kind != "local":  # Ray's nodes are actors, not forks of this process: nothing to warm for them
        options.pop("warm", None)
    if kind == "local":
        from paramserver.cluster.local import LocalCluster

        return LocalCluster(servers=servers, workers=workers, **options)
    try:
        from paramserver.cluster.ray import RayCluster
    except ImportError as exc:
        raise ConfigError(f"--cluster {cluster}: Ray is not installed ({exc}); pip install 'paramserver[ray]'") \
            from None
    return RayCluster(servers=servers, workers=workers, address=address, **options)
