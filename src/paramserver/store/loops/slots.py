"""A request's keys over hash vnodes in one compiled call: probe, apply or read, every
vnode segment of the request, with the misses of the keys ``AHEAD`` on in flight.

A hash vnode keeps each key and its row in one slot (``VnodeTable``: ``[key | value |
state]``, 20 bytes for a dim-1 FTRL row), so a key costs one cache line, rarely two, where
a key array beside a row array cost two.  These loops walk a request as it arrives,
grouped by vnode (``routing/partition.py``), in two passes: ``homes`` hashes every key
once and keeps its home slot and that slot's address; the walk then prefetches the
address ``AHEAD`` keys on, across the boundaries of the vnodes (a request's vnodes hold a
few keys each: a 1 000-key batch spreads over 64, so a look-ahead inside one vnode would
overlap nothing).

A dense table's pushes (``dense_apply_request``) walk the same way: every key's row is
placed first (and the whole request refused if one is not in its vnode), then the rows
are updated with the row ``AHEAD`` keys on fetched by address, across vnodes.  On the
default job's own requests (LR, FTRL, 2^24 positions, ~3 300 keys a push over 64
vnodes) an update took 28.9 ns a key in ``dense.dense_apply_many``, whose look-ahead
stayed inside a vnode, and takes 19.1 here.  A dense table's reads keep
``dense.dense_lookup_many`` (14 ns a key either way: a read has no arithmetic to wait on).

The row's width and the update rule are compile-time constants: ``DIM`` and ``KIND`` (and,
for a user's rule, ``push_row`` and ``init_row``) are rebound per table and the loops
compiled again from this source (``store/specialize.py``), so the inner loop has no
switch on the rule, no loop over a width it does not know, and the arithmetic is exactly
the generic kernels' (``tables/optim.py``): same operations, same order, same bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from paramserver._runtime.intrinsics import prefetch_address
from paramserver.routing.hashing import dense_pos, hash64, layout_bits, slot_of_hash
from paramserver.store.loops.compact import load_row, new_scratch, store_row, value_at, work_rows, work_slot
from paramserver.store.loops.hash import COUNT, claim, probe_from
from paramserver.store.loops.views import LIMIT, N_ROWS, ROWS, SLOTS, START, STRIDE, dense_arrays, hash_arrays
from paramserver.tables.optim import init_row, init_value
from paramserver.tables.push_ops import OP_UPDATE, push_row

#: rebound per table (``store/specialize.py``): the value columns of a row, and the rule
DIM = 1
KIND = 0
#: ``lookup_request``'s and ``apply_request``'s ``found``, ``home`` and ``address`` from Python,
#: where there are none (a pull keeps none, a push probes for every key).  Writable, as ``homes``
#: makes them (one array type for both)
NOT_FOUND = np.empty(0, np.int64)
#: keys between the look-ahead cursor and the key being worked: enough misses in flight
#: to cover DRAM's latency behind an update's arithmetic
AHEAD = 16
#: ``AHEAD`` for an unsigned index.  The loops index a request's arrays with unsigned ints:
#: numba adds the length to a signed index it cannot prove non-negative (``a[-1]``), and
#: that select made LLVM gather and scatter ``fill_homes``'s arrays 8 keys at a time where it
#: could load and store them (2.95 -> 1.45 ns a key alone, one request of 569 keys)
U_AHEAD = np.uint64(AHEAD)


@njit(nogil=True, cache=True)
def homes(d, slot, vnodes, counts, keys, first):
    """From key ``first`` on: each key's home slot (where its probe starts; the last row for
    key 0) and the address of that slot's row.  One sequential pass, no misses: the
    walk that follows fetches ``AHEAD`` keys on by address, whatever vnode they are in."""
    n = keys.shape[0]
    home = np.empty(n, np.int64)
    address = np.zeros(n + AHEAD, np.int64)  # AHEAD zeros at the end: no fetch past the last key
    fill_homes(d, slot, vnodes, counts, keys, first, home, address)
    return home, address


@njit(nogil=True, cache=True)
def fill_homes(d, slot, vnodes, counts, keys, first, home, address):
    """``homes`` into ``home`` (a key each) and ``address`` (a key each, then ``AHEAD`` zeros)."""
    n = keys.shape[0]
    a = 0
    for seg in range(vnodes.shape[0]):
        b = a + counts[seg]
        if b > first:
            t = slot[vnodes[seg]]
            cap, base, stride = d[t, SLOTS], d[t, ROWS], d[t, STRIDE]
            for i in range(np.uint64(max(a, first)), np.uint64(b)):
                key = keys[i]
                s = slot_of_hash(hash64(key), cap) if key != 0 else cap
                home[i] = s
                address[i] = base + s * stride
        a = b
    if vnodes.shape[0]:
        reach = probe_reach(d[slot[vnodes[0]], STRIDE])
        for i in range(first, min(first + AHEAD, n)):
            prefetch_probe(address[i], reach)


@njit(inline="always", nogil=True, cache=True)
def prefetch_probe(address, reach):
    """Fetch the lines a probe from the slot at ``address`` reads first: the one it starts in
    and the one ``reach`` bytes on (``probe_reach``).  The table fills to 7/8 before it grows,
    so 40 % of the keys are not in their home slot (16 % past the next one); with 20-byte slots
    the home line alone left the next one to a miss the walk waited for behind a mispredicted
    branch (10^6 random keys: 16.6 -> 15.3 ns a key; 2^14: 19.4 -> 16.8).  Where both lie in
    one line, both fetches ask for it."""
    prefetch_address(address)
    prefetch_address(address + reach)


@njit(inline="always", nogil=True, cache=True)
def probe_reach(stride):
    """``prefetch_probe``'s second fetch, bytes past a slot's first: the end of the slot after
    it, or of the line's worth of a wide slot (136 bytes for AdaGrad at dim 16: its own row,
    where the next slot's end wasted a fetch and cost 8 % of its updates)."""
    return min(2 * stride, 64) - 1


@njit(nogil=True, cache=True)
def lookup_request(d, keys0, rows0, meta0, slot, vnodes, counts, keys, out, found, home, address, ikind, ihp,
                   seed):
    """``out[i]`` = the value of ``keys[i]`` (its initial value when not stored); ``d``
    and the first vnode's arrays as ``views.py`` has them.  ``found`` of every key (and
    ``home`` of every key, ``address`` of every key and ``AHEAD`` zeros): what the probes
    found is kept there, for an update of the same keys with nothing stored in between
    (``apply_request``'s: a step reads a batch's rows, computes its gradient, then updates
    them, probing once): each key's slot (where not stored: ``-2 - e``, ``e`` the empty slot
    its probe met, where a claim of it starts; -1 for key 0), its home, and the address of
    its row (of that empty slot where not stored).  Empty: a pull keeps nothing (keeping them cost
    a million-key pull ~10 %, three runs in turn).  Nothing is returned: numba boxing the
    arrays back to Python from this per-row clone failed in forked servers creating an FM
    table ("'descr' is NULL" in ``NRT_adapt_ndarray_to_python``, two process tests)."""
    keep = found.shape[0] > 0
    if keep:
        fill_homes(d, slot, vnodes, counts, keys, 0, home, address)
    else:
        home, address = homes(d, slot, vnodes, counts, keys, 0)
    a = 0
    for seg in range(vnodes.shape[0]):
        t = slot[vnodes[seg]]
        tkeys, rows, meta = hash_arrays(d, t, keys0, rows0, meta0)
        base, stride = d[t, ROWS], d[t, STRIDE]
        reach = probe_reach(stride)
        b = a + counts[seg]
        for i in range(np.uint64(a), np.uint64(b)):
            prefetch_probe(address[i + U_AHEAD], reach)
            key = keys[i]
            s = probe_from(tkeys, meta, key, home[i])  # < 0: not stored (where its probe ended, kept below)
            if keep:
                found[i] = s
                if s >= 0:
                    address[i] = base + s * stride
                elif s < -1:  # where a claim of it starts: the empty slot its probe met
                    address[i] = base + (-2 - s) * stride
            if s >= 0:
                for j in range(DIM):
                    out[i, j] = value_at(rows, s, j)
            else:
                for j in range(DIM):
                    out[i, j] = init_value(key, j, ikind, ihp, seed)
        a = b


@njit(nogil=True, cache=True)
def apply_request(d, keys0, rows0, meta0, slot, vnodes, counts, keys, grads, seg, start, found, home, address, ohp,
                  ikind, ihp, seed):
    """Apply ``grads`` to ``keys`` with the table's rule, from key ``start`` of segment
    ``seg``; return where a vnode must grow first (its segment and the key in it), or
    ``(len(vnodes), 0)`` when every key is applied (``many.apply_many``'s contract).
    ``found``, ``home``, ``address``: what ``lookup_request`` answered for these keys, from
    the first, with nothing stored since: a stored key's row is updated where the read found
    it, a key not stored is claimed from the empty slot its read's probe met (every slot from
    its home to there held another key then, and still does: the slot a claim from its home
    takes, the same bits, one probe where there were two); a growth moves every slot, so
    what follows it comes without them.  Empty (``found`` of no keys): every key is probed for."""
    a = 0
    for s in range(seg):
        a += counts[s]
    kept = found.shape[0] > 0
    if not kept:
        home, address = homes(d, slot, vnodes, counts, keys, a + start)
    for sg in range(seg, vnodes.shape[0]):
        t = slot[vnodes[sg]]
        tkeys, rows, meta = hash_arrays(d, t, keys0, rows0, meta0)
        width, limit, reach = rows.shape[1], d[t, LIMIT], probe_reach(d[t, STRIDE])
        scratch = new_scratch(rows)  # compact rows are updated in a float32 copy (``compact.py``)
        work = work_rows(rows, scratch)
        b = a + counts[sg]
        for i in range(np.uint64(a + start if sg == seg else a), np.uint64(b)):
            prefetch_probe(address[i + U_AHEAD], reach)
            key = keys[i]
            s = found[i] if kept else -1
            if s < 0:
                s, new = claim(tkeys, meta, key, home[i] if s == -1 else -2 - s, limit)
                if s < 0:
                    return sg, np.int64(i) - a
                if new:
                    init_row(work, work_slot(rows, s), key, DIM, width, KIND, ohp, ikind, ihp, seed)
                    store_row(rows, s, scratch, width, DIM, key)
            push_row(work, load_row(rows, s, scratch, width, DIM), grads, i, DIM, OP_UPDATE, KIND, ohp)
            store_row(rows, s, scratch, width, DIM, key)
        a = b
    return vnodes.shape[0], 0


@njit(nogil=True, cache=True)
def dense_places(d, slot, vnodes, counts, keys, layout):
    """Each key's row in its dense vnode and that row's address, in one sequential pass (a
    dense vnode's row is the key's position less the vnode's first, ``store/dense.py``);
    and the index of the first key that is not in its vnode, or -1.  The first ``AHEAD``
    rows are fetched: the walk that follows fetches the rest ahead by address."""
    n = keys.shape[0]
    row = np.empty(n, np.int64)
    address = np.zeros(n + AHEAD, np.int64)  # AHEAD zeros at the end: no fetch past the last key
    a = 0
    for seg in range(vnodes.shape[0]):
        t = slot[vnodes[seg]]
        start, n_rows, base, stride = d[t, START], d[t, N_ROWS], d[t, ROWS], d[t, STRIDE]
        for i in range(np.uint64(a), np.uint64(a + counts[seg])):
            key = keys[i]
            r = np.int64(dense_pos(key, layout)) - start
            if r < 0 or r >= n_rows or key >> np.uint64(layout_bits(layout)) != 0:
                return row, address, np.int64(i)
            row[i] = r
            address[i] = base + r * stride
        a += counts[seg]
    for i in range(min(AHEAD, n)):
        prefetch_address(address[i])
    return row, address, -1


@njit(nogil=True, cache=True)
def dense_apply_request(d, rows0, meta0, slot, vnodes, counts, keys, grads, layout, ohp, ikind, ihp, seed):
    """Apply ``grads`` to ``keys`` over dense vnodes with the table's rule, every segment in
    one walk that fetches the row ``AHEAD`` keys on whatever vnode it is in (a request of a
    few thousand keys holds a few tens a vnode: a look-ahead inside a vnode left the first
    of each unfetched).  Every key is placed first: if one is not in its vnode, nothing is
    applied and its index is returned; else -1.  The arithmetic is ``dense.dense_apply``'s,
    in the same order: the same bits."""
    row, address, bad = dense_places(d, slot, vnodes, counts, keys, layout)
    if bad >= 0:
        return bad
    flag = rows0.shape[1] - 1  # the last column: 1 once the key is stored
    scratch = new_scratch(rows0)  # compact rows are updated in a float32 copy (``compact.py``)
    a = 0
    for sg in range(vnodes.shape[0]):
        rows, meta = dense_arrays(d, slot[vnodes[sg]], rows0, meta0)
        work = work_rows(rows, scratch)
        for i in range(np.uint64(a), np.uint64(a + counts[sg])):
            prefetch_address(address[i + U_AHEAD])
            key, r = keys[i], row[i]
            w = load_row(rows, r, scratch, flag, DIM)  # row w of work: r itself for float32 rows
            if rows[r, flag] == 0:
                init_row(work, w, key, DIM, flag, KIND, ohp, ikind, ihp, seed)
                rows[r, flag] = 1
                meta[COUNT] += 1
            push_row(work, w, grads, i, DIM, OP_UPDATE, KIND, ohp)
            store_row(rows, r, scratch, flag, DIM, key)
        a += counts[sg]
    return -1
