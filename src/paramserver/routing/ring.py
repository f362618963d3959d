"""The ring: which servers hold which vnode, at which version.

The hash space [0, 2**64) is cut into ``n_vnodes`` equal arcs (vnodes; a dense table
cuts its 2**key_bits key positions the same way, see ``hashing``); each vnode has a
*chain* of up to ``MAX_REPLICAS`` distinct servers: the primary, then its backups.  This
is consistent hashing with virtual nodes in the form Dynamo calls "strategy 3" (fixed
equal partitions, assigned to nodes): a key's vnode never changes, only a vnode's chain
does, so

* balance is exact to one vnode (random vnode positions give ~1/sqrt(v) spread: 12 % at
  64 vnodes/server, before the largest-of-S effect),
* finding owners is O(1) per key (no binary search): ``owners[vnode(hash(key))]``,
* a join or leave moves whole vnodes, and only the ones whose chain changes.

A table with replication factor ``r`` lives on the first ``r`` servers of each chain.
The backups of one server's vnodes are spread over all the other servers, so when it
dies its vnodes are promoted to (and their load spread over) every survivor.

A ``Ring`` is immutable; membership changes return a new ring with ``version + 1``.
Sans-IO: nothing here touches a socket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paramserver._runtime.intrinsics import frozen
from paramserver.errors import ConfigError
from paramserver.routing.hashing import vnodes_of_keys

#: longest chain (primary + backups); a table's replication factor is at most this
MAX_REPLICAS = 3
#: most vnodes a ring may have (the routing kernels' arithmetic stays in 64 bits)
MAX_VNODES = 1 << 20


@dataclass(frozen=True)
class Ring:
    """Vnode → chain of servers at one version.

    Args:
        chains: ``int32[n_vnodes, MAX_REPLICAS]``: the primary of each vnode, then its
            backups; ``-1`` pads chains shorter than ``MAX_REPLICAS``.  A 1-d array is
            taken as the primaries alone.
        version: the ring's version, one more at every change; every request carries
            the version it was routed with.  (A pass over the data is an *epoch*; the
            ring has versions.)
    """

    chains: np.ndarray
    version: int = 1
    _rank: np.ndarray = field(init=False, repr=False, compare=False)
    _owners: np.ndarray = field(init=False, repr=False, compare=False)
    _by_rank: np.ndarray = field(init=False, repr=False, compare=False)
    _groups: tuple[tuple[int, int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        chains = np.asarray(self.chains, dtype=np.int32)
        if chains.ndim == 1:
            chains = np.column_stack([chains, np.full((chains.size, MAX_REPLICAS - 1), -1, np.int32)])
        if chains.ndim != 2 or chains.shape[1] != MAX_REPLICAS or not 1 <= chains.shape[0] <= MAX_VNODES:
            raise ConfigError(f"ring chains must be int[n_vnodes, {MAX_REPLICAS}] with 1 <= n_vnodes <= "
                              f"{MAX_VNODES} (fewer vnodes_per_server), got shape {chains.shape}")
        chains = np.ascontiguousarray(chains)
        chains.setflags(write=False)
        object.__setattr__(self, "chains", chains)
        owners = np.ascontiguousarray(chains[:, 0])
        owners.setflags(write=False)
        object.__setattr__(self, "_owners", owners)
        # Rank of each vnode in (owner, vnode) order: a key batch sorted by rank is
        # grouped by server, and inside a server by vnode (one counting sort).
        order = np.lexsort((np.arange(owners.size), owners))
        rank = np.empty(owners.size, np.int32)
        rank[order] = np.arange(owners.size, dtype=np.int32)
        rank.setflags(write=False)
        object.__setattr__(self, "_rank", rank)
        by_rank = order.astype(np.int32)  # the vnode at each rank
        by_rank.setflags(write=False)
        object.__setattr__(self, "_by_rank", by_rank)
        cuts = [0, *(np.flatnonzero(np.diff(owners[order])) + 1).tolist(), owners.size]
        object.__setattr__(self, "_groups", tuple((int(owners[order[lo]]), lo, hi) for lo, hi in zip(cuts, cuts[1:])))

    @classmethod
    def create(cls, servers: list[int], vnodes_per_server: int = 64, version: int = 1) -> Ring:
        """A balanced ring over ``servers``: vnode ``i`` has primary ``servers[i % S]``.

        The backups of one server's vnodes cycle through all the other servers.
        """
        if not servers:
            raise ConfigError("a ring needs at least one server, got none")
        if vnodes_per_server < 1:
            raise ConfigError(
                f"vnodes_per_server must be >= 1, got {vnodes_per_server}; 64 is a good default"
            )
        if len(set(servers)) != len(servers):
            raise ConfigError(f"server ids must be distinct, got {servers}")
        s = len(servers)
        n = s * vnodes_per_server
        ids = np.asarray(servers, np.int32)
        v = np.arange(n)
        primary, q = v % s, v // s
        chains = np.full((n, MAX_REPLICAS), -1, np.int32)
        chains[:, 0] = ids[primary]
        for j in range(1, min(MAX_REPLICAS, s)):
            # offsets 1 .. s-1, distinct per column, cycling with q: backups spread out
            chains[:, j] = ids[(primary + 1 + (q + j - 1) % (s - 1)) % s]
        return cls(chains, version)

    # ---- lookups -----------------------------------------------------------------
    @property
    def owners(self) -> np.ndarray:
        """``int32[n_vnodes]``: the primary of every vnode."""
        return self._owners

    @property
    def n_vnodes(self) -> int:
        return int(self._owners.size)

    @property
    def servers(self) -> list[int]:
        return sorted(int(s) for s in np.unique(self.chains) if s >= 0)

    @property
    def vnode_rank(self) -> np.ndarray:
        return self._rank

    @property
    def by_rank(self) -> np.ndarray:
        """``int32[n_vnodes]``: the vnode at each rank (the inverse of ``vnode_rank``)."""
        return self._by_rank

    @property
    def rank_groups(self) -> tuple[tuple[int, int, int], ...]:
        """``(server, first rank, end rank)`` of each server's vnodes in rank order: a batch
        sorted by rank is one slice per server."""
        return self._groups

    def vnodes(self, keys: np.ndarray, layout: int = 0) -> np.ndarray:
        """Vnode of every key (vectorised); ``layout``: the table's (``TableSpec.layout``)."""
        vnodes: np.ndarray = vnodes_of_keys(frozen(np.ascontiguousarray(keys, np.uint64)), self.n_vnodes, layout)
        return vnodes

    def owner_of_keys(self, keys: np.ndarray, layout: int = 0) -> np.ndarray:
        """Server id of every key (vectorised)."""
        owners: np.ndarray = self._owners[self.vnodes(keys, layout)]
        return owners

    def vnodes_of(self, server: int) -> np.ndarray:
        """Vnodes whose primary is ``server``."""
        return np.flatnonzero(self._owners == server)

    def held_by(self, server: int, r: int) -> np.ndarray:
        """Vnodes a table of replication factor ``r`` stores on ``server``."""
        return np.flatnonzero((self.chains[:, :r] == server).any(axis=1))

    def replicas(self, vnode: int, r: int) -> list[int]:
        """Primary and up to ``r - 1`` backups of ``vnode``."""
        return [int(s) for s in self.chains[vnode, :r] if s >= 0]

    # ---- membership changes ------------------------------------------------------
    def without_server(self, server: int) -> Ring:
        """Drop ``server`` from every chain: its first backup becomes primary (no data
        moves, so this is the failover ring); chains are one shorter until ``refilled``."""
        if server not in self.servers:
            raise ConfigError(f"server {server} is not on the ring (servers: {self.servers})")
        if len(self.servers) == 1:
            raise ConfigError("cannot remove the last server of the ring")
        chains = self.chains.copy()
        for v in np.flatnonzero((chains == server).any(axis=1)):
            rest = [s for s in chains[v] if s != server]
            chains[v] = rest + [-1]
        return Ring(chains, self.version + 1)

    def refilled(self) -> Ring:
        """Lengthen short chains to ``min(MAX_REPLICAS, servers)`` with the least loaded
        servers (re-replication after a failover); the same ring if nothing is short."""
        chains = self.chains.copy()
        if not self._refill(chains, self.servers):
            return self
        return Ring(chains, self.version + 1)

    def with_server(self, server: int) -> Ring:
        """Add ``server``: it takes an equal share of every chain position, from the most
        loaded servers, and fills chains that were short."""
        servers = self.servers
        if server in servers:
            raise ConfigError(f"server {server} is already on the ring")
        chains = self.chains.copy()
        n, s = self.n_vnodes, len(servers) + 1
        for j in range(min(MAX_REPLICAS, s - 1)):
            for _ in range(n // s):
                column = chains[:, j]
                free = ~(chains == server).any(axis=1) & (column >= 0)
                if not free.any():
                    break
                ids, counts = np.unique(column[free], return_counts=True)
                donor = ids[np.argmax(counts)]  # most loaded, lowest id on ties
                chains[np.flatnonzero(free & (column == donor))[-1], j] = server
        self._refill(chains, [*servers, server])
        return Ring(chains, self.version + 1)

    @staticmethod
    def _refill(chains: np.ndarray, servers: list[int]) -> bool:
        width = min(MAX_REPLICAS, len(servers))
        changed = False
        for j in range(1, width):
            for v in np.flatnonzero(chains[:, j] < 0):
                load = {sv: int(np.count_nonzero(chains[:, j] == sv)) for sv in servers
                        if sv not in chains[v, :j]}
                chains[v, j] = min(load, key=lambda sv: (load[sv], sv))
                changed = True
        return changed

    # ---- wire form -------------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        return {"version": self.version, "chains": self.chains.tolist()}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Ring:
        # checkpoints written before the ring's version was so named call it "epoch"
        version = d["version"] if "version" in d else d["epoch"]
        return cls(np.asarray(d["chains"], np.int32), int(version))


def plan_moves(old: Ring, new: Ring, replicas: dict[str, int],
               lost: frozenset[int] | set[int] = frozenset(),
               incomplete: frozenset[tuple[str, int, int]] | set[tuple[str, int, int]] = frozenset(),
               ) -> list[tuple[int, str, int, int]]:
    """What must be copied to go from ``old`` to ``new``: ``(source, table, vnode, dest)``
    for every server that holds a vnode of a table under ``new`` but not under ``old``
    (a table of factor ``r`` lives on the first ``r`` servers of a chain).

    ``lost`` servers died: they hold nothing and copy nothing; ``incomplete`` lists
    ``(table, vnode, server)`` copies not confirmed yet: such a holder is copied to again.
    The source is the first complete live holder, which is the vnode's primary under
    ``new`` (it sees every write).  When no complete copy survived (two failures within
    one repair) the first live holder, incomplete as it is, becomes the source so that
    the replicas agree again; a vnode with no live holder at all is skipped.
    """
    moves = []
    redo = {(t, v) for t, v, _ in incomplete}
    for table, r in sorted(replicas.items()):
        changed = (old.chains[:, :r] != new.chains[:, :r]).any(axis=1)
        for v in np.flatnonzero(changed).tolist() + sorted(v for t, v in redo if t == table and not changed[v]):
            live = [int(s) for s in old.chains[v, :r] if s >= 0 and s not in lost]
            before = [s for s in live if (table, v, s) not in incomplete]
            if not before:  # no complete copy survived: the data is gone; make every holder
                before = live[:1]  # equal to the best left, the first live (the primary)
            if not before:
                continue
            for dest in new.chains[v, :r].tolist():
                if dest >= 0 and dest not in before and dest not in lost:
                    moves.append((before[0], table, v, int(dest)))
    return moves
