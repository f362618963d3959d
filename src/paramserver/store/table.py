"""The store of one (table, vnode): an open-addressing hash table uint64 key → float32 row.

Layout (20 bytes a slot for a dim-1 FTRL table): one buffer of ``capacity + 1`` slots,
each a key and its row side by side (``[key | w z n]``), seen as two strided views:

* ``keys``: ``uint64[capacity]``, 0 marks an empty slot;
* ``rows``: ``float32[capacity + 1, width]``, ``width = dim + state_width``; the extra
  last row belongs to key 0, which therefore needs no sentinel trick: every uint64,
  0 and 2**64 − 1 included, is a valid key.

A key and its row share a cache line (or, for a slot that straddles two, the next one):
a probe that finds its key has fetched its row.  Kept as two arrays, they cost two misses
a key (``bench/engine.py``: 15 M FTRL updates a second on a 10^7-key table, against
about 45 M for slots and the request loops of ``loops/slots.py``).

Linear probing from the slot given by the low 32 bits of ``hash64(key)`` (the high bits
chose the vnode).  The load stays at most 7/8; growth is by 1.25× so that resident memory
per key stays between 20/0.875 and 20/0.7 bytes (dim-1 FTRL), whatever the key count past
``SMALL_SLOTS`` (a smaller vnode takes three steps of the same ladder at once).
Capacities are not powers of two (``slot_of_hash`` is a multiply-shift).

Pulls never insert: a key not in the table reads as its deterministic initial value.
Pushes insert (initial value + fresh state) then apply the optimiser.

With ``TableSpec.storage`` ``"fp16"`` or ``"bf16"``, ``rows`` holds 16-bit patterns
(``compact.py``: 14 bytes a slot for dim-1 FTRL); the kernels decode and encode them.  With
``TableSpec.key_bytes`` 4, ``keys`` is ``uint32`` (16 bytes a slot for dim-1 FTRL, four to a
cache line: a probe and an update on the default job's key stream 19-20 ns a key against
25-28 for 20-byte slots, one core; ``loops/tags.py``).

A dense table (``TableSpec.key_bits``) stores a plain array instead (``dense.py``), and a
server works all the vnodes of a table it holds together (``vnodes.py``).

The loops are numba code in ``loops/hash.py``.  Every loop prefetches the row (hash: the
home slot) of the key ``PREFETCH_AHEAD`` keys on, so the cache misses of a request
overlap.  ``bench/table.py`` (pull of batch t+1 between the pull and the push of batch t,
as a worker pipelines them; 1e6 synthetic Criteo rows, dim-1 FTRL) measured ns a key for
lookup + update: hash 57 + 102 without prefetching, 35 + 66 with; dense 36 + 87 without,
11 + 29 with.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paramserver._runtime.intrinsics import frozen
from paramserver.store.compact import ROW_DTYPES, decode_rows, encode_rows
from paramserver.store.disk import DiskArena
from paramserver.store.kernels import Kernels, kernels_for
from paramserver.store.loops import hash as hash_loops
from paramserver.store.loops import life as life_loops
from paramserver.store.loops.hash import COUNT, HAS_ZERO
from paramserver.store.memory import heap_released, huge_capacity, new_slots, on_heap, slot_views, slots_bytes
from paramserver.tables.optim import Initializer, Optimizer
from paramserver.tables.push_ops import OP_UPDATE

MAX_LOAD = 0.875
COLD_LOAD = 0.75
GROWTH = 1.25
MIN_CAPACITY = 8
#: a vnode of fewer slots grows ``SMALL_STEPS`` steps of the ×1.25 ladder at once (×1.95):
#: each growth moves every key and costs the request a return to Python, and at ×1.25 a
#: vnode climbs from 8 slots in 35 steps to the default job's ~25 000.  A vnode past it
#: steps one at a time on the same ladder, so a table of any size ends at the capacities,
#: and the bytes a key, it always had; a small one holds at most ~80 KB more.
SMALL_SLOTS = 4096
SMALL_STEPS = 3


class VnodeTable:
    """Hash table of one (table, vnode).

    Args:
        dim: values per key.
        optimizer: an ``Optimizer`` spec (fixes the state width and the update rule).
        initializer: an ``Initializer`` spec.
        seed: table seed; a key's initial row depends only on (seed, key).
        storage: ``TableSpec.storage``: ``"float32"``, or ``"fp16"``/``"bf16"`` for rows of
            16-bit columns (``compact.py``).
    """

    META_WIDTH = 2  # ``meta``: COUNT, HAS_ZERO (``loops/hash.py``)

    def __init__(self, dim: int, optimizer: Optimizer, initializer: Initializer, seed: int,
                 capacity: int = MIN_CAPACITY, kernels: Kernels | None = None, life_width: int = 0,
                 storage: str = "float32", arena: DiskArena | None = None, key_bytes: int = 8) -> None:
        self.dim = dim
        self.key_bytes = key_bytes
        self.arena = arena  # where the arrays are made: memory (None), or a cold tier's files
        # a cold tier's vnodes are kept at most 3/4 full: a key not there (most probes of it:
        # new keys) is found missing in ~8 probes of one or two cache lines, not the ~32 of a
        # 7/8 full table, in files 2/3 the size a half-full one took (under a memory limit,
        # fewer pages to read back from disk)
        self.max_load = MAX_LOAD if arena is None else COLD_LOAD
        self.life_width = life_width  # columns of the lifecycle's life rows (``loops/life.py``), 0: none
        self.width = dim + optimizer.state_width(dim)
        self.dtype = ROW_DTYPES[storage]
        if kernels is None:
            kernels = kernels_for(optimizer, dim, storage)
        self._apply_kernel: Any = kernels.apply
        self._rehash: Any = kernels.request.rehash if kernels.request is not None else hash_loops.rehash
        self._okind, self._ohp = optimizer.kind, optimizer.params()
        self._ikind, self._ihp = initializer.kind, initializer.params()
        self._seed = np.uint64(seed)
        self._meta = np.zeros(self.META_WIDTH, np.int64)
        self._ladder = max(MIN_CAPACITY, capacity)  # the capacity asked for, before ``_filled``
        self._alloc(self._filled(self._ladder))

    def _filled(self, capacity: int) -> int:
        """The capacity a vnode of ``capacity`` slots takes: in memory, raised to fill its last
        huge page where that is cheap (``memory.huge_capacity``)."""
        return capacity if self.arena is not None else huge_capacity(capacity, self.width, self.dtype,
                                                                      self.key_bytes)

    def _alloc(self, capacity: int) -> None:
        if self.arena is not None:
            self._alloc_on(self.arena, capacity)
            return
        self.slots = new_slots(capacity, self.width, self.dtype, self.key_bytes)
        self.keys, self.rows = slot_views(self.slots, capacity, self.width, self.dtype, self.key_bytes)
        self.life: np.ndarray | None = \
            np.zeros((capacity + 1, self.life_width), np.float32) if self.life_width else None

    def _alloc_on(self, arena: DiskArena, capacity: int) -> None:
        """The slots and life rows in one array of ``arena`` (one file, not two)."""
        size = slots_bytes(capacity, self.width, self.dtype, self.key_bytes)
        size += -size % 8  # the life rows start aligned
        whole = arena.zeros((size + 4 * (capacity + 1) * self.life_width,), np.uint8)
        self._disk = whole  # the arena counts its bytes while it lives
        self.slots = whole[:size]
        self.keys, self.rows = slot_views(self.slots, capacity, self.width, self.dtype, self.key_bytes)
        self.life = whole[size:].view(np.float32).reshape(capacity + 1, self.life_width) if self.life_width else None

    def __len__(self) -> int:
        return int(self._meta[COUNT])

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[0])

    @property
    def has_zero(self) -> bool:
        """Whether key 0 (which owns the last row) is stored."""
        return bool(self._meta[HAS_ZERO])

    @property
    def nbytes(self) -> int:
        return int(self.slots.nbytes + (self.life.nbytes if self.life is not None else 0))

    def _limit(self) -> int:
        return int(self.capacity * self.max_load)  # < capacity: a probe always meets an empty slot

    def _grow(self, needed: int) -> int:
        """Room for ``needed`` keys; the heap bytes let go for good, once the old slots are
        dropped (``memory.heap_released``: the vnode moved off the heap)."""
        cap = self._ladder  # the ladder's step, not the capacity ``_filled`` raised it to
        for _ in range(SMALL_STEPS if cap < SMALL_SLOTS else 1):
            cap = int(cap * GROWTH) + 1
        cap = max(cap, int(needed / self.max_load) + 2)
        old_keys, old_rows, old_life, old_meta = self.keys, self.rows, self.life, self._meta.copy()
        old_bytes = self.slots.nbytes
        self._alloc(self._filled(cap))
        self._ladder = cap
        no_life = np.zeros((0, 0), np.float32)
        self._rehash(old_keys, old_meta, old_rows, old_life if old_life is not None else no_life, self.keys,
                          self._meta, self.rows, self.life if self.life is not None else no_life)
        return old_bytes if on_heap(old_bytes) and not on_heap(self.slots.nbytes) else 0

    def lookup(self, keys: np.ndarray, out: np.ndarray) -> None:
        """``out[i] = row value of keys[i]`` (initial value for keys never pushed)."""
        hash_loops.lookup(self.keys, self.rows, self._meta, keys, out, self.dim, self._ikind, self._ihp, self._seed)

    def apply(self, keys: np.ndarray, grads: np.ndarray, op: int = OP_UPDATE) -> None:
        """Apply one gradient row per key (keys should be unique; duplicates apply in turn)."""
        i = 0
        while True:
            i = self._apply_kernel(self.keys, self.rows, self._meta, keys, grads, i, self._limit(), self.dim, op,
                                   self._okind, self._ohp, self._ikind, self._ihp, self._seed)
            if i == keys.shape[0]:
                return
            heap_released(self._grow(len(self) + 1))

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All stored keys and their full rows (value and state), in slot order, as float32."""
        keys, rows, _ = self._occupied()
        return keys, decode_rows(rows, self.dim, self.width)

    def keys_at(self, slots: np.ndarray) -> np.ndarray:
        """The keys of occupied ``slots`` (a fingerprinted vnode reads them aside)."""
        return np.asarray(self.keys[slots], np.uint64)

    def _occupied(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The stored keys, their rows as stored (``storage``'s format) and life rows."""
        occupied = np.flatnonzero(self.keys)
        keys, rows = self.keys_at(occupied), self.rows[occupied]
        life = self.life[occupied] if self.life is not None else None
        if self._meta[HAS_ZERO]:
            keys = np.append(keys, np.uint64(0))
            rows = np.vstack([rows, self.rows[-1:]])
            life = np.vstack([life, self.life[-1:]]) if life is not None and self.life is not None else life
        return keys, rows, life

    def changed(self, column: int, since: float) -> tuple[np.ndarray, np.ndarray]:
        """The stored keys whose life row's ``column`` is at least ``since``, and their
        rows (float32): a scan of that column, then only the rows asked for are copied."""
        assert self.life is not None, "a table without a lifecycle has no life rows"
        slots = np.flatnonzero(self.life[:-1, column] >= since)
        slots = slots[self.keys[slots] != 0]
        keys, rows = self.keys_at(slots), self.rows[slots]
        if self._meta[HAS_ZERO] and self.life[-1, column] >= since:
            keys, rows = np.append(keys, np.uint64(0)), np.vstack([rows, self.rows[-1:]])
        return keys, decode_rows(rows, self.dim, self.width)

    def stored(self, keys: np.ndarray) -> np.ndarray:
        """``bool[len(keys)]``: which of ``keys`` are stored (the others read as initial values)."""
        out = np.zeros(keys.shape[0], np.bool_)
        hash_loops.stored(self.keys, self._meta, frozen(np.ascontiguousarray(keys, np.uint64)), out)
        return out

    def remove(self, keys: np.ndarray) -> int:
        """Remove ``keys`` in place (a lifecycle's table: ``loops/life.delete``); how
        many were stored.  The arrays keep their size (new keys reuse the slots)."""
        assert self.life is not None, "in-place removal moves life rows: a lifecycle's tables only"
        return int(life_loops.delete(self.keys, self.rows, self._meta, self.life,
                           frozen(np.ascontiguousarray(keys, np.uint64))))

    def keep(self, mask: np.ndarray, room: int = 0, capacity: int = 0) -> None:
        """Keep only the keys ``mask`` marks (in ``items()``'s order), in new arrays with
        room for ``room`` keys (at least those kept), or of ``capacity`` slots (which must
        hold them), so the memory of the others is freed."""
        keys, rows, life = self._occupied()  # rows as stored: moved, not decoded and encoded again
        keys, rows = np.ascontiguousarray(keys[mask]), np.ascontiguousarray(rows[mask])
        asked = capacity or max(MIN_CAPACITY, int(max(keys.shape[0], room) / self.max_load) + 2)
        self._alloc(self._filled(asked))
        self._ladder = asked
        self._meta[COUNT] = self._meta[HAS_ZERO] = 0  # (after: arrays on disk may fail to be made)
        hash_loops.insert_rows(self.keys, self.rows, self._meta, frozen(keys), frozen(rows))
        if life is not None:
            self.set_life(keys, life[mask])

    def set_life(self, keys: np.ndarray, life: np.ndarray) -> None:
        """Set the life rows of stored ``keys`` (a lifecycle's table)."""
        assert self.life is not None, "a table without a lifecycle has no life rows"
        life_loops.place_life(self.keys, self._meta, self.life, frozen(np.ascontiguousarray(keys, np.uint64)),
                    frozen(np.ascontiguousarray(life, np.float32)))

    def load(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Set whole rows (value and state) for ``keys``, inserting those not present."""
        if len(self) + keys.shape[0] >= self._limit():
            heap_released(self._grow(len(self) + keys.shape[0]))
        keys = np.ascontiguousarray(keys, np.uint64)
        hash_loops.insert_rows(self.keys, self.rows, self._meta, frozen(keys), frozen(encode_rows(rows, self.dim, keys,
                                                                                         self.dtype)))
