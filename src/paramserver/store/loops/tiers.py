"""The loops of a table's two tiers (``store/tiers.py``): which of a request's keys are hot,
stamped as seen; and whole rows taken out of a vnode, to move to the other tier.

A tiered table's slots carry one more life column, ``seen``: the request count at which
the key was last read or written here.  The least recently seen keys go to the cold tier
first.
"""

from __future__ import annotations

from numba import njit

from paramserver.routing.hashing import hash64, slot_of_hash
from paramserver.store.loops.hash import COUNT, HAS_ZERO, find
from paramserver.store.loops.life import delete_one
from paramserver.store.loops.tags import exact, key_at, record_key, tag_of
from paramserver.store.loops.views import KEYS, LIFE, LIMIT, SLOTS, STRIDE, hash_arrays, life_rows


@njit(nogil=True, cache=True)
def seen_many(d, keys0, rows0, meta0, life0, slot, vnodes, counts, keys, column, clock, hot):
    """``hot[i]``: whether ``keys[i]`` (grouped by vnode, as a request's: vnodes held
    here) is stored in its vnode; the life column ``column`` of those that are is set to
    ``clock``.  How many are not."""
    a = 0
    cold = 0
    for s in range(vnodes.shape[0]):
        t = slot[vnodes[s]]
        b = a + counts[s]
        tkeys, _, meta = hash_arrays(d, t, keys0, rows0, meta0)
        life = life_rows(d, t, life0)
        for i in range(a, b):
            at = find(tkeys, meta, keys[i])
            hot[i] = at >= 0
            if at >= 0:
                life[at, column] = clock
            else:
                cold += 1
        a = b
    return cold


@njit(nogil=True, cache=True)
def take_many(d, keys0, rows0, meta0, life0, slot, vnodes, counts, keys, hot, out_rows, out_life, found, remove):
    """Copy out of a tier's vnodes (``slot``: -1 where it holds none) each of ``keys``
    not ``hot``: its row and life row to ``out_rows[i]``, ``out_life[i]``, and with
    ``remove`` remove it; ``found[i]`` marks those that were there.  How many."""
    a = 0
    n = 0
    for s in range(vnodes.shape[0]):
        t = slot[vnodes[s]]
        b = a + counts[s]
        if t < 0:
            for i in range(a, b):
                found[i] = False
            a = b
            continue
        tkeys, rows, meta = hash_arrays(d, t, keys0, rows0, meta0)
        life = life_rows(d, t, life0)
        for i in range(a, b):
            found[i] = False
            if hot[i]:
                continue
            at = exact(tkeys, meta, keys[i], find(tkeys, meta, keys[i]))
            if at < 0:
                continue
            found[i] = True
            n += 1
            for j in range(rows.shape[1]):
                out_rows[i, j] = rows[at, j]
            for j in range(life.shape[1]):
                out_life[i, j] = life[at, j]
            if remove:
                delete_one(tkeys, rows, meta, life, keys[i])
        a = b
    return n


#: slots past its home a cold key is looked for by ``cold_pages`` (at the cold tier's load
#: of 3/4, a probe ends within 8 slots all but about once in a thousand)
PROBE = 8


@njit(nogil=True, cache=True)
def cold_pages(d, slot, vnodes, counts, keys, hot, life_stride, shift, out):
    """The pages (addresses >> ``shift``) that finding each of ``keys`` not ``hot`` in
    its cold vnode reads (``slot``: -1 where a vnode has none; a request's grouping),
    without reading them: the pages of its home slot and of the slot ``PROBE`` past it
    (a row wider than a page / ``PROBE`` may have pages between), and of their life rows.
    Written to ``out`` (4 a key), how many."""
    a = 0
    n = 0
    for s in range(vnodes.shape[0]):
        t = slot[vnodes[s]]
        b = a + counts[s]
        if t >= 0:
            cap, stride, base, life = d[t, SLOTS], d[t, STRIDE], d[t, KEYS], d[t, LIFE]
            for i in range(a, b):
                if hot[i] or keys[i] == 0:  # (key 0's row is the vnode's last: one key)
                    continue
                home = slot_of_hash(hash64(keys[i]), cap)
                out[n] = (base + home * stride) >> shift
                out[n + 1] = (base + min(home + PROBE, cap - 1) * stride) >> shift
                n += 2
                if life != 0:
                    out[n] = (life + home * life_stride) >> shift
                    out[n + 1] = (life + min(home + PROBE, cap - 1) * life_stride) >> shift
                    n += 2
        a = b
    return n


@njit(nogil=True, cache=True)
def put_many(d, keys0, rows0, meta0, life0, slot, vnodes, counts, keys, src_rows, src_life, take, column, clock,
             seg, start):
    """Insert the ``take``-marked ``keys`` (not stored yet) with their rows and life rows
    into a tier's vnodes, segment by segment from (``seg``, key ``start`` in it); the life
    column ``column`` (if >= 0) set to ``clock``.  Where a vnode must grow first, or
    ``(len(vnodes), 0)`` when done (as ``many.apply_many``)."""
    a = 0
    for s in range(seg):
        a += counts[s]
    for s in range(seg, vnodes.shape[0]):
        t = slot[vnodes[s]]
        tkeys, rows, meta = hash_arrays(d, t, keys0, rows0, meta0)
        life = life_rows(d, t, life0)
        limit = d[t, LIMIT]
        b = a + counts[s]
        for i in range(a + start, b):
            if not take[i]:
                continue
            key = keys[i]
            if key == 0:
                at = tkeys.shape[0]
                meta[HAS_ZERO] = 1
            else:
                if meta[COUNT] >= limit:
                    return s, i - a
                tag = tag_of(tkeys, key)
                at = slot_of_hash(hash64(key), tkeys.shape[0])
                while tkeys[at] != 0 and tkeys[at] != tag:
                    at += 1
                    if at == tkeys.shape[0]:
                        at = 0
                if tkeys[at] == tag:  # a fingerprint's twin holds the slot: the key shares its row
                    continue
                tkeys[at] = tag
                record_key(tkeys, meta, at, key)
            meta[COUNT] += 1
            for j in range(rows.shape[1]):
                rows[at, j] = src_rows[i, j]
            for j in range(min(life.shape[1], src_life.shape[1])):  # a cold row has no ``seen`` column
                life[at, j] = src_life[i, j]
            if column >= 0:
                life[at, column] = clock
        start = 0
        a = b
    return vnodes.shape[0], 0


@njit(inline="always", nogil=True, cache=True)
def seen_bin(seen, width, bins):
    """The bin of a ``seen`` stamp, in ``bins`` steps of ``width`` from 0."""
    b = int(seen / width) if width > 0 else 0
    return min(max(b, 0), bins - 1)


@njit(nogil=True, cache=True)
def seen_counts(d, keys0, rows0, meta0, life0, n, column, clock, bins):
    """Over the first ``n`` vnodes of a directory: keys never seen since they came (0)
    are stamped ``clock``; then ``bins[t, b]`` counts the keys of vnode ``t`` whose
    ``seen`` falls in the b-th of ``bins.shape[1]`` equal steps from 0 to ``clock``."""
    width = clock / bins.shape[1]
    for t in range(n):
        tkeys, _, meta = hash_arrays(d, t, keys0, rows0, meta0)
        life = life_rows(d, t, life0)
        cap = tkeys.shape[0]
        for s in range(cap + 1):
            if s < cap and tkeys[s] == 0 or s == cap and not meta[HAS_ZERO]:
                continue
            if life[s, column] == 0:
                life[s, column] = clock
            bins[t, seen_bin(life[s, column], width, bins.shape[1])] += 1


@njit(nogil=True, cache=True)
def oldest(d, keys0, rows0, meta0, life0, n, column, clock, bins, cut_bin, need, have, turn, vnode_of, out_vnodes,
           out_keys):
    """The keys (and their vnodes, ``vnode_of[t]``) of the first ``n`` vnodes of a
    directory whose ``seen`` falls in a bin (as ``seen_counts``'s) below ``cut_bin[t]``,
    and ``need[t]`` of the ``have[t]`` in that bin, spread evenly over the vnode's slots
    (one every ``have / need`` met): taking the first met instead emptied one stretch of
    slots and left the rest full, whose runs then cost a missing key's probe hundreds of
    slots (a bin is wide where ``seen`` is a generation, ``fingerprints.py``).  Each
    vnode's slots are walked from a point ``turn`` moves.  As many as ``out_keys`` holds;
    how many."""
    width = clock / bins
    at_most = out_keys.shape[0]
    k = 0
    for t in range(n):
        if cut_bin[t] < 0:
            continue
        tkeys, _, meta = hash_arrays(d, t, keys0, rows0, meta0)
        life = life_rows(d, t, life0)
        cap = tkeys.shape[0]
        first = turn % (cap + 1)
        spread = 0
        for i in range(cap + 1):
            s = first + i
            if s > cap:
                s -= cap + 1
            if k == at_most:
                return k
            if s < cap and tkeys[s] == 0 or s == cap and not meta[HAS_ZERO]:
                continue
            b = seen_bin(life[s, column], width, bins)
            take = b < cut_bin[t]
            if b == cut_bin[t]:  # Bresenham's walk: exactly need[t] of the have[t], evenly apart
                spread += need[t]
                if spread >= have[t]:
                    spread -= have[t]
                    take = True
            if take:
                out_vnodes[k] = vnode_of[t]
                if s < cap:  # (a conditional of a uint64 and a literal 0 would make a float64)
                    out_keys[k] = key_at(tkeys, meta, s)
                else:
                    out_keys[k] = 0
                k += 1
    return k
