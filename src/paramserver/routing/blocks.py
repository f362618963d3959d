"""Where a range-partitioned table's parameter blocks are (``TableSpec.block_size``).

Block ``j`` is keys ``[j B, (j + 1) B)``.  Each vnode holds a run of whole blocks
(``hashing.block_vnode``), so a block's server is read off the ring the client already has: no request asks
where it is, and a block is always one request.  A scheduler that gives each worker
the blocks of one server (``of_server``) spreads its rounds' traffic over the servers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paramserver.errors import ConfigError
from paramserver.routing.hashing import dense_range, layout_code, vnodes_of_keys
from paramserver.routing.ring import Ring


@dataclass(frozen=True)
class BlockMap:
    """The blocks of table ``table`` against one ring.

    Args:
        table: the table's name (for errors).
        block_size: keys per block (a power of two).
        n_blocks: blocks in the table: ``2**key_bits / block_size``.
        ring: the ring the places are read from.
    """

    table: str
    block_size: int
    n_blocks: int
    ring: Ring

    @property
    def ring_version(self) -> int:
        return self.ring.version

    @property
    def _shift(self) -> int:
        return self.block_size.bit_length() - 1

    @property
    def _layout(self) -> int:
        return layout_code((self.n_blocks * self.block_size).bit_length() - 1, self.block_size)

    def _check(self, blocks: np.ndarray) -> np.ndarray:
        blocks = np.asarray(blocks)
        if blocks.dtype.kind not in "iu":
            raise ConfigError(f"table {self.table!r}: blocks must be integers, got dtype {blocks.dtype}")
        blocks = blocks.astype(np.int64, copy=False)
        if blocks.size and (blocks.min() < 0 or blocks.max() >= self.n_blocks):
            bad = blocks[(blocks < 0) | (blocks >= self.n_blocks)][0]
            raise ConfigError(f"table {self.table!r}: block {int(bad)} is out of range: it has {self.n_blocks} "
                              f"blocks of {self.block_size} keys (0..{self.n_blocks - 1})")
        return blocks

    def keys(self, block: int) -> np.ndarray:
        """The keys of ``block``, in order: ``uint64[block_size]``."""
        b = int(self._check(np.array([block]))[0])
        return np.arange(b * self.block_size, (b + 1) * self.block_size, dtype=np.uint64)

    def block_of(self, keys: np.ndarray) -> np.ndarray:
        """The block of every key (``int64``)."""
        return (np.asarray(keys, np.uint64) // np.uint64(self.block_size)).astype(np.int64)

    def vnode_of(self, blocks: np.ndarray | int) -> np.ndarray:
        """The vnode holding each block (vectorised)."""
        first_keys = self._check(np.atleast_1d(blocks)).astype(np.uint64) << np.uint64(self._shift)
        vnodes: np.ndarray = vnodes_of_keys(first_keys, self.ring.n_vnodes, self._layout)
        return vnodes

    def server_of(self, blocks: np.ndarray | int) -> np.ndarray:
        """The primary server of each block (vectorised): where its one request goes."""
        servers: np.ndarray = self.ring.owners[self.vnode_of(blocks)].astype(np.int64)
        return servers

    def of_server(self, server: int) -> np.ndarray:
        """Every block whose primary is ``server``, ascending (``int64``)."""
        n, shift = self.ring.n_vnodes, self._shift
        runs = [np.arange(lo >> shift, hi >> shift, dtype=np.int64)
                for v in np.flatnonzero(self.ring.owners == int(server))
                for lo, hi in [dense_range(int(v), n, self._layout)]]
        return np.concatenate(runs) if runs else np.zeros(0, np.int64)

    def by_server(self) -> dict[int, np.ndarray]:
        """``{server: its blocks}`` for every server of the ring."""
        return {int(s): self.of_server(int(s)) for s in self.ring.servers}
