"""The loops that walk every hash vnode segment of a request in one call (``store/vnodes.py``:
a request carries its keys grouped by vnode), over the directory of the vnodes' arrays
(``views.py``).

``store/kernels.py`` compiles ``apply_many`` again for a user's rule, rebinding its global
``apply`` by name.
"""

from __future__ import annotations

from numba import njit

from paramserver.store.loops.hash import apply, find, lookup, lookup_whole
from paramserver.store.loops.views import LIMIT, hash_arrays


@njit(nogil=True, cache=True)
def lookup_many(d, keys0, rows0, meta0, slot, vnodes, counts, keys, out, dim, ikind, ihp, seed):
    a = 0
    for s in range(vnodes.shape[0]):
        tkeys, rows, meta = hash_arrays(d, slot[vnodes[s]], keys0, rows0, meta0)
        b = a + counts[s]
        lookup(tkeys, rows, meta, keys[a:b], out[a:b], dim, ikind, ihp, seed)
        a = b


@njit(nogil=True, cache=True)
def lookup_whole_many(d, keys0, rows0, meta0, slot, vnodes, counts, keys, out, dim, okind, ohp, ikind, ihp, seed):
    a = 0
    for s in range(vnodes.shape[0]):
        tkeys, rows, meta = hash_arrays(d, slot[vnodes[s]], keys0, rows0, meta0)
        b = a + counts[s]
        lookup_whole(tkeys, rows, meta, keys[a:b], out[a:b], dim, okind, ohp, ikind, ihp, seed)
        a = b


@njit(nogil=True, cache=True)
def apply_many(d, keys0, rows0, meta0, slot, vnodes, counts, keys, grads, seg, start, dim, op, okind, ohp, ikind,
               ihp, seed):
    """Apply segment by segment from (``seg``, key ``start`` in it); return where a vnode
    must grow first, or ``(len(vnodes), 0)`` when done."""
    a = 0
    for s in range(seg):
        a += counts[s]
    for s in range(seg, vnodes.shape[0]):
        t = slot[vnodes[s]]
        tkeys, rows, meta = hash_arrays(d, t, keys0, rows0, meta0)
        b = a + counts[s]
        i = apply(tkeys, rows, meta, keys[a:b], grads[a:b], start, d[t, LIMIT], dim, op, okind, ohp, ikind, ihp,
                  seed)
        if i < b - a:
            return s, i
        start = 0
        a = b
    return vnodes.shape[0], 0


@njit(nogil=True, cache=True)
def missing_many(d, keys0, rows0, meta0, slot, vnodes, counts, keys):
    missing, a = 0, 0
    for s in range(vnodes.shape[0]):
        tkeys, _, meta = hash_arrays(d, slot[vnodes[s]], keys0, rows0, meta0)
        for i in range(a, a + counts[s]):
            if find(tkeys, meta, keys[i]) < 0:
                missing += 1
        a += counts[s]
    return missing
