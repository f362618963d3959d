"""The ring: which server owns which vnode, at which epoch.

The hash space [0, 2**64) is cut into ``n_vnodes`` equal arcs (vnodes); each vnode is
owned by one server.  This is consistent hashing with virtual nodes in the form Dynamo
calls "strategy 3" (fixed equal partitions, assigned to nodes): a key's vnode never
changes, only a vnode's owner does, so

* balance is exact to one vnode (random vnode positions give ~1/sqrt(v) spread: 12 % at
  64 vnodes/server, before the largest-of-S effect),
* finding owners is O(1) per key (no binary search): ``owner[vnode(hash(key))]``,
* a join or leave moves whole vnodes, and only the ones that change owner.

A ``Ring`` is immutable; membership changes return a new ring with ``epoch + 1``.
Sans-IO: nothing here touches a socket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paramserver.errors import ConfigError
from paramserver.routing.hashing import vnodes_of_keys


@dataclass(frozen=True)
class Ring:
    """Vnode → server assignment at one epoch.

    Args:
        owners: ``int32[n_vnodes]``, the server id owning each vnode.
        epoch: version of this assignment; every request carries the epoch it was
            routed with.
    """

    owners: np.ndarray
    epoch: int = 1
    _rank: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        owners = np.ascontiguousarray(self.owners, dtype=np.int32)
        owners.setflags(write=False)
        object.__setattr__(self, "owners", owners)
        # Rank of each vnode in (owner, vnode) order: a key batch sorted by rank is
        # grouped by server, and inside a server by vnode (one counting sort).
        order = np.lexsort((np.arange(owners.size), owners))
        rank = np.empty(owners.size, np.int32)
        rank[order] = np.arange(owners.size, dtype=np.int32)
        rank.setflags(write=False)
        object.__setattr__(self, "_rank", rank)

    @classmethod
    def create(cls, servers: list[int], vnodes_per_server: int = 64, epoch: int = 1) -> Ring:
        """A balanced ring over ``servers``: vnode ``i`` goes to ``servers[i % S]``.

        Interleaving puts distinct servers next to each other, which is what replica
        placement (the next r−1 distinct servers clockwise) wants.
        """
        if not servers:
            raise ConfigError("a ring needs at least one server, got none")
        if vnodes_per_server < 1:
            raise ConfigError(
                f"vnodes_per_server must be >= 1, got {vnodes_per_server}; 64 is a good default"
            )
        if len(set(servers)) != len(servers):
            raise ConfigError(f"server ids must be distinct, got {servers}")
        n = len(servers) * vnodes_per_server
        owners = np.asarray(servers, np.int32)[np.arange(n) % len(servers)]
        return cls(owners, epoch)

    # ---- lookups -----------------------------------------------------------------
    @property
    def n_vnodes(self) -> int:
        return int(self.owners.size)

    @property
    def servers(self) -> list[int]:
        return sorted(set(self.owners.tolist()))

    @property
    def vnode_rank(self) -> np.ndarray:
        return self._rank

    def vnodes(self, keys: np.ndarray) -> np.ndarray:
        """Vnode of every key (vectorised)."""
        return vnodes_of_keys(np.ascontiguousarray(keys, np.uint64), self.n_vnodes)

    def owner_of_keys(self, keys: np.ndarray) -> np.ndarray:
        """Server id of every key (vectorised)."""
        return self.owners[self.vnodes(keys)]

    def vnodes_of(self, server: int) -> np.ndarray:
        return np.flatnonzero(self.owners == server)

    def replicas(self, vnode: int, r: int) -> list[int]:
        """Primary and the next ``r - 1`` distinct servers clockwise from ``vnode``."""
        out: list[int] = []
        n = self.n_vnodes
        for step in range(n):
            s = int(self.owners[(vnode + step) % n])
            if s not in out:
                out.append(s)
                if len(out) == r:
                    break
        return out

    # ---- membership changes ------------------------------------------------------
    def with_server(self, server: int) -> Ring:
        """Add ``server``: it takes vnodes one by one from the most loaded servers."""
        if server in self.servers:
            raise ConfigError(f"server {server} is already on the ring")
        owners = self.owners.copy()
        target = self.n_vnodes // (len(self.servers) + 1)
        for _ in range(target):
            ids, counts = np.unique(owners, return_counts=True)
            donor = ids[np.argmax(counts)]  # most loaded, lowest id on ties
            owners[np.flatnonzero(owners == donor)[-1]] = server
        return Ring(owners, self.epoch + 1)

    def without_server(self, server: int) -> Ring:
        """Remove ``server``: each of its vnodes goes to the least loaded survivor."""
        if server not in self.servers:
            raise ConfigError(f"server {server} is not on the ring (servers: {self.servers})")
        if len(self.servers) == 1:
            raise ConfigError("cannot remove the last server of the ring")
        owners = self.owners.copy()
        survivors = [s for s in self.servers if s != server]
        for v in np.flatnonzero(owners == server):
            counts = [(int(np.count_nonzero(owners == s)), s) for s in survivors]
            owners[v] = min(counts)[1]
        return Ring(owners, self.epoch + 1)

    # ---- wire form -------------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "owners": self.owners.tolist()}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Ring:
        return cls(np.asarray(d["owners"], np.int32), int(d["epoch"]))
