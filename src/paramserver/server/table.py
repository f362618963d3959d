"""The store of one (table, vnode): an open-addressing hash table uint64 key → float32 row.

Layout (20 bytes a slot for a dim-1 FTRL table):

* ``keys``: ``uint64[capacity]``, 0 marks an empty slot;
* ``rows``: ``float32[capacity + 1, width]``, ``width = dim + state_width``; the extra
  last row belongs to key 0, which therefore needs no sentinel trick: every uint64,
  0 and 2**64 − 1 included, is a valid key.

Linear probing from the slot given by the low 32 bits of ``hash64(key)`` (the high bits
chose the vnode).  The load stays at most 7/8; growth is by 1.25× so that resident memory
per key stays between 20/0.875 and 20/0.7 bytes (dim-1 FTRL), whatever the key count.
Capacities are not powers of two (``slot_of_hash`` is a multiply-shift).

Pulls never insert: a key not in the table reads as its deterministic initial value.
Pushes insert (initial value + fresh state) then apply the optimiser.

With ``TableSpec.storage`` ``"fp16"`` or ``"bf16"``, ``rows`` holds 16-bit patterns
(``compact.py``: 14 bytes a slot for dim-1 FTRL); the kernels decode and encode them.

A dense table (``TableSpec.key_bits``) stores a plain array instead (``dense.py``), and a
server works all the vnodes of a table it holds together (``vnodes.py``).

Every kernel prefetches the row (hash: the home slot) of the key ``PREFETCH_AHEAD``
keys on, so the cache misses of a request overlap.  ``bench/table.py`` (pull of batch
t+1 between the pull and the push of batch t, as a worker pipelines them; 1e6 synthetic
Criteo rows, dim-1 FTRL) measured ns a key for lookup + update: hash 57 + 102 without
prefetching, 35 + 66 with; dense 36 + 87 without, 11 + 29 with.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from paramserver._runtime.intrinsics import frozen, prefetch_row
from paramserver.routing.hashing import hash64, slot_of_hash
from paramserver.server.compact import (
    ROW_DTYPES,
    decode_rows,
    encode_rows,
    load_row,
    new_scratch,
    store_row,
    value_at,
    work_rows,
    work_slot,
)
from paramserver.tables.optim import OP_UPDATE, init_row, init_value, push_row

MAX_LOAD = 0.875
GROWTH = 1.25
MIN_CAPACITY = 8
# meta[0] = number of keys stored (key 0 included); meta[1] = 1 when key 0 is stored
_COUNT, _HAS_ZERO = 0, 1
#: rows are prefetched this many keys ahead of their use (a row is a cache miss, and an
#: update's arithmetic leaves the CPU too few keys in flight to overlap the misses itself)
PREFETCH_AHEAD = 24


@njit(inline="always", nogil=True, cache=True)
def _find(tkeys, meta, key):
    """Slot of ``key``, or -1."""
    cap = tkeys.shape[0]
    if key == 0:
        return cap if meta[_HAS_ZERO] else -1
    s = slot_of_hash(hash64(key), cap)
    while True:
        k = tkeys[s]
        if k == key:
            return s
        if k == 0:
            return -1
        s += 1
        if s == cap:
            s = 0


@njit(inline="always", nogil=True, cache=True)
def _prefetch_home(tkeys, rows, keys, i):
    """Prefetch the home slot of ``keys[i]`` (where its probe starts), if there is one."""
    if i < keys.shape[0]:
        s = slot_of_hash(hash64(keys[i]), tkeys.shape[0])
        prefetch_row(tkeys, s)
        prefetch_row(rows, s)


@njit(nogil=True, cache=True)
def _lookup(tkeys, rows, meta, keys, out, dim, ikind, ihp, seed):
    for i in range(keys.shape[0]):
        _prefetch_home(tkeys, rows, keys, i + PREFETCH_AHEAD)
        key = keys[i]
        s = _find(tkeys, meta, key)
        if s >= 0:
            for j in range(dim):
                out[i, j] = value_at(rows, s, j)
        else:
            for j in range(dim):
                out[i, j] = init_value(key, j, ikind, ihp, seed)


@njit(nogil=True, cache=True)
def _apply(tkeys, rows, meta, keys, grads, start, limit, dim, op, okind, ohp, ikind, ihp, seed):
    """Apply ``grads[start:]``; stop before a new key would push the count past ``limit``.

    Returns the index of the first key not applied (``len(keys)`` when all were).
    """
    cap = tkeys.shape[0]
    width = rows.shape[1]
    scratch = new_scratch(rows)  # compact rows (``compact.py``) are updated in a float32 copy
    work = work_rows(rows, scratch)
    for i in range(start, keys.shape[0]):
        _prefetch_home(tkeys, rows, keys, i + PREFETCH_AHEAD)
        key = keys[i]
        if key == 0:
            s = cap
            if not meta[_HAS_ZERO]:
                if meta[_COUNT] >= limit:
                    return i
                meta[_HAS_ZERO] = 1
                meta[_COUNT] += 1
                init_row(work, work_slot(rows, s), key, dim, width, okind, ohp, ikind, ihp, seed)
                store_row(rows, s, scratch, width, dim, key)
        else:
            s = slot_of_hash(hash64(key), cap)
            while True:
                k = tkeys[s]
                if k == key:
                    break
                if k == 0:
                    if meta[_COUNT] >= limit:
                        return i
                    tkeys[s] = key
                    meta[_COUNT] += 1
                    init_row(work, work_slot(rows, s), key, dim, width, okind, ohp, ikind, ihp, seed)
                    store_row(rows, s, scratch, width, dim, key)
                    break
                s += 1
                if s == cap:
                    s = 0
        push_row(work, load_row(rows, s, scratch, width, dim), grads, i, dim, op, okind, ohp)
        store_row(rows, s, scratch, width, dim, key)
    return keys.shape[0]


@njit(nogil=True, cache=True)
def _stored(tkeys, meta, keys, out):
    for i in range(keys.shape[0]):
        out[i] = _find(tkeys, meta, keys[i]) >= 0


@njit(nogil=True, cache=True)
def _rehash(old_keys, old_rows, new_keys, new_rows):
    cap_old = old_keys.shape[0]
    cap = new_keys.shape[0]
    width = old_rows.shape[1]
    for j in range(width):  # key 0 keeps the last row
        new_rows[cap, j] = old_rows[cap_old, j]
    for i in range(cap_old):
        key = old_keys[i]
        if key == 0:
            continue
        s = slot_of_hash(hash64(key), cap)
        while new_keys[s] != 0:
            s += 1
            if s == cap:
                s = 0
        new_keys[s] = key
        for j in range(width):
            new_rows[s, j] = old_rows[i, j]


@njit(nogil=True, cache=True)
def _insert_rows(tkeys, rows, meta, keys, src_rows):
    """Overwrite (or insert) whole rows: restore and migration. Capacity must suffice."""
    cap = tkeys.shape[0]
    width = rows.shape[1]
    for i in range(keys.shape[0]):
        key = keys[i]
        if key == 0:
            s = cap
            if not meta[_HAS_ZERO]:
                meta[_HAS_ZERO] = 1
                meta[_COUNT] += 1
        else:
            s = slot_of_hash(hash64(key), cap)
            while tkeys[s] != 0 and tkeys[s] != key:
                s += 1
                if s == cap:
                    s = 0
            if tkeys[s] == 0:
                tkeys[s] = key
                meta[_COUNT] += 1
        for j in range(width):
            rows[s, j] = src_rows[i, j]


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

    def __init__(self, dim: int, optimizer, initializer, seed: int, capacity: int = MIN_CAPACITY, kernels=None,
                 life_width: int = 0, storage: str = "float32"):
        self.dim = dim
        self.life_width = life_width  # columns of the lifecycle's life rows (``life_kernels.py``), 0: none
        self.width = dim + optimizer.state_width(dim)
        self.dtype = ROW_DTYPES[storage]
        if kernels is None:
            from paramserver.server.kernels import kernels_for
            kernels = kernels_for(optimizer, dim, storage)
        self._apply_kernel = kernels.apply
        self._okind, self._ohp = optimizer.kind, optimizer.params()
        self._ikind, self._ihp = initializer.kind, initializer.params()
        self._seed = np.uint64(seed)
        self._meta = np.zeros(2, np.int64)
        self._alloc(max(MIN_CAPACITY, capacity))

    def _alloc(self, capacity: int) -> None:
        self.keys = np.zeros(capacity, np.uint64)
        self.rows = np.zeros((capacity + 1, self.width), self.dtype)
        self.life = np.zeros((capacity + 1, self.life_width), np.float32) if self.life_width else None

    def __len__(self) -> int:
        return int(self._meta[_COUNT])

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.rows.nbytes + (self.life.nbytes if self.life is not None else 0))

    def _limit(self) -> int:
        return int(self.capacity * MAX_LOAD)  # < capacity: a probe always meets an empty slot

    def _grow(self, needed: int) -> None:
        cap = max(int(self.capacity * GROWTH) + 1, int(needed / MAX_LOAD) + 2)
        old_keys, old_rows, old_life = self.keys, self.rows, self.life
        self._alloc(cap)
        _rehash(old_keys, old_rows, self.keys, self.rows)
        if old_life is not None:
            from paramserver.server.life_kernels import _rehash_life
            _rehash_life(old_keys, old_life, self.keys, self._meta, self.life)

    def lookup(self, keys: np.ndarray, out: np.ndarray) -> None:
        """``out[i] = row value of keys[i]`` (initial value for keys never pushed)."""
        _lookup(self.keys, self.rows, self._meta, keys, out, self.dim, self._ikind, self._ihp, self._seed)

    def apply(self, keys: np.ndarray, grads: np.ndarray, op: int = OP_UPDATE) -> None:
        """Apply one gradient row per key (keys should be unique; duplicates apply in turn)."""
        i = 0
        while True:
            i = self._apply_kernel(self.keys, self.rows, self._meta, keys, grads, i, self._limit(), self.dim, op,
                       self._okind, self._ohp, self._ikind, self._ihp, self._seed)
            if i == keys.shape[0]:
                return
            self._grow(len(self) + 1)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All stored keys and their full rows (value and state), in slot order, as float32."""
        keys, rows, _ = self._occupied()
        return keys, decode_rows(rows, self.dim, self.width)

    def _occupied(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The stored keys, their rows as stored (``storage``'s format) and life rows."""
        occupied = np.flatnonzero(self.keys)
        keys, rows = self.keys[occupied], self.rows[occupied]
        life = self.life[occupied] if self.life is not None else None
        if self._meta[_HAS_ZERO]:
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
        keys, rows = self.keys[slots], self.rows[slots]
        if self._meta[_HAS_ZERO] and self.life[-1, column] >= since:
            keys, rows = np.append(keys, np.uint64(0)), np.vstack([rows, self.rows[-1:]])
        return keys, decode_rows(rows, self.dim, self.width)

    def stored(self, keys: np.ndarray) -> np.ndarray:
        """``bool[len(keys)]``: which of ``keys`` are stored (the others read as initial values)."""
        out = np.zeros(keys.shape[0], np.bool_)
        _stored(self.keys, self._meta, frozen(np.ascontiguousarray(keys, np.uint64)), out)
        return out

    def remove(self, keys: np.ndarray) -> int:
        """Remove ``keys`` in place (a lifecycle's table: ``life_kernels._delete``); how
        many were stored.  The arrays keep their size (new keys reuse the slots)."""
        from paramserver.server.life_kernels import _delete

        assert self.life is not None, "in-place removal moves life rows: a lifecycle's tables only"
        return int(_delete(self.keys, self.rows, self._meta, self.life,
                           frozen(np.ascontiguousarray(keys, np.uint64))))

    def keep(self, mask: np.ndarray, room: int = 0) -> None:
        """Keep only the keys ``mask`` marks (in ``items()``'s order), in new arrays with
        room for ``room`` keys (at least those kept), so the memory of the others is freed."""
        keys, rows, life = self._occupied()  # rows as stored: moved, not decoded and encoded again
        keys, rows = np.ascontiguousarray(keys[mask]), np.ascontiguousarray(rows[mask])
        self._meta[:] = 0
        self._alloc(max(MIN_CAPACITY, int(max(keys.shape[0], room) / MAX_LOAD) + 2))
        _insert_rows(self.keys, self.rows, self._meta, frozen(keys), frozen(rows))
        if life is not None:
            self.set_life(keys, life[mask])

    def set_life(self, keys: np.ndarray, life: np.ndarray) -> None:
        """Set the life rows of stored ``keys`` (a lifecycle's table)."""
        from paramserver.server.life_kernels import _place_life

        assert self.life is not None, "a table without a lifecycle has no life rows"
        _place_life(self.keys, self._meta, self.life, frozen(np.ascontiguousarray(keys, np.uint64)),
                    frozen(np.ascontiguousarray(life, np.float32)))

    def load(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Set whole rows (value and state) for ``keys``, inserting those not present."""
        if len(self) + keys.shape[0] >= self._limit():
            self._grow(len(self) + keys.shape[0])
        keys = np.ascontiguousarray(keys, np.uint64)
        _insert_rows(self.keys, self.rows, self._meta, frozen(keys), frozen(encode_rows(rows, self.dim, keys,
                                                                                         self.dtype)))
