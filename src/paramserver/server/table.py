"""The store of one (table, vnode): an open-addressing hash table uint64 key → float32 row,
or, for a dense table (``TableSpec.key_bits``), a plain array with a row per position.

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

A dense vnode (``DenseVnode``) holds ``rows: float32[positions, width + 1]``: the row of
a key is its position (``hashing.dense_pos``) minus the vnode's first position, and the
extra last column is 1 once the key is stored (``width + 1`` is 4 floats for dim-1 FTRL:
one aligned 16-byte row).  No keys, no probing, no growth: a read or an update is one
memory access where the hash table needs two or more.  The array is mapped whole when
the vnode is created (``memory.zeroed_rows``, which has a background thread map its
pages): a dense table's memory is known up front, and its page faults stay off the
hot path.

Every kernel prefetches the row (hash: the home slot) of the key ``PREFETCH_AHEAD``
keys on, so the cache misses of a request overlap.  ``bench/table.py`` (pull of batch
t+1 between the pull and the push of batch t, as a worker pipelines them; 1e6 synthetic
Criteo rows, dim-1 FTRL) measured ns a key for lookup + update: hash 57 + 102 without
prefetching, 35 + 66 with; dense 36 + 87 without, 11 + 29 with.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

from paramserver.errors import ProtocolError
from paramserver.intrinsics import prefetch_row
from paramserver.routing.hashing import dense_keys_of, dense_pos, dense_range, hash64, slot_of_hash, vnode_of_key
from paramserver.server.memory import available_memory, zeroed_rows
from paramserver.server.optim import init_row, init_value, update_row

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
                out[i, j] = rows[s, j]
        else:
            for j in range(dim):
                out[i, j] = init_value(key, j, ikind, ihp, seed)


@njit(nogil=True, cache=True)
def _apply(tkeys, rows, meta, keys, grads, start, limit, dim, okind, ohp, ikind, ihp, seed):
    """Apply ``grads[start:]``; stop before a new key would push the count past ``limit``.

    Returns the index of the first key not applied (``len(keys)`` when all were).
    """
    cap = tkeys.shape[0]
    width = rows.shape[1]
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
                init_row(rows, s, key, dim, width, okind, ohp, ikind, ihp, seed)
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
                    init_row(rows, s, key, dim, width, okind, ohp, ikind, ihp, seed)
                    break
                s += 1
                if s == cap:
                    s = 0
        update_row(rows, s, grads, i, dim, okind, ohp)
    return keys.shape[0]


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
    """

    def __init__(self, dim: int, optimizer, initializer, seed: int, capacity: int = MIN_CAPACITY):
        self.dim = dim
        self.width = dim + optimizer.state_width(dim)
        self._okind, self._ohp = optimizer.kind, optimizer.params()
        self._ikind, self._ihp = initializer.kind, initializer.params()
        self._seed = np.uint64(seed)
        self._meta = np.zeros(2, np.int64)
        self._alloc(max(MIN_CAPACITY, capacity))

    def _alloc(self, capacity: int) -> None:
        self.keys = np.zeros(capacity, np.uint64)
        self.rows = np.zeros((capacity + 1, self.width), np.float32)

    def __len__(self) -> int:
        return int(self._meta[_COUNT])

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.rows.nbytes)

    def _limit(self) -> int:
        return int(self.capacity * MAX_LOAD)  # < capacity: a probe always meets an empty slot

    def _grow(self, needed: int) -> None:
        cap = max(int(self.capacity * GROWTH) + 1, int(needed / MAX_LOAD) + 2)
        old_keys, old_rows = self.keys, self.rows
        self._alloc(cap)
        _rehash(old_keys, old_rows, self.keys, self.rows)

    def lookup(self, keys: np.ndarray, out: np.ndarray) -> None:
        """``out[i] = row value of keys[i]`` (initial value for keys never pushed)."""
        _lookup(self.keys, self.rows, self._meta, keys, out, self.dim, self._ikind, self._ihp, self._seed)

    def apply(self, keys: np.ndarray, grads: np.ndarray) -> None:
        """Apply one gradient row per key (keys should be unique; duplicates apply in turn)."""
        i = 0
        while True:
            i = _apply(self.keys, self.rows, self._meta, keys, grads, i, self._limit(), self.dim,
                       self._okind, self._ohp, self._ikind, self._ihp, self._seed)
            if i == keys.shape[0]:
                return
            self._grow(len(self) + 1)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All stored keys and their full rows (value and state), in slot order."""
        occupied = np.flatnonzero(self.keys)
        keys, rows = self.keys[occupied], self.rows[occupied]
        if self._meta[_HAS_ZERO]:
            keys = np.append(keys, np.uint64(0))
            rows = np.vstack([rows, self.rows[-1:]])
        return keys, rows

    def load(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Set whole rows (value and state) for ``keys``, inserting those not present."""
        if len(self) + keys.shape[0] >= self._limit():
            self._grow(len(self) + keys.shape[0])
        _insert_rows(self.keys, self.rows, self._meta, np.ascontiguousarray(keys, np.uint64),
                     np.ascontiguousarray(rows, np.float32))


@njit(nogil=True, cache=True)
def _dense_lookup(rows, start, keys, out, dim, bits, ikind, ihp, seed):
    """Like ``_lookup`` for a dense vnode; returns the index of a key outside it, or -1."""
    flag = rows.shape[1] - 1
    n = keys.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            r = np.int64(dense_pos(keys[i + PREFETCH_AHEAD], bits)) - start
            if 0 <= r < rows.shape[0]:
                prefetch_row(rows, r)
        key = keys[i]
        r = np.int64(dense_pos(key, bits)) - start
        if r < 0 or r >= rows.shape[0] or key >> np.uint64(bits) != 0:
            return i
        if rows[r, flag] != 0:
            for j in range(dim):
                out[i, j] = rows[r, j]
        else:
            for j in range(dim):
                out[i, j] = init_value(key, j, ikind, ihp, seed)
    return -1


@njit(nogil=True, cache=True)
def _dense_check(rows, start, keys, bits):
    """Index of the first key that is not in this dense vnode, or -1."""
    for i in range(keys.shape[0]):
        r = np.int64(dense_pos(keys[i], bits)) - start
        if r < 0 or r >= rows.shape[0] or keys[i] >> np.uint64(bits) != 0:
            return i
    return -1


@njit(nogil=True, cache=True)
def _dense_apply(rows, meta, start, keys, grads, dim, bits, okind, ohp, ikind, ihp, seed):
    """Like ``_apply`` for a dense vnode (which never grows); every key must be in it
    (``_dense_check``), else nothing is applied and the bad key's index is returned."""
    bad = _dense_check(rows, start, keys, bits)
    if bad >= 0:
        return bad
    flag = rows.shape[1] - 1
    n = keys.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:  # checked in range above
            prefetch_row(rows, np.int64(dense_pos(keys[i + PREFETCH_AHEAD], bits)) - start)
        key = keys[i]
        r = np.int64(dense_pos(key, bits)) - start
        if rows[r, flag] == 0:
            init_row(rows, r, key, dim, flag, okind, ohp, ikind, ihp, seed)
            rows[r, flag] = 1.0
            meta[_COUNT] += 1
        update_row(rows, r, grads, i, dim, okind, ohp)
    return -1


@njit(nogil=True, cache=True)
def _dense_load(rows, meta, start, keys, src_rows, bits):
    """Overwrite (or insert) whole rows; every key must be in the vnode, else nothing is
    written and the bad key's index is returned."""
    bad = _dense_check(rows, start, keys, bits)
    if bad >= 0:
        return bad
    flag = rows.shape[1] - 1
    for i in range(keys.shape[0]):
        r = np.int64(dense_pos(keys[i], bits)) - start
        for j in range(flag):
            rows[r, j] = src_rows[i, j]
        if rows[r, flag] == 0:
            rows[r, flag] = 1.0
            meta[_COUNT] += 1
    return -1


_NO_KEYS = np.zeros(0, np.uint64)


class DenseVnode:
    """One vnode of a dense table (``TableSpec.key_bits > 0``): same interface as
    ``VnodeTable`` (``lookup``/``apply`` go through ``VnodeSet``)."""

    def __init__(self, spec, n_vnodes: int, vnode: int):
        self.dim = spec.dim
        self.width = spec.width
        self.bits = spec.key_bits
        self.start, stop = dense_range(vnode, n_vnodes, self.bits)
        self.rows = zeroed_rows(stop - self.start, self.width + 1)
        self.keys = _NO_KEYS  # VnodeSet's kernel lists take one key array per vnode
        self._meta = np.zeros(2, np.int64)

    def __len__(self) -> int:
        return int(self._meta[_COUNT])

    @property
    def capacity(self) -> int:
        return int(self.rows.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)

    def _limit(self) -> int:
        return self.capacity + 1  # never grows

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All stored keys and their full rows (value and state), in position order."""
        stored = np.flatnonzero(self.rows[:, self.width])
        return dense_keys_of(self.start, stored, self.bits), self.rows[stored, : self.width]

    def load(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Set whole rows (value and state) for ``keys``; all must be in this vnode."""
        bad = _dense_load(self.rows, self._meta, self.start, np.ascontiguousarray(keys, np.uint64),
                          np.ascontiguousarray(rows, np.float32), self.bits)
        if bad >= 0:
            raise ProtocolError(f"key {int(keys[bad])} is not in this dense vnode (positions {self.start}.."
                                f"{self.start + self.capacity - 1} of 2**{self.bits})")


@njit(nogil=True, cache=True)
def _dense_lookup_many(rows_l, starts, slot, vnodes, counts, keys, out, dim, bits, ikind, ihp, seed):
    a = 0
    for s in range(vnodes.shape[0]):
        t = slot[vnodes[s]]
        b = a + counts[s]
        bad = _dense_lookup(rows_l[t], starts[t], keys[a:b], out[a:b], dim, bits, ikind, ihp, seed)
        if bad >= 0:
            return a + bad
        a = b
    return -1


@njit(nogil=True, cache=True)
def _dense_apply_many(rows_l, meta_l, starts, slot, vnodes, counts, keys, grads, dim, bits, okind, ohp,
                      ikind, ihp, seed):
    a = 0
    for s in range(vnodes.shape[0]):
        t = slot[vnodes[s]]
        b = a + counts[s]
        bad = _dense_apply(rows_l[t], meta_l[t], starts[t], keys[a:b], grads[a:b], dim, bits, okind, ohp,
                           ikind, ihp, seed)
        if bad >= 0:
            return a + bad
        a = b
    return -1


@njit(nogil=True, cache=True)
def _dense_check_many(n_vnodes, bits, vnodes, counts, keys):
    """Index of the first key outside its segment's vnode (or the key space), or -1."""
    a = 0
    for s in range(vnodes.shape[0]):
        v = vnodes[s]
        for i in range(a, a + counts[s]):
            if keys[i] >> np.uint64(bits) != 0 or vnode_of_key(keys[i], n_vnodes, bits) != v:
                return i
        a += counts[s]
    return -1


@njit(nogil=True, cache=True)
def _lookup_many(keys_l, rows_l, meta_l, slot, vnodes, counts, keys, out, dim, ikind, ihp, seed):
    a = 0
    for s in range(vnodes.shape[0]):
        t = slot[vnodes[s]]
        b = a + counts[s]
        _lookup(keys_l[t], rows_l[t], meta_l[t], keys[a:b], out[a:b], dim, ikind, ihp, seed)
        a = b


@njit(nogil=True, cache=True)
def _apply_many(keys_l, rows_l, meta_l, limits, slot, vnodes, counts, keys, grads, seg, start,
                dim, okind, ohp, ikind, ihp, seed):
    """Apply segment by segment from (``seg``, key ``start`` in it); return where a vnode
    must grow first, or ``(len(vnodes), 0)`` when done."""
    a = 0
    for s in range(seg):
        a += counts[s]
    for s in range(seg, vnodes.shape[0]):
        t = slot[vnodes[s]]
        b = a + counts[s]
        i = _apply(keys_l[t], rows_l[t], meta_l[t], keys[a:b], grads[a:b], start, limits[t],
                   dim, okind, ohp, ikind, ihp, seed)
        if i < b - a:
            return s, i
        start = 0
        a = b
    return vnodes.shape[0], 0


@njit(cache=True)
def _new_lists(keys, rows, meta):
    """Typed lists holding one vnode's arrays: built in compiled (and cached) code,
    because a typed list made and appended to from Python compiles afresh in every
    process (~0.9 s of each server's start)."""
    keys_l, rows_l, meta_l = List(), List(), List()
    keys_l.append(keys)
    rows_l.append(rows)
    meta_l.append(meta)
    return keys_l, rows_l, meta_l


@njit(cache=True)
def _append_arrays(keys_l, rows_l, meta_l, keys, rows, meta):
    keys_l.append(keys)
    rows_l.append(rows)
    meta_l.append(meta)


@njit(cache=True)
def _set_arrays(keys_l, rows_l, t, keys, rows):
    """``keys_l[t], rows_l[t] = keys, rows``: a typed list's ``__setitem__`` called from
    Python is compiled afresh in every process (~1 s, measured with py-spy); this is cached."""
    keys_l[t] = keys
    rows_l[t] = rows


class VnodeSet:
    """The ``VnodeTable``s (or ``DenseVnode``s) of one table on one server, worked many
    vnodes per kernel call.

    A request carries its keys grouped by vnode; one numba call walks all its segments
    (a Python call per vnode cost ~3.7 µs, 60 % of serving a 7 600-key pull).

    Args:
        spec: the table's ``TableSpec``.
        n_vnodes: vnodes on the ring.
        vnodes: the vnodes this server owns.
    """

    def __init__(self, spec, n_vnodes: int, vnodes):
        self.spec = spec
        self.width = spec.width
        self.tables: dict[int, VnodeTable | DenseVnode] = {}
        self.n_vnodes = n_vnodes
        self.bits = spec.key_bits
        self.slot = np.full(n_vnodes, -1, np.int64)
        opt, init = spec.optimizer, spec.initializer
        self._okind, self._ohp, self._ikind, self._ihp = opt.kind, opt.params(), init.kind, init.params()
        self._seed = np.uint64(spec.seed)
        self.set_vnodes(vnodes)

    def _new_table(self, vnode: int) -> VnodeTable | DenseVnode:
        if self.bits:
            return DenseVnode(self.spec, self.n_vnodes, vnode)
        return VnodeTable(self.spec.dim, self.spec.optimizer, self.spec.initializer, self.spec.seed)

    def set_vnodes(self, vnodes) -> None:
        """Hold exactly ``vnodes``: keep the ones held already, start the others empty,
        drop the rest (the ring changed)."""
        wanted = sorted({int(v) for v in vnodes})
        if self.bits:  # dense vnodes are mapped whole: refuse what this machine cannot hold, before any
            new = [v for v in wanted if v not in self.tables]
            need = sum(int(np.subtract(*dense_range(v, self.n_vnodes, self.bits)[::-1])) for v in new) * \
                (self.width + 1) * 4
            free = available_memory()
            if need and free and need > 0.9 * free:
                raise MemoryError(f"dense table {self.spec.name!r} (key_bits={self.bits}, dim={self.spec.dim}) needs "
                                  f"{need / 2**30:,.1f} GiB on this server, {free / 2**30:,.1f} GiB are available: "
                                  "use fewer key_bits, more servers, or key_bits=0 (a hash table grows with the keys)")
        self.tables = {v: self.tables[v] if v in self.tables else self._new_table(v) for v in wanted}
        self._rebuild()

    def install(self, vnode: int, keys: np.ndarray, rows: np.ndarray, replace: bool = True) -> None:
        """Replace ``vnode`` whole by a copy of it (keys, values and state) from another
        server, or (``replace=False``) add more of such a copy's rows."""
        if replace or int(vnode) not in self.tables:
            vt = self._new_table(int(vnode))
            vt.load(keys, rows)
            self.tables[int(vnode)] = vt
            self._rebuild()
        else:
            vt = self.tables[int(vnode)]
            vt.load(keys, rows)
            t = int(self.slot[int(vnode)])
            _set_arrays(self._keys, self._rows, t, vt.keys, vt.rows)
            self._limits[t] = vt._limit()

    def _rebuild(self) -> None:
        self.slot[:] = -1
        self._keys, self._rows, self._meta = List(), List(), List()  # untyped while empty
        self._limits = np.zeros(len(self.tables), np.int64)
        self._starts = np.zeros(len(self.tables), np.int64)  # dense: each vnode's first position
        for t, (v, vt) in enumerate(self.tables.items()):
            self.slot[v] = t
            self._starts[t] = getattr(vt, "start", 0)
            if t == 0:
                self._keys, self._rows, self._meta = _new_lists(vt.keys, vt.rows, vt._meta)
            else:
                _append_arrays(self._keys, self._rows, self._meta, vt.keys, vt.rows, vt._meta)
            self._limits[t] = vt._limit()

    def __len__(self) -> int:
        return sum(len(t) for t in self.tables.values())

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tables.values())

    def holds(self, vnodes: np.ndarray) -> np.ndarray:
        """``bool[len(vnodes)]``: which of ``vnodes`` this set stores."""
        inside = (vnodes >= 0) & (vnodes < self.slot.size)
        out = np.zeros(vnodes.shape[0], bool)
        out[inside] = self.slot[vnodes[inside]] >= 0
        return out

    def check(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> int:
        """Dense tables: the index of the first key outside its segment's vnode (or the
        key space), -1 when all are in place.  Hash tables take any key: -1."""
        if not self.bits:
            return -1
        return int(_dense_check_many(self.n_vnodes, self.bits, vnodes, counts, keys))

    def _misplaced(self, bad: int, keys: np.ndarray) -> None:
        if bad >= 0:
            raise ProtocolError(f"table {self.spec.name!r}: key {int(keys[bad])} is not in its vnode of this "
                                f"dense table (key_bits={self.bits})")

    def lookup(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None:
        """Rows of ``keys``, grouped by ``vnodes`` (``counts`` keys each), into ``out``."""
        if self.tables and self.bits:
            self._misplaced(_dense_lookup_many(self._rows, self._starts, self.slot, vnodes, counts, keys, out,
                                               self.spec.dim, self.bits, self._ikind, self._ihp, self._seed), keys)
        elif self.tables:
            _lookup_many(self._keys, self._rows, self._meta, self.slot, vnodes, counts, keys, out,
                         self.spec.dim, self._ikind, self._ihp, self._seed)

    def refresh(self) -> None:
        """Re-read every vnode's arrays (after a vnode grew outside ``apply``, e.g. ``load``)."""
        for v, vt in self.tables.items():
            t = int(self.slot[v])
            _set_arrays(self._keys, self._rows, t, vt.keys, vt.rows)
            self._limits[t] = vt._limit()

    def apply(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, grads: np.ndarray) -> None:
        """Apply ``grads`` to ``keys``, grouped like ``lookup``'s; vnodes grow as needed."""
        if self.tables and self.bits:  # dense vnodes never grow
            self._misplaced(_dense_apply_many(self._rows, self._meta, self._starts, self.slot, vnodes, counts, keys,
                                              grads, self.spec.dim, self.bits, self._okind, self._ohp, self._ikind,
                                              self._ihp, self._seed), keys)
            return
        seg, start = 0, 0
        while self.tables:
            seg, start = _apply_many(self._keys, self._rows, self._meta, self._limits, self.slot, vnodes,
                                     counts, keys, grads, seg, start, self.spec.dim, self._okind, self._ohp,
                                     self._ikind, self._ihp, self._seed)
            if seg == vnodes.shape[0]:
                return
            v = int(vnodes[seg])
            vt, t = self.tables[v], int(self.slot[v])
            assert isinstance(vt, VnodeTable), "a dense vnode never asks to grow"
            vt._grow(len(vt) + 1)
            _set_arrays(self._keys, self._rows, t, vt.keys, vt.rows)
            self._limits[t] = vt._limit()
