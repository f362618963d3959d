"""Which launcher starts a command's cluster: ``--cluster local`` (the default: processes on
this machine, ``LocalCluster``), ``--cluster ray[:ADDRESS]`` (Ray actors, ``RayCluster``), or
``--cluster tcp://HOST:PORT`` (a cluster that runs already: the job's workers start here and
join it, ``StandingCluster``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paramserver.errors import ConfigError

if TYPE_CHECKING:
    from paramserver.cluster.protocol import Cluster

CLUSTER_HELP = ("where the nodes run: local (default: processes on this machine), ray[:ADDRESS] (Ray actors "
                "in a placement group; ADDRESS auto joins the Ray cluster `ray start` runs here, ray://HOST:PORT "
                "a remote one; none: the Ray that RAY_ADDRESS names or `ray start` runs here, else a new local Ray), "
                "or tcp://HOST:PORT, the scheduler of a cluster that runs already (its servers are its own, "
                "--servers is not used; the job's workers start here, and its tables must be new)")


def parse_cluster(value: str) -> tuple[str, str | None]:
    """``"local"`` → ``("local", None)``; ``"ray"`` → ``("ray", None)``; ``"ray:auto"`` →
    ``("ray", "auto")``; ``"ray:ray://h:10001"`` → ``("ray", "ray://h:10001")``;
    ``"tcp://h:7000"`` → ``("running", "tcp://h:7000")``."""
    from paramserver.cluster.standing import running_address

    running = running_address(value)
    if running is not None:
        return "running", running
    kind, sep, address = value.partition(":")
    if kind == "local" and not sep:
        return "local", None
    if kind == "ray" and (not sep or address):
        return "ray", address or None
    raise ConfigError(f"--cluster {value!r}: must be local, ray, ray:ADDRESS (ray:auto for the Ray cluster "
                      "`ray start --head` runs on this machine, ray:ray://HOST:10001 for a remote one), or "
                      "tcp://HOST:PORT (the scheduler of a cluster that runs already)")


def open_cluster(*, servers: int, workers: int, cluster: str = "local", **options: Any) -> Cluster:
    """A ``LocalCluster`` or a ``RayCluster`` (not started: use it as a context manager);
    what a job may use of either is ``protocol.Cluster`` (mypy checks both launchers
    against it here)."""
    kind, address = parse_cluster(cluster)
    if kind == "ray":  # Ray's nodes are actors, not forks of this process: nothing to warm for them
        options.pop("warm", None)
    if kind == "local":
        from paramserver.cluster.local import LocalCluster

        return LocalCluster(servers=servers, workers=workers, **options)
    if kind == "running":
        from paramserver.cluster.standing import StandingCluster

        assert address is not None
        return StandingCluster(address, workers=workers, **options)
    try:
        from paramserver.cluster.ray import RayCluster
    except ImportError as exc:
        raise ConfigError(f"--cluster {cluster}: Ray is not installed ({exc}); pip install 'paramserver[ray]'") \
            from None
    return RayCluster(servers=servers, workers=workers, address=address, **options)
