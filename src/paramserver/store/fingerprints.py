"""A memory budget's hot vnode with 16-bit fingerprints for keys
(``TableSpec.hot_keys="fingerprint"``): 9 bytes a slot for a dim-1 FTRL row in 16 bits.

A tiered table's hot vnode (``tiers.py``) is a hash vnode like any other (``table.py``),
whose slot is ``[key | row]`` with an 8-byte key and, beside it, a 4-byte ``seen`` stamp:
18 bytes a slot for dim-1 FTRL in ``bf16``, 22.7 a key at the loads a budget keeps.  Here
a slot is

* a 16-bit fingerprint of its key (``loops/tags.py``) in place of the key;
* the row, as stored (``TableSpec.storage``: 6 bytes for dim-1 FTRL in 16 bits);
* and a one-byte ``seen`` stamp, a *generation* (``Generations``) rather than a request
  count.

The full keys are kept aside, one a slot, in an array of the cold tier's files
(``disk.py``): the cold tier holds every key.  The probes never read it; a key is
written there when it takes a slot, and read back where a key's identity is needed: a
slot moved by a removal, the keys a settle demotes, an export, a rebuild.  Those are the
cold tier's pages, in the kernel's page cache, not the process's own memory.

What it costs: two keys whose fingerprints are equal, one on the other's probe, share a
row (``loops/tags.py``), so a model trained this way is not bit for bit the model trained
without a budget, as it is with full keys; ``docs/tiers.md`` has the measured loss.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paramserver.store.disk import DiskArena
from paramserver.store.kernels import Kernels
from paramserver.store.loops.tags import FP_META, SIDE
from paramserver.store.memory import huge_zeros
from paramserver.store.table import MIN_CAPACITY, VnodeTable
from paramserver.tables.optim import Initializer, Optimizer

#: a fingerprinted vnode holds up to this share of its slots (a full-key one 7/8): a
#: slot is half the size, so a few more probes a key cost less than the memory they save
FP_MAX_LOAD = 0.9
#: a fingerprinted vnode grows by this factor (a full-key one by 1.25): each growth makes
#: a file for its keys, and a vnode reaches its share of a budget in half as many steps
FP_GROWTH = 2.0
#: the keys of a vnode of fewer slots are kept in memory (a page's worth: no file for them)
HEAP_SLOTS = 512


def fingerprint_views(slots: np.ndarray, capacity: int, width: int, dtype: np.dtype[Any]) \
        -> tuple[np.ndarray, np.ndarray]:
    """The fingerprint column (``uint16[capacity]``) and the rows (``dtype[capacity + 1,
    width]``) of ``slots``, ``[fingerprint | row]`` a slot."""
    size = 2 + width * dtype.itemsize
    keys = np.ndarray((capacity,), np.uint16, slots, 0, (size,))
    rows = np.ndarray((capacity + 1, width), dtype, slots, 2, (size, dtype.itemsize))
    return keys, rows


class FingerprintTable(VnodeTable):
    """A hot vnode of fingerprints, its full keys in ``keys_arena`` (the cold tier's
    files).  Its one life column is ``seen``, a ``uint8`` generation."""

    META_WIDTH = FP_META

    def __init__(self, dim: int, optimizer: Optimizer, initializer: Initializer, seed: int, *,
                 keys_arena: DiskArena, capacity: int = MIN_CAPACITY, kernels: Kernels | None = None,
                 storage: str = "float32") -> None:
        self._keys_arena = keys_arena
        super().__init__(dim, optimizer, initializer, seed, capacity=capacity, kernels=kernels, life_width=1,
                         storage=storage)
        self.max_load = FP_MAX_LOAD

    def _filled(self, capacity: int) -> int:
        return capacity  # its slots are a tag and a row (not ``huge_capacity``'s key and row): as asked

    def _alloc(self, capacity: int) -> None:
        # the keys' file first: a full disk leaves the vnode as it was
        side = (np.zeros(capacity, np.uint64) if capacity < HEAP_SLOTS
                else self._keys_arena.zeros((capacity,), np.uint64))
        self.slots = huge_zeros((capacity + 1) * (2 + self.width * self.dtype.itemsize))
        self.keys, self.rows = fingerprint_views(self.slots, capacity, self.width, self.dtype)
        self.life = np.zeros((capacity + 1, 1), np.uint8)
        self.side = side
        self._meta[SIDE] = side.ctypes.data

    @property
    def nbytes(self) -> int:
        """The slots and ``seen`` stamps, and the keys while they are in memory (``HEAP_SLOTS``)."""
        return super().nbytes + (int(self.side.nbytes) if self.capacity < HEAP_SLOTS else 0)

    def _grow(self, needed: int) -> int:
        old_side = self.side  # read by the rehash, after ``_alloc`` made the new one
        released = super()._grow(max(needed, int(self.capacity * FP_GROWTH * self.max_load)))
        del old_side
        return released

    def keys_at(self, slots: np.ndarray) -> np.ndarray:
        return np.asarray(self.side[slots])


class Generations:
    """``seen`` stamps that fit a byte: a generation, 1 to 255, that steps every
    ``period`` requests and at every settle; when it would pass 255, every stamp (and the
    generation) comes down by 128, the oldest meeting at 1, and the period doubles, so a
    stamp's resolution follows the table's age."""

    TOP = 255
    DOWN = 128

    def __init__(self, period: int = 16) -> None:
        self.now = 1
        self.period = period
        self._next = float(period)

    def request(self, clock: float) -> bool:
        """A request at ``clock``; whether the stamps must come down first (``down``)."""
        if clock < self._next:
            return False
        self._next = clock + self.period
        return self.step()

    def step(self) -> bool:
        self.now += 1
        return self.now > self.TOP

    def down(self, lives: list[np.ndarray]) -> None:
        """Bring every stamp of ``lives`` (the hot vnodes' ``seen``) and the generation down."""
        for life in lives:
            seen = life[:, 0]
            big = seen > self.DOWN
            old = (seen > 0) & ~big
            seen[big] -= self.DOWN
            seen[old] = 1
        self.now -= self.DOWN
        self.period *= 2
