"""The loops of the hash vnode table (``store/table.py``: its layout, its load and growth).

Open addressing with linear probing from the slot the low 32 bits of ``hash64(key)``
give; ``keys[s] == 0`` marks an empty slot, and key 0 owns the extra last row (its
presence is ``meta[HAS_ZERO]``).  Every loop over a request prefetches the home slot of the
key ``PREFETCH_AHEAD`` keys on, so the cache misses of a request overlap.

These are the numba loops only, below the classes: ``store/table.py`` and
``store/vnodes.py`` call them, never the reverse.  ``store/kernels.py`` compiles ``apply``
again for a user's rule, rebinding its globals ``push_row`` and ``init_row`` by name.
"""

from __future__ import annotations

from numba import njit

from paramserver._runtime.intrinsics import prefetch_row
from paramserver.routing.hashing import hash64, slot_of_hash
from paramserver.store.loops.compact import load_row, new_scratch, store_row, value_at, work_rows, work_slot
from paramserver.store.loops.tags import key_at, record_key, tag_of
from paramserver.tables.optim import init_row, init_value
from paramserver.tables.push_ops import push_row

# meta[0] = number of keys stored (key 0 included); meta[1] = 1 when key 0 is stored
COUNT, HAS_ZERO = 0, 1
#: rows are prefetched this many keys ahead of their use (a row is a cache miss, and an
#: update's arithmetic leaves the CPU too few keys in flight to overlap the misses itself)
PREFETCH_AHEAD = 24
#: rebound per row (``store/specialize.py``): the columns of a row ``rehash`` copies, 0: the
#: rows' own (a clone for the row's width copies it as a compile-time constant)
WIDTH = 0


@njit(inline="always", nogil=True, cache=True)
def find(tkeys, meta, key):
    """Slot of ``key``, or -1."""
    return find_from(tkeys, meta, key, slot_of_hash(hash64(key), tkeys.shape[0]) if key != 0 else 0)


@njit(inline="always", nogil=True, cache=True)
def find_from(tkeys, meta, key, s):
    """Slot of ``key``, probing from its home slot ``s`` (ignored for key 0), or -1."""
    return _probe(tkeys, meta, key, s, False)


@njit(inline="always", nogil=True, cache=True)
def probe_from(tkeys, meta, key, s):
    """``find_from`` that says where a missing key's probe ended: the slot of ``key``
    (>= 0), else ``-2 - e`` where ``e`` is the empty slot the probe met (a ``claim`` of the
    key, with nothing stored since, takes ``e``), or -1 for key 0 not stored."""
    return _probe(tkeys, meta, key, s, True)


@njit(inline="always", nogil=True, cache=True)
def _probe(tkeys, meta, key, s, where):
    """The probe of ``find_from`` (``where`` False) and ``probe_from`` (True), inlined with
    ``where`` a constant: a ``max`` of ``probe_from``'s answer and -1 for ``find_from`` cost a
    million-key pull 12 % (three pairs in turn)."""
    cap = tkeys.shape[0]
    if key == 0:
        return cap if meta[HAS_ZERO] else -1
    tag = tag_of(tkeys, key)
    while True:
        k = tkeys[s]
        if k == tag:
            return s
        if k == 0:
            return -2 - s if where else -1
        s += 1
        if s == cap:
            s = 0


@njit(inline="always", nogil=True, cache=True)
def claim(tkeys, meta, key, s, limit):
    """``(slot, new)`` of ``key``, probing from its home slot ``s`` (ignored for key 0): a
    key not stored takes the first empty slot, counted (``new``: its row is the caller's to
    initialise, with the rule the caller was compiled with); ``(-1, False)`` where one more
    key would pass ``limit`` (the table must grow first)."""
    cap = tkeys.shape[0]
    if key == 0:
        if meta[HAS_ZERO]:
            return cap, False
        if meta[COUNT] >= limit:
            return -1, False
        meta[HAS_ZERO] = 1
        meta[COUNT] += 1
        return cap, True
    tag = tag_of(tkeys, key)
    while True:
        k = tkeys[s]
        if k == tag:
            return s, False
        if k == 0:
            if meta[COUNT] >= limit:
                return -1, False
            tkeys[s] = tag
            record_key(tkeys, meta, s, key)
            meta[COUNT] += 1
            return s, True
        s += 1
        if s == cap:
            s = 0


@njit(inline="always", nogil=True, cache=True)
def prefetch_home(tkeys, rows, keys, i):
    """Prefetch the home slot of ``keys[i]`` (where its probe starts), if there is one."""
    if i < keys.shape[0]:
        s = slot_of_hash(hash64(keys[i]), tkeys.shape[0])
        prefetch_row(tkeys, s)
        prefetch_row(rows, s)


@njit(nogil=True, cache=True)
def lookup(tkeys, rows, meta, keys, out, dim, ikind, ihp, seed):
    for i in range(keys.shape[0]):
        prefetch_home(tkeys, rows, keys, i + PREFETCH_AHEAD)
        key = keys[i]
        s = find(tkeys, meta, key)
        if s >= 0:
            for j in range(dim):
                out[i, j] = value_at(rows, s, j)
        else:
            for j in range(dim):
                out[i, j] = init_value(key, j, ikind, ihp, seed)


@njit(nogil=True, cache=True)
def lookup_whole(tkeys, rows, meta, keys, out, dim, okind, ohp, ikind, ihp, seed):
    """``lookup``'s rows whole, value and state (``out`` a row's width): a key not stored
    as its row would start (``init_row``)."""
    width = out.shape[1]
    for i in range(keys.shape[0]):
        prefetch_home(tkeys, rows, keys, i + PREFETCH_AHEAD)
        s = find(tkeys, meta, keys[i])
        if s >= 0:
            for j in range(width):
                out[i, j] = value_at(rows, s, j)
        else:
            init_row(out, i, keys[i], dim, width, okind, ohp, ikind, ihp, seed)


@njit(nogil=True, cache=True)
def apply(tkeys, rows, meta, keys, grads, start, limit, dim, op, okind, ohp, ikind, ihp, seed):
    """Apply ``grads[start:]``; stop before a new key would push the count past ``limit``.

    Returns the index of the first key not applied (``len(keys)`` when all were).
    """
    cap = tkeys.shape[0]
    width = rows.shape[1]
    scratch = new_scratch(rows)  # compact rows (``compact.py``) are updated in a float32 copy
    work = work_rows(rows, scratch)
    for i in range(start, keys.shape[0]):
        prefetch_home(tkeys, rows, keys, i + PREFETCH_AHEAD)
        key = keys[i]
        s, new = claim(tkeys, meta, key, slot_of_hash(hash64(key), cap) if key != 0 else 0, limit)
        if s < 0:
            return i
        if new:
            init_row(work, work_slot(rows, s), key, dim, width, okind, ohp, ikind, ihp, seed)
            store_row(rows, s, scratch, width, dim, key)
        push_row(work, load_row(rows, s, scratch, width, dim), grads, i, dim, op, okind, ohp)
        store_row(rows, s, scratch, width, dim, key)
    return keys.shape[0]


@njit(nogil=True, cache=True)
def stored(tkeys, meta, keys, out):
    for i in range(keys.shape[0]):
        out[i] = find(tkeys, meta, keys[i]) >= 0


@njit(nogil=True, cache=True)
def rehash(old_keys, old_meta, old_rows, old_life, new_keys, new_meta, new_rows, new_life):
    """Move every key, its row and its life row (``life``: no columns for a vnode without)
    to the grown arrays.  The old slots are read in order, and their keys' new homes come
    nearly in order too (a home is the hash's low 32 bits scaled to the capacity,
    ``slot_of_hash``; only a cluster's keys may stand out of their homes' order), so the
    writes walk forward and the hardware's prefetcher follows them: fetching the home of a
    key ahead only hashed every key twice (the default job's vnodes, ~21 000 keys: 16.0
    against 14.2 ns a key moved; 2·10^5 keys: 34-39 either way).  Fingerprints' twins keep
    a slot each, as they had (``tags.py``).  A table's own clone (``WIDTH`` its row's
    columns) copies a row with no loop over a width it does not know: a vnode of 21 000
    dim-1 FTRL keys moved in 5.9-6.0 ns a key against 12.6-12.7 (three runs in turn; 2·10^5
    keys: 17.8-18.0 against 19.6-19.9), the default job's server growing in 0.081-0.096 s
    against 0.104-0.105 (``bench/server_replay.py``)."""
    cap_old = old_keys.shape[0]
    cap = new_keys.shape[0]
    width, life_width = WIDTH if WIDTH else old_rows.shape[1], old_life.shape[1]
    for j in range(width):  # key 0 keeps the last row
        new_rows[cap, j] = old_rows[cap_old, j]
    for j in range(life_width):
        new_life[cap, j] = old_life[cap_old, j]
    for i in range(cap_old):
        if old_keys[i] == 0:
            continue
        key = key_at(old_keys, old_meta, i)
        s = slot_of_hash(hash64(key), cap)
        while new_keys[s] != 0:
            s += 1
            if s == cap:
                s = 0
        new_keys[s] = old_keys[i]
        record_key(new_keys, new_meta, s, key)
        for j in range(width):
            new_rows[s, j] = old_rows[i, j]
        for j in range(life_width):
            new_life[s, j] = old_life[i, j]


@njit(nogil=True, cache=True)
def insert_rows(tkeys, rows, meta, keys, src_rows):
    """Overwrite (or insert) whole rows: restore and migration. Capacity must suffice."""
    cap = tkeys.shape[0]
    width = rows.shape[1]
    for i in range(keys.shape[0]):
        prefetch_home(tkeys, rows, keys, i + PREFETCH_AHEAD)
        key = keys[i]
        if key == 0:
            s = cap
            if not meta[HAS_ZERO]:
                meta[HAS_ZERO] = 1
                meta[COUNT] += 1
        else:
            tag = tag_of(tkeys, key)
            s = slot_of_hash(hash64(key), cap)
            while tkeys[s] != 0 and tkeys[s] != tag:
                s += 1
                if s == cap:
                    s = 0
            if tkeys[s] == 0:
                tkeys[s] = tag
                record_key(tkeys, meta, s, key)
                meta[COUNT] += 1
        for j in range(width):
            rows[s, j] = src_rows[i, j]
