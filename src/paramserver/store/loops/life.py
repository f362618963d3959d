"""The loops of a table's key lifecycle (``store/life.py``) over its hash vnodes.

A table with a lifecycle (``TableSpec.lifecycle``) gives every slot of its vnodes a *life
row* beside its key and its row: ``float32[capacity + 1, LIFE]`` (``VnodeTable.life``),
the last row being key 0's as in ``store/table.py``:

* ``VER``: the export epoch of the key's last change (``Client.export_delta``: exact to
  2**24 exports a server);
* ``STAMP``: the latest time of a push that carried it (the push's ``time``);
* ``SCORE`` (with ``half_life``): its sightings, each halved every ``half_life`` since.

They are written after a push is applied (``touch_many``: one more probe a key, whose
slot the push has just brought into the cache), moved with their keys when a vnode grows
(``hash.rehash``), and read by the eviction sweep.  Tables without a lifecycle have none.
"""

from __future__ import annotations

from numba import njit

from paramserver.routing.hashing import hash64, slot_of_hash
from paramserver.store.loops.hash import COUNT, HAS_ZERO, find
from paramserver.store.loops.tags import exact, key_at, move_key
from paramserver.store.loops.views import hash_arrays, life_rows

VER, STAMP, SCORE = 0, 1, 2


@njit(nogil=True, cache=True)
def touch(tkeys, meta, life, keys, epoch, time, half_life):
    for i in range(keys.shape[0]):
        s = find(tkeys, meta, keys[i])
        if s < 0:
            continue
        old = life[s, STAMP]
        life[s, VER] = epoch
        if time > old:
            life[s, STAMP] = time
        if half_life > 0.0:
            dt = time - old if time > old else 0.0
            life[s, SCORE] = life[s, SCORE] * 2.0 ** (-dt / half_life) + 1.0


@njit(nogil=True, cache=True)
def touch_many(d, keys0, rows0, meta0, life0, slot, vnodes, counts, keys, epoch, time, half_life):
    a = 0
    for s in range(vnodes.shape[0]):
        t = slot[vnodes[s]]
        tkeys, _, meta = hash_arrays(d, t, keys0, rows0, meta0)
        b = a + counts[s]
        touch(tkeys, meta, life_rows(d, t, life0), keys[a:b], epoch, time, half_life)
        a = b


@njit(nogil=True, cache=True)
def stored_many(d, keys0, rows0, meta0, slot, vnodes, counts, keys, out):
    """``out[i]``: whether ``keys[i]`` is stored (grouped by vnode, as a pull's)."""
    a = 0
    for s in range(vnodes.shape[0]):
        tkeys, _, meta = hash_arrays(d, slot[vnodes[s]], keys0, rows0, meta0)
        for i in range(a, a + counts[s]):
            out[i] = find(tkeys, meta, keys[i]) >= 0
        a += counts[s]


@njit(nogil=True, cache=True)
def place_life(tkeys, meta, life, keys, src):
    for i in range(keys.shape[0]):
        s = find(tkeys, meta, keys[i])
        if s >= 0:
            for j in range(life.shape[1]):
                life[s, j] = src[i, j]


@njit(inline="always", nogil=True, cache=True)
def move_slot(tkeys, meta, rows, life, dst, src):
    move_key(tkeys, meta, dst, src)
    for j in range(rows.shape[1]):
        rows[dst, j] = rows[src, j]
    for j in range(life.shape[1]):
        life[dst, j] = life[src, j]


@njit(inline="always", nogil=True, cache=True)
def clear_slot(rows, life, s):
    for j in range(rows.shape[1]):
        rows[s, j] = 0
    for j in range(life.shape[1]):
        life[s, j] = 0.0


@njit(nogil=True, cache=True)
def delete(tkeys, rows, meta, life, keys):
    """Remove ``keys`` from a linear-probing vnode in place; how many were stored
    (``delete_one``)."""
    removed = 0
    for i in range(keys.shape[0]):
        if delete_one(tkeys, rows, meta, life, keys[i]):
            removed += 1
    return removed


@njit(inline="always", nogil=True, cache=True)
def delete_one(tkeys, rows, meta, life, key):
    """Remove ``key`` in place (backward-shift deletion: each key after the freed slot in
    its run moves back into it unless its home lies between, so every probe still finds
    its key); its row and life row are zeroed.  Whether it was stored."""
    cap = tkeys.shape[0]
    s = exact(tkeys, meta, key, find(tkeys, meta, key))
    if s < 0:
        return False
    meta[COUNT] -= 1
    if key == 0:
        meta[HAS_ZERO] = 0
        clear_slot(rows, life, cap)
        return True
    j = s
    while True:
        j += 1
        if j == cap:
            j = 0
        if tkeys[j] == 0:
            break
        home = slot_of_hash(hash64(key_at(tkeys, meta, j)), cap)
        # k stays where it is if its home is cyclically within (s, j]
        if (s < j and s < home <= j) or (j < s and (home > s or home <= j)):
            continue
        move_slot(tkeys, meta, rows, life, s, j)
        s = j
    tkeys[s] = 0
    clear_slot(rows, life, s)
    return True
