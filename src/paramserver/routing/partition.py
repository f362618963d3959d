"""Client-side routing of a key batch: group by (server, vnode), merge duplicates.

One pass hashes every key and counting-sorts it by the rank of its vnode in
(owner, vnode) order, so each server's keys are one contiguous slice and, inside it, each
vnode's keys are contiguous too (the server then works vnode by vnode in a cache-sized
table).  For a push a second pass merges duplicate keys inside each vnode, summing their
gradients, with a small scratch hash table that stays in L2.  Everything is O(n), numba,
GIL released.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from numba import njit

from paramserver._runtime.threads import on_two
from paramserver.routing.hashing import block_shift, dense_pos, layout_bits, vnode_of_key
from paramserver.routing.ring import Ring

_LOW32 = np.uint64(0xFFFFFFFF)
#: Fibonacci hashing's multiplier (2^64 / the golden ratio, odd), as ``dedup._FIB``
_FIB = np.uint64(0x9E3779B97F4A7C15)
_S32 = np.uint64(32)


@njit(nogil=True, cache=True)
def _bucket_counts(keys, lo, hi, n_vnodes, vnode_rank, layout, bucket, counts):  # type: ignore[no-untyped-def]
    """``bucket[i]``: the rank of key ``i``'s vnode, for keys ``lo..hi-1``, counted in ``counts``."""
    for i in range(lo, hi):
        b = vnode_rank[vnode_of_key(keys[i], n_vnodes, layout)]
        bucket[i] = b
        counts[b] += 1


@njit(nogil=True, cache=True)
def _scatter(keys, rows, lo, hi, bucket, fill, skeys, srows, order, want_order):  # type: ignore[no-untyped-def]
    """Keys ``lo..hi-1`` (and their rows) to their buckets' next places (``fill``), in
    input order: one sequential write stream per bucket, inputs read in order."""
    dim = rows.shape[1]
    for i in range(lo, hi):
        b = bucket[i]
        p = fill[b]
        if want_order:
            order[p] = i
        skeys[p] = keys[i]
        for j in range(dim):
            srows[p, j] = rows[i, j]
        fill[b] = p + 1


@njit(inline="always", nogil=True, cache=True)
def _buckets(keys, n_vnodes, vnode_rank, layout):  # type: ignore[no-untyped-def]
    """A counting sort's first pass over ``keys``: each key's bucket (the rank of its vnode)
    and the buckets' offsets (``int64[n_vnodes + 1]``)."""
    bucket = np.empty(keys.shape[0], np.int32)
    counts = np.zeros(n_vnodes, np.int64)
    _bucket_counts(keys, 0, keys.shape[0], n_vnodes, vnode_rank, layout, bucket, counts)
    offsets = np.zeros(n_vnodes + 1, np.int64)
    for b in range(n_vnodes):
        offsets[b + 1] = offsets[b] + counts[b]
    return bucket, offsets


@njit(nogil=True, cache=True)
def _group_serial(keys, rows, n_vnodes, vnode_rank, want_order, layout):  # type: ignore[no-untyped-def]
    """``_group`` on the calling thread, in one compiled call (a small batch: the
    two-thread path's Python around its calls cost more than the batch)."""
    n = keys.shape[0]
    bucket, offsets = _buckets(keys, n_vnodes, vnode_rank, layout)
    order = np.empty(n if want_order else 0, np.int64)
    skeys = np.empty(n, np.uint64)
    srows = np.empty((n, rows.shape[1]), rows.dtype)
    _scatter(keys, rows, 0, n, bucket, offsets[:-1].copy(), skeys, srows, order, want_order)
    return skeys, srows, order, offsets


def _group(keys: np.ndarray, rows: np.ndarray, n_vnodes: int, vnode_rank: np.ndarray, want_order: bool,
           layout: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Counting sort of ``keys`` (and their ``rows``) by the rank of their vnode
    (``layout``: the table's, see ``hashing.layout_code``; 0 for the hash layout), stable.

    Returns the sorted keys, the sorted rows, ``order`` (sorted position -> input
    position; empty unless ``want_order``) and the bucket offsets
    (``int64[n_vnodes + 1]``).  Pass ``rows`` of width 0 to sort keys alone.  A big batch
    is counted and scattered in two halves on two threads: each bucket takes the first
    half's keys, then the second's, so the result is the one thread's.
    """
    n = keys.shape[0]
    if not _parallel(n):
        return _group_serial(keys, rows, n_vnodes, vnode_rank, want_order, layout)  # type: ignore[no-any-return]
    bucket = np.empty(n, np.int32)
    order = np.empty(n if want_order else 0, np.int64)
    skeys = np.empty(n, np.uint64)
    srows = np.empty((n, rows.shape[1]), rows.dtype)
    half = n // 2
    counts = np.zeros((2, n_vnodes), np.int64)
    on_two(lambda: _bucket_counts(keys, 0, half, n_vnodes, vnode_rank, layout, bucket, counts[0]),
           lambda: _bucket_counts(keys, half, n, n_vnodes, vnode_rank, layout, bucket, counts[1]), _ROUTE)
    offsets = np.zeros(n_vnodes + 1, np.int64)
    np.cumsum(counts.sum(axis=0), out=offsets[1:])
    fill = np.stack([offsets[:-1], offsets[:-1] + counts[0]])
    on_two(lambda: _scatter(keys, rows, 0, half, bucket, fill[0], skeys, srows, order, want_order),
           lambda: _scatter(keys, rows, half, n, bucket, fill[1], skeys, srows, order, want_order), _ROUTE)
    return skeys, srows, order, offsets


#: a batch of at least this many keys is grouped, and a push's duplicates merged, on two
#: threads (started and joined for the call: none is left running, so a driver that
#: routes a big batch can still fork its nodes, ``cluster/process.fork_safe``)
PARALLEL_KEYS = 1 << 17


_ROUTE = "paramserver-route"  # the helper thread's name


def _parallel(n: int) -> bool:
    return n >= PARALLEL_KEYS and (os.cpu_count() or 1) > 1


@njit(nogil=True, cache=True)
def _dedup_range(skeys, srows, offsets, b0, b1, uniq, sums, uoffsets):  # type: ignore[no-untyped-def]
    """Merge duplicate keys inside each of buckets ``b0..b1-1``, summing their rows; the
    merged keys and sums go to ``uniq``/``sums`` from position ``offsets[b0]`` on (never
    past a bucket's own input: a range can be merged beside another, on its own thread);
    ``uoffsets[b + 1]`` is where bucket ``b``'s end up.  Returns the position after them.

    A scratch table of >= 2x the largest bucket (power of two, L2-sized for 1e6-key
    batches) is reused across buckets; an entry is ``stamp << 32 | index``, the index of
    its key among the bucket's merged ones (the key itself is read back from ``uniq``,
    written moments before), stamped with its bucket so that it is never cleared.  A key's
    slot is the top bits of the key times ``_FIB`` (Fibonacci hashing, one multiply, as
    ``dedup.unique_inverse``'s), where ``hash64`` took five steps and an entry held the key
    too: 10^6 keys 9.4 -> 7.7 ms, a Zipf batch's 8.5 -> 6.1 (one thread; the same output,
    which is in first-seen order whatever the table's layout).  Everything is read and
    written sequentially but the scratch table.
    """
    dim = srows.shape[1]
    biggest = 0
    for b in range(b0, b1):
        biggest = max(biggest, offsets[b + 1] - offsets[b])
    size, bits = 16, 4
    while size < 2 * biggest:
        size *= 2
        bits += 1
    shift, mask = np.uint64(64 - bits), np.uint64(size - 1)
    scratch = np.zeros(size, np.uint64)  # stamp << 32 | index among the bucket's merged keys
    m = offsets[b0]
    for b in range(b0, b1):
        first = m
        stamp = np.uint64(b + 1) << _S32
        for p in range(offsets[b], offsets[b + 1]):
            key = skeys[p]
            s = (key * _FIB) >> shift
            while True:
                tag = scratch[s]
                if tag < stamp:  # empty for this bucket
                    scratch[s] = stamp | np.uint64(m - first)
                    uniq[m] = key
                    for j in range(dim):
                        sums[m, j] = srows[p, j]
                    m += 1
                    break
                u = first + np.int64(tag & _LOW32)
                if uniq[u] == key:
                    for j in range(dim):
                        sums[u, j] += srows[p, j]
                    break
                s = (s + np.uint64(1)) & mask
        uoffsets[b + 1] = m
    return m


@njit(nogil=True, cache=True)
def _move_down(keys, rows, start, stop, to):  # type: ignore[no-untyped-def]
    """``keys[to:to + n], rows[...] = keys[start:stop], ...`` in place, ``to < start``
    (forwards, so the overlap is safe; numpy would copy through a temporary)."""
    for i in range(stop - start):
        keys[to + i] = keys[start + i]
        for j in range(rows.shape[1]):
            rows[to + i, j] = rows[start + i, j]


@njit(nogil=True, cache=True)
def _dedup_serial(skeys, srows, offsets):  # type: ignore[no-untyped-def]
    """``_dedup_sum`` on the calling thread, in one compiled call (a small batch)."""
    uniq = np.empty(skeys.shape[0], np.uint64)
    sums = np.empty((skeys.shape[0], srows.shape[1]), np.float32)
    uoffsets = np.zeros(offsets.shape[0], np.int64)
    m = _dedup_range(skeys, srows, offsets, 0, offsets.shape[0] - 1, uniq, sums, uoffsets)
    return uniq[:m], sums[:m], uoffsets


def _dedup_sum(skeys: np.ndarray, srows: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, ...]:
    """Merge duplicate keys inside each bucket, summing their rows (in input order: the
    sums are the same bits on one thread or two).  Returns the merged keys, their sums
    and the buckets' offsets in them."""
    n, n_buckets = skeys.shape[0], offsets.shape[0] - 1
    mid = int(np.searchsorted(offsets, n // 2)) if _parallel(n) else 0
    if not 0 < mid < n_buckets:
        return _dedup_serial(skeys, srows, offsets)  # type: ignore[no-any-return]
    uniq = np.empty(n, np.uint64)
    sums = np.empty((n, srows.shape[1]), np.float32)
    uoffsets = np.zeros(n_buckets + 1, np.int64)
    low, high = on_two(lambda: _dedup_range(skeys, srows, offsets, 0, mid, uniq, sums, uoffsets),
                       lambda: _dedup_range(skeys, srows, offsets, mid, n_buckets, uniq, sums, uoffsets), _ROUTE)
    start = int(offsets[mid])
    if start > low:  # the upper half moves down to follow the lower one
        _move_down(uniq, sums, start, high, low)
        uoffsets[mid + 1:] -= start - low
    m = low + high - start
    return uniq[:m], sums[:m], uoffsets


@njit(nogil=True, cache=True)
def scatter_rows(src, index, out):  # type: ignore[no-untyped-def]
    """``out[index[i]] = src[i]``."""
    for i in range(index.shape[0]):
        u = index[i]
        for j in range(src.shape[1]):
            out[u, j] = src[i, j]


@njit(nogil=True, cache=True)
def scatter_rows_within(src, index, out, lo, hi):  # type: ignore[no-untyped-def]
    """``scatter_rows`` of the ``i`` whose ``index[i]`` lies in ``[lo, hi)``, in order."""
    for i in range(index.shape[0]):
        u = index[i]
        if lo <= u < hi:
            for j in range(src.shape[1]):
                out[u, j] = src[i, j]


def scatter_answer(src: np.ndarray, index: np.ndarray, out: np.ndarray) -> None:
    """``scatter_rows`` (a pull's answer into its caller's order), a big one on two threads
    that each write one half of ``out``'s rows and read all of ``index``: every row is written
    by one thread, in the order one thread writes it.  A pull of 10^6 keys: 3.6 -> 1.7 ms (its
    rows land all over ``out``; halves of ``index`` on two threads wrote the same lines from
    both cores, 3.2 ms)."""
    if not _parallel(index.shape[0]):
        scatter_rows(src, index, out)
        return
    half = out.shape[0] // 2
    on_two(lambda: scatter_rows_within(src, index, out, 0, half),
           lambda: scatter_rows_within(src, index, out, half, out.shape[0]), _ROUTE)


@dataclass(frozen=True)
class Part:
    """The slice of a routed batch that goes to one server."""

    server: int
    start: int  # into Routed.keys
    stop: int
    vnodes: np.ndarray  # int32, the vnodes present, in key order
    counts: np.ndarray  # int64, keys per vnode


@dataclass(frozen=True)
class Routed:
    """A key batch routed against one ring, grouped by server and vnode."""

    keys: np.ndarray  # uint64[m] in (server, vnode) order
    parts: list[Part]
    ring_version: int
    order: np.ndarray | None = None  # pull: int64[m], keys[p] is input key order[p]
    grads: np.ndarray | None = None  # push: float32[m, dim], duplicates summed


def _parts(ring: Ring, offsets: np.ndarray) -> list[Part]:
    """One part per server with keys: the ring's rank order groups vnodes by server
    (``Ring.rank_groups``, computed once a ring: this ran on every pull and push)."""
    counts = offsets[1:] - offsets[:-1]
    by_rank = ring.by_rank
    parts = []
    for server, lo, hi in ring.rank_groups:
        start, stop = int(offsets[lo]), int(offsets[hi])
        if start == stop:
            continue
        present = counts[lo:hi] > 0
        parts.append(Part(server=server, start=start, stop=stop, vnodes=by_rank[lo:hi][present],
                          counts=counts[lo:hi][present]))
    return parts


@njit(nogil=True, cache=True)
def _by_position(keys, rows, offsets, layout):  # type: ignore[no-untyped-def]
    """Each vnode's keys (and their rows) in the order of their dense positions, in place.

    A vnode's positions lie in its own range, so one counting pass spreads them over 256
    sub-ranges of it (a few keys each) and an insertion sort orders each: two passes, not
    the argsort a vnode that took 1.6 ms for 30 000 keys (nor a radix sort's four).  Keys
    in first-seen order (``unique_inverse``'s) are in no order at all, so a key codec needs
    this to find a vnode's keys close together."""
    n, n_buckets = keys.shape[0], offsets.shape[0] - 1
    pos = np.empty(n, np.uint64)
    low = np.empty(n_buckets, np.uint64)
    width = np.empty(n_buckets, np.uint64)
    for b in range(n_buckets):
        lo, hi = np.uint64(-1), np.uint64(0)
        for i in range(offsets[b], offsets[b + 1]):
            p = dense_pos(keys[i], layout)
            pos[i] = p
            lo, hi = min(lo, p), max(hi, p)
        low[b], width[b] = lo, (hi - lo) // np.uint64(256) + np.uint64(1) if hi >= lo else np.uint64(1)
    count = np.zeros(n_buckets * 256 + 1, np.int64)
    sub = np.empty(n, np.int64)
    for b in range(n_buckets):
        for i in range(offsets[b], offsets[b + 1]):
            sub[i] = b * 256 + np.int64((pos[i] - low[b]) // width[b])
            count[sub[i] + 1] += 1
    for d in range(n_buckets * 256):
        count[d + 1] += count[d]
    idx = np.empty(n, np.int64)
    for i in range(n):
        idx[count[sub[i]]] = i
        count[sub[i]] += 1
    for j in range(1, n):  # nearly sorted now: insertion moves each key a place or two
        i = idx[j]
        k = j - 1
        while k >= 0 and sub[idx[k]] == sub[i] and pos[idx[k]] > pos[i]:
            idx[k + 1] = idx[k]
            k -= 1
        idx[k + 1] = i
    sorted_keys = keys[idx]
    sorted_rows = rows[idx]
    keys[:] = sorted_keys
    rows[:] = sorted_rows


def positioned(layout: int) -> bool:
    """Whether a table's keys have dense positions other than themselves (a scattered
    dense layout), by which a vnode's keys lie close together."""
    return bool(layout_bits(layout)) and block_shift(layout) < 0


def route_pull(ring: Ring, keys: np.ndarray, layout: int = 0, ordered: bool = False) -> Routed:
    """Group ``keys`` by server and vnode (duplicates kept: a lookup is cheaper than a
    merge); ``layout`` is the table's (``TableSpec.layout``); ``ordered``: each vnode's
    keys by dense position (close together: what a key codec packs small)."""
    no_rows = np.empty((keys.shape[0], 0), np.float32)
    skeys, _, order, offsets = _group(keys, no_rows, ring.n_vnodes, ring.vnode_rank, True, layout)
    if ordered and positioned(layout):
        _by_position(skeys, order.reshape(-1, 1), offsets, layout)
    return Routed(skeys, _parts(ring, offsets), ring.version, order=order)


def route_push(ring: Ring, keys: np.ndarray, grads: np.ndarray, layout: int = 0, distinct: bool = False,
               ordered: bool = False) -> Routed:
    """Group ``keys`` by server and vnode, merging duplicate keys by summing their rows
    (``distinct``: the caller knows there are none, so skip looking; ~2/3 of the cost;
    ``ordered``: as ``route_pull``'s)."""
    skeys, srows, _, offsets = _group(keys, grads, ring.n_vnodes, ring.vnode_rank, False, layout)
    if ordered and positioned(layout):
        _by_position(skeys, srows, offsets, layout)
    if distinct:
        return Routed(skeys, _parts(ring, offsets), ring.version, grads=srows)
    uniq, sums, uoffsets = _dedup_sum(skeys, srows, offsets)
    return Routed(uniq, _parts(ring, uoffsets), ring.version, grads=sums)


def combine_duplicates(keys: np.ndarray, rows: np.ndarray, op: str) -> tuple[np.ndarray, np.ndarray]:
    """One row per distinct key, as push operation ``op`` would leave it after its
    duplicates in turn: ``max``/``min`` keep the largest/smallest, ``assign`` the last,
    ``add`` (and ``update``, and a row cache's ``merge``) their sum (which ``route_push`` does on its own, unless a
    filter must see the distinct keys first).  Vectorised: a stable sort and one ``reduceat``."""
    order = np.argsort(keys, kind="stable")
    skeys, srows = keys[order], rows[order]
    starts = np.flatnonzero(np.r_[True, skeys[1:] != skeys[:-1]]) if skeys.size else np.zeros(0, np.int64)
    if op == "max":
        combined = np.maximum.reduceat(srows, starts, axis=0) if starts.size else srows
    elif op == "min":
        combined = np.minimum.reduceat(srows, starts, axis=0) if starts.size else srows
    elif op == "assign":
        combined = srows[np.r_[starts[1:], skeys.size] - 1] if starts.size else srows
    elif op in ("add", "update", "merge"):
        combined = np.add.reduceat(srows, starts, axis=0) if starts.size else srows
    else:
        raise ValueError(f"combine_duplicates: unknown push operation {op!r}")
    return skeys[starts], np.ascontiguousarray(combined, np.float32)
