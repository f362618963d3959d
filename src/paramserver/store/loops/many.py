"""The loops that walk every hash vnode segment of a request in one call (``store/vnodes.py``:
a request carries its keys grouped by vnode), over typed lists of the vnodes' arrays, and
the cached builders of those lists.

``store/kernels.py`` compiles ``apply_many`` again for a user's rule, rebinding its global
``apply`` by name.
"""

from __future__ import annotations

from numba import njit
from numba.typed import List

from paramserver.store.loops.hash import apply, find, lookup


@njit(nogil=True, cache=True)
def lookup_many(keys_l, rows_l, meta_l, slot, vnodes, counts, keys, out, dim, ikind, ihp, seed):
    a = 0
    for s in range(vnodes.shape[0]):
        t = slot[vnodes[s]]
        b = a + counts[s]
        lookup(keys_l[t], rows_l[t], meta_l[t], keys[a:b], out[a:b], dim, ikind, ihp, seed)
        a = b


@njit(nogil=True, cache=True)
def apply_many(keys_l, rows_l, meta_l, limits, slot, vnodes, counts, keys, grads, seg, start,
                dim, op, okind, ohp, ikind, ihp, seed):
    """Apply segment by segment from (``seg``, key ``start`` in it); return where a vnode
    must grow first, or ``(len(vnodes), 0)`` when done."""
    a = 0
    for s in range(seg):
        a += counts[s]
    for s in range(seg, vnodes.shape[0]):
        t = slot[vnodes[s]]
        b = a + counts[s]
        i = apply(keys_l[t], rows_l[t], meta_l[t], keys[a:b], grads[a:b], start, limits[t],
                   dim, op, okind, ohp, ikind, ihp, seed)
        if i < b - a:
            return s, i
        start = 0
        a = b
    return vnodes.shape[0], 0


@njit(nogil=True, cache=True)
def missing_many(keys_l, meta_l, slot, vnodes, counts, keys):
    missing, a = 0, 0
    for s in range(vnodes.shape[0]):
        t = slot[vnodes[s]]
        for i in range(a, a + counts[s]):
            if find(keys_l[t], meta_l[t], keys[i]) < 0:
                missing += 1
        a += counts[s]
    return missing


@njit(cache=True)
def new_lists(keys, rows, meta):
    """Typed lists holding one vnode's arrays: built in compiled (and cached) code,
    because a typed list made and appended to from Python compiles afresh in every
    process (~0.9 s of each server's start)."""
    keys_l, rows_l, meta_l = List(), List(), List()
    keys_l.append(keys)
    rows_l.append(rows)
    meta_l.append(meta)
    return keys_l, rows_l, meta_l


@njit(cache=True)
def append_arrays(keys_l, rows_l, meta_l, keys, rows, meta):
    keys_l.append(keys)
    rows_l.append(rows)
    meta_l.append(meta)


@njit(cache=True)
def set_arrays(keys_l, rows_l, t, keys, rows):
    """``keys_l[t], rows_l[t] = keys, rows``: a typed list's ``__setitem__`` called from
    Python is compiled afresh in every process (~1 s, measured with py-spy); this is cached."""
    keys_l[t] = keys
    rows_l[t] = rows
