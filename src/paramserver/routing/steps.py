"""A step's keys routed (``client.steps``): each batch's distinct keys grouped by vnode as a
pull's are (``partition.route_pull``), and each occurrence's key as its place among them, for
one batch or the batches of a step of several (``wire/step_groups.py``) end to end, in one
compiled call that writes the request's arrays in place (a routing, a list of servers' parts
and a copy a batch cost a group of 16 ~50 µs of Python and a concatenation a batch).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from paramserver.routing.hashing import vnode_of_key
from paramserver.routing.ring import Ring


@njit(nogil=True, cache=True)
def _group_steps(keys, key_ends, inverse, occ_ends, n_vnodes, vnode_rank, by_rank, layout, skeys, rank,  # type: ignore[no-untyped-def]
                 seg_vnodes, seg_counts, seg_ends):
    """For each batch b (keys ``key_ends[b - 1]:key_ends[b]``, occurrences
    ``occ_ends[b - 1]:occ_ends[b]``): its keys into its own range of ``skeys`` by the rank of
    their vnode (a counting sort, stable; ``skeys`` may be narrower, its caller knows they
    fit), each occurrence's key as its place among them into ``rank``, and its vnode segments
    (vnode, keys), in rank order, appended to ``seg_vnodes``/``seg_counts``, ``seg_ends[b]``
    the segments so far.  The segments in all, or ``-1 - b`` where an occurrence of batch b
    names none of its keys."""
    counts = np.empty(n_vnodes, np.int64)
    fill = np.empty(n_vnodes, np.int64)
    bucket = np.empty(keys.shape[0], np.int32)
    place = np.empty(keys.shape[0], np.int64)
    a, j0, s = 0, 0, 0
    for b in range(key_ends.shape[0]):
        e = key_ends[b]
        counts[:] = 0
        for i in range(a, e):
            r = vnode_rank[vnode_of_key(keys[i], n_vnodes, layout)]
            bucket[i] = r
            counts[r] += 1
        p = a
        for r in range(n_vnodes):
            fill[r] = p
            if counts[r]:
                seg_vnodes[s] = by_rank[r]
                seg_counts[s] = counts[r]
                s += 1
            p += counts[r]
        for i in range(a, e):
            r = bucket[i]
            q = fill[r]
            skeys[q] = keys[i]
            place[i] = q - a
            fill[r] = q + 1
        m = e - a
        for j in range(j0, occ_ends[b]):
            u = inverse[j]
            if u < 0 or u >= m:
                return -1 - b
            rank[j] = place[a + u]
        seg_ends[b] = s
        a, j0 = e, occ_ends[b]
    return s


def route_steps(ring: Ring, keys: np.ndarray, key_ends: np.ndarray, inverse: np.ndarray, occ_ends: np.ndarray,
                layout: int, key_dtype: np.dtype, rank_dtype: np.dtype) -> tuple[np.ndarray, ...] | int:
    """The batches of a step, end to end (batch b: its distinct keys
    ``keys[key_ends[b - 1]:key_ends[b]]``, its occurrences ``inverse[occ_ends[b - 1]:occ_ends[b]]``
    indexing them), each batch's keys grouped by vnode as ``route_pull`` groups them:
    ``(keys, rank, vnodes, counts, segments)``, the keys (``key_dtype``) and the occurrences'
    places among them (``rank_dtype``) in each batch's own range, the vnode segments of all
    batches end to end (batch b's ``segments[b - 1]:segments[b]``).  The index of the first
    batch one of whose occurrences names none of its keys, where one does."""
    skeys = np.empty(keys.shape[0], key_dtype)
    rank = np.empty(inverse.shape[0], rank_dtype)
    seg_vnodes = np.empty(min(keys.shape[0], key_ends.shape[0] * ring.n_vnodes), np.int32)
    seg_counts = np.empty(seg_vnodes.shape[0], np.int64)
    seg_ends = np.empty(key_ends.shape[0], np.int64)
    s = _group_steps(keys, key_ends, inverse, occ_ends, ring.n_vnodes, ring.vnode_rank, ring.by_rank, layout,
                     skeys, rank, seg_vnodes, seg_counts, seg_ends)
    if s < 0:
        return -1 - int(s)
    return skeys, rank, seg_vnodes[:s], seg_counts[:s], seg_ends
