"""Where a ``RayCluster``'s nodes go: the Ray resources each role asks for, and the
placement group its first servers and workers are reserved in before any of them starts.

Apart from the cluster's lifecycle (``cluster/ray.py``) because it is Ray's resource model,
not ours: a role's CPUs are shared out when the Ray cluster has fewer free than it has
nodes (4 nodes on a 2-CPU machine get 0.5 each), the whole first cluster is placed at once
or not at all (a cluster half started would wait on the other half), and a node added
later goes outside the group and takes what is free rather than waiting for room forever.
"""

from __future__ import annotations

import math
from typing import Any

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from paramserver.errors import ConfigError, ConnectError

ROLES = ("scheduler", "server", "worker")
STRATEGIES = ("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK")


def free() -> dict[str, float]:
    """The Ray cluster's resources not taken."""
    return dict(ray.available_resources())  # type: ignore[no-untyped-call, unused-ignore]


def free_cpus() -> float:
    return float(free().get("CPU", 0.0))


class Placement:
    """The resources of each role (``RayCluster(resources=...)``), checked when given,
    and the placement group of the nodes ``reserve`` is told of."""

    def __init__(self, strategy: str, resources: dict[str, dict[str, Any]] | None, max_restarts: int):
        if strategy not in STRATEGIES:
            raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        unknown = sorted(set(resources or {}) - set(ROLES))
        if unknown:
            raise ConfigError(f"resources are given per role ({', '.join(ROLES)}), not {unknown}")
        for role, spec in (resources or {}).items():
            bad = sorted(set(spec) - {"num_cpus", "num_gpus", "memory", "resources"})
            if bad:
                raise ConfigError(f"resources[{role!r}]: {bad} are not Ray actor resources "
                                  "(num_cpus, num_gpus, memory, resources)")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ConfigError(f"max_restarts must be a whole number >= 0, got {max_restarts!r}")
        self.strategy, self.max_restarts = strategy, max_restarts
        self.resources = {role: dict((resources or {}).get(role, {})) for role in ROLES}
        self.role_cpus: dict[str, float] = {}
        self.bundles: list[dict[str, float]] = []
        self.group: Any = None

    def _cpus(self, role: str, available: float, nodes: int) -> float:
        given = self.resources[role].get("num_cpus")
        if given is not None:
            return float(given)
        if role == "scheduler":
            return 0.0
        return 1.0 if nodes <= available else max(0.01, math.floor(100 * available / max(1, nodes)) / 100)

    def _options(self, role: str, cpus: float) -> dict[str, Any]:
        spec = self.resources[role]
        options: dict[str, Any] = {"num_cpus": cpus, "max_concurrency": 8,
                                   "max_restarts": 0 if role == "scheduler" else self.max_restarts}
        for key in ("num_gpus", "memory", "resources"):
            if spec.get(key):
                options[key] = spec[key]
        return options

    def reserve(self, servers: int, workers: int, timeout_s: float) -> None:
        """The placement group of the first servers and workers, reserved before any starts."""
        nodes = servers + workers
        available = free_cpus()
        self.role_cpus = {role: self._cpus(role, available, nodes) for role in ROLES}
        bundles = []
        for role in ["server"] * servers + ["worker"] * workers:
            options = self._options(role, self.role_cpus[role])
            bundle = {"CPU": options["num_cpus"], "GPU": options.get("num_gpus", 0),
                      "memory": options.get("memory", 0), **options.get("resources", {})}
            bundles.append({k: float(v) for k, v in bundle.items() if v} or {"CPU": 0.01})
        self.bundles = bundles
        self.group = placement_group(bundles, strategy=self.strategy)
        try:
            ray.get(self.group.ready(), timeout=timeout_s)
        except GetTimeoutError:
            raise ConnectError(
                f"Ray could not place {servers} server(s) and {workers} worker(s) "
                f"({self.strategy}) within {timeout_s:g} s: they ask for {bundles}, the Ray cluster has "
                f"{free()} free; ask for less (RayCluster(resources=...)) or add machines") from None

    def actor_options(self, role: str, bundle: int | None) -> dict[str, Any]:
        """A node's actor options: in bundle ``bundle`` of the group, or (``None``: the
        scheduler, and nodes added later) outside it."""
        if bundle is not None and self.group is not None:
            cpus = self.role_cpus[role]
            strategy: Any = PlacementGroupSchedulingStrategy(placement_group=self.group,
                                                             placement_group_bundle_index=bundle)
        else:
            available = free_cpus()
            cpus = self._cpus(role, available, 1) if role != "scheduler" else self.role_cpus["scheduler"]
            if self.resources[role].get("num_cpus") is None and role != "scheduler":
                cpus = min(cpus, available)  # a node added on a full machine shares it rather than waits forever
            strategy = "DEFAULT"
        return {"scheduling_strategy": strategy, **self._options(role, cpus)}

    def remove(self) -> None:
        """Give back the group's resources (``stop``), quietly: Ray may be gone already."""
        if self.group is not None:
            try:
                remove_placement_group(self.group)
            except Exception:
                pass
