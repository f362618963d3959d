"""``paramserver.ray``: the import path of ``RayCluster``, a cluster of Ray actors (its code is
in ``cluster/ray.py``; ``docs/deploy.md``)."""

from paramserver.cluster.ray import RayCluster

__all__ = ["RayCluster"]
