"""A step's keys routed (``client.steps``): each batch's distinct keys grouped by vnode as a
pull's are (``partition.route_pull``), and each occurrence's key as its place among them, for
one batch or the batches of a step of several (``wire/step_groups.py``), in one compiled call
that writes the request's arrays in place, end to end (a routing, a list of servers' parts
and a copy a batch cost a group of 16 ~50 µs of Python and a concatenation a batch).  The
call reads each batch's own arrays where they are, by address (``intrinsics.view_like``):
joined first, a job's occurrences (8 bytes each, ~40 a CTR row) were copied once more for
nothing, 0.075 s of the default job's worker.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from paramserver._runtime.intrinsics import view_like
from paramserver.routing.hashing import vnode_of_key
from paramserver.routing.ring import Ring


@njit(inline="always", nogil=True, cache=True)
def _group_batch(keys, inverse, n_vnodes, vnode_rank, by_rank, layout, skeys, rank, seg_vnodes, seg_counts,  # type: ignore[no-untyped-def]
                 counts, fill, bucket, place):
    """One batch: its distinct ``keys`` into ``skeys`` by the rank of their vnode (a counting
    sort, stable; ``skeys`` may be narrower, its caller knows they fit), each occurrence's key
    (``inverse``) as its place among them into ``rank``, and its vnode segments (vnode, keys),
    in rank order, into ``seg_vnodes``/``seg_counts``.  The segments, or -1 where an
    occurrence names none of its keys.  ``counts``, ``fill``: scratch of ``n_vnodes``;
    ``bucket``, ``place``: of the keys."""
    m = keys.shape[0]
    counts[:] = 0
    for i in range(m):
        r = vnode_rank[vnode_of_key(keys[i], n_vnodes, layout)]
        bucket[i] = r
        counts[r] += 1
    p, s = 0, 0
    for r in range(n_vnodes):
        fill[r] = p
        if counts[r]:
            seg_vnodes[s] = by_rank[r]
            seg_counts[s] = counts[r]
            s += 1
        p += counts[r]
    for i in range(m):
        r = bucket[i]
        q = fill[r]
        skeys[q] = keys[i]
        place[i] = q
        fill[r] = q + 1
    for j in range(inverse.shape[0]):
        u = inverse[j]
        if u < 0 or u >= m:
            return -1
        rank[j] = place[u]
    return s


@njit(nogil=True, cache=True)
def _group_steps(key_like, key_at, inv_like, inv_at, sizes, n_vnodes, vnode_rank, by_rank, layout, skeys, rank,  # type: ignore[no-untyped-def]
                 seg_vnodes, seg_counts, seg_ends):
    """For each batch b (its keys ``sizes[b, 0]`` uint64 at address ``key_at[b]``, its
    occurrences ``sizes[b, 1]`` int64 at ``inv_at[b]``; ``key_like``, ``inv_like``: arrays
    of those types): ``_group_batch`` into its own ranges of ``skeys`` and ``rank``, its
    segments appended to ``seg_vnodes``/``seg_counts``, ``seg_ends[b]`` the segments so far.
    The segments in all, or ``-1 - b`` where an occurrence of batch b names none of its keys."""
    counts = np.empty(n_vnodes, np.int64)
    fill = np.empty(n_vnodes, np.int64)
    bucket = np.empty(skeys.shape[0], np.int32)
    place = np.empty(skeys.shape[0], np.int64)
    a, j0, s = 0, 0, 0
    for b in range(sizes.shape[0]):
        m, nnz = sizes[b, 0], sizes[b, 1]
        keys = view_like(key_like, key_at[b], m, 8)  # type: ignore[call-arg,var-annotated]  # (an intrinsic's typing)
        inverse = view_like(inv_like, inv_at[b], nnz, 8)
        got = _group_batch(keys, inverse, n_vnodes, vnode_rank, by_rank, layout, skeys[a:a + m], rank[j0:j0 + nnz],
                           seg_vnodes[s:], seg_counts[s:], counts, fill, bucket[a:a + m], place[a:a + m])
        if got < 0:
            return -1 - b
        s += got
        seg_ends[b] = s
        a, j0 = a + m, j0 + nnz
    return s


@njit(nogil=True, cache=True)
def _largest(key_like, key_at, sizes):  # type: ignore[no-untyped-def]
    """The largest of the batches' keys (batch b: ``sizes[b, 0]`` uint64 at ``key_at[b]``), 0 where none."""
    top = np.uint64(0)
    for b in range(sizes.shape[0]):
        keys = view_like(key_like, key_at[b], sizes[b, 0], 8)  # type: ignore[call-arg,var-annotated]
        for i in range(sizes[b, 0]):
            top = max(top, keys[i])
    return top


@njit(nogil=True, cache=True)
def _ones(val_like, val_at, counts):  # type: ignore[no-untyped-def]
    """Whether every value of the arrays (``counts[b]`` float32 at ``val_at[b]``) is 1."""
    for b in range(counts.shape[0]):
        vals = view_like(val_like, val_at[b], counts[b], 4)  # type: ignore[call-arg,var-annotated]
        for j in range(counts[b]):
            if vals[j] != 1:
                return False
    return True


_KEYS_LIKE, _INVERSE_LIKE = np.zeros(1, np.uint64), np.zeros(1, np.int64)  # the types the call reads them as
_VALS_LIKE = np.zeros(1, np.float32)


def every_value_one(vals: Sequence[np.ndarray]) -> bool:
    """Whether every value of ``vals`` (a step's batches' values) is 1, as a CTR row's are: then
    none go.  One compiled pass that stops at the first other value: a comparison and a
    reduction a batch in numpy made a temporary of each and cost the default job's worker
    0.03 s of its main thread."""
    held, at = _addresses(vals, np.float32)
    return bool(_ones(_VALS_LIKE, at, np.array([v.shape[0] for v in held], np.int64)))


def _addresses(arrays: Sequence[np.ndarray], dtype: type) -> tuple[list[np.ndarray], np.ndarray]:
    """``arrays`` as ``dtype`` and contiguous (each converted only where it is not), kept
    alive by the caller while the call reads them, and their addresses."""
    held = [a if a.dtype == dtype and a.flags.c_contiguous else np.ascontiguousarray(a, dtype) for a in arrays]
    return held, np.array([a.ctypes.data for a in held], np.int64)


def route_steps(ring: Ring, keys: Sequence[np.ndarray], inverse: Sequence[np.ndarray], layout: int,
                key_dtype: np.dtype | None, rank_dtype: np.dtype) -> tuple[np.ndarray, ...] | int:
    """The batches of a step (batch b: its distinct keys ``keys[b]``, its occurrences
    ``inverse[b]`` indexing them), each batch's keys grouped by vnode as ``route_pull``
    groups them: ``(keys, rank, vnodes, counts, segments)``, the batches end to end: the keys
    (``key_dtype``) and the occurrences' places among them (``rank_dtype``) in each batch's
    own range, the vnode segments of all batches (batch b's ``segments[b - 1]:segments[b]``).
    ``key_dtype`` None: ``<u4`` where every key is below 2^32, else ``<u8`` (one compiled pass:
    numpy's ``max`` a batch cost the default job's worker 0.035 s of its main thread).
    The index of the first batch one of whose occurrences names none of its keys, where one does."""
    held_keys, key_at = _addresses(keys, np.uint64)
    held_inverse, inv_at = _addresses(inverse, np.int64)
    sizes = np.array([[k.shape[0], i.shape[0]] for k, i in zip(held_keys, held_inverse, strict=True)],
                     np.int64).reshape(-1, 2)
    if key_dtype is None:
        key_dtype = np.dtype("<u8" if int(_largest(_KEYS_LIKE, key_at, sizes)) >= 1 << 32 else "<u4")
    total_keys, total_occurrences = (int(x) for x in sizes.sum(axis=0))
    skeys = np.empty(total_keys, key_dtype)
    rank = np.empty(total_occurrences, rank_dtype)
    seg_vnodes = np.empty(min(total_keys, sizes.shape[0] * ring.n_vnodes), np.int32)
    seg_counts = np.empty(seg_vnodes.shape[0], np.int64)
    seg_ends = np.empty(sizes.shape[0], np.int64)
    s = _group_steps(_KEYS_LIKE, key_at, _INVERSE_LIKE, inv_at, sizes, ring.n_vnodes, ring.vnode_rank, ring.by_rank,
                     layout, skeys, rank, seg_vnodes, seg_counts, seg_ends)
    if s < 0:
        return -1 - int(s)
    return skeys, rank, seg_vnodes[:s], seg_counts[:s], seg_ends

