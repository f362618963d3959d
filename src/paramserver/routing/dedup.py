"""A batch's distinct keys, in first-seen order, and each occurrence's index among them
(``unique_inverse``): what every training batch goes through before its keys are routed
(``Batch.unique``), ~40 occurrences a CTR row.

O(n) with an open-addressing table kept at most half full, sized for the distinct keys
rather than for every occurrence (a CTR batch repeats its keys ~3 times: the table stays
in L2).  A key's slot is the top bits of the key times ``_FIB`` (Fibonacci hashing spreads
sequential ids as well as hashed ones, one multiply where ``hash64``'s mix takes five
steps).  Where every key is below 2^32 - 1, as the default 24-bit hashed features are, a
slot holds the key and its index in one word (``_packed``): a probe that meets its key has
its index, where the general table (``_general``) kept an index a slot and read the key
back from the distinct keys, a second dependent load every occurrence.  A batch whose first
key does not fit goes to the general table at once (64-bit hashed keys), and the first that
does not fit later sends it there; both give the same output.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Fibonacci hashing's multiplier (2^64 / the golden ratio, odd)
_FIB = np.uint64(0x9E3779B97F4A7C15)
_LOW32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
#: an empty packed slot: key 2^32 - 1 (never packed) and index 2^32 - 1
_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)


@njit(inline="always", nogil=True, cache=True)
def _start_bits(n, expect):  # type: ignore[no-untyped-def]
    """log2 of a table's first size: twice ``expect`` distinct keys (default: a quarter of
    the ``n`` occurrences), at least 16 slots."""
    size, bits = 16, 4
    while size < 2 * min(n, expect if expect > 0 else n // 4 + 1):
        size *= 2
        bits += 1
    return bits


@njit(nogil=True, cache=True)
def _packed(keys, expect):  # type: ignore[no-untyped-def]
    """``unique_inverse`` with a slot a word, ``key << 32 | index``; ``(uniq, inverse, False)``
    where a key is 2^32 - 1 or more (the caller takes the general table)."""
    n = keys.shape[0]
    bits = _start_bits(n, expect)
    shift, mask = np.uint64(64 - bits), np.uint64((1 << bits) - 1)
    slots = np.full(1 << bits, _EMPTY, np.uint64)
    uniq = np.empty(n, np.uint64)
    inverse = np.empty(n, np.int64)
    m = 0
    for i in range(n):
        key = keys[i]
        if key >= _LOW32:
            return uniq, inverse, False
        s = (key * _FIB) >> shift
        while True:
            e = slots[s]
            if e >> _S32 == key:
                inverse[i] = np.int64(e & _LOW32)
                break
            if e == _EMPTY:
                if 2 * m >= slots.shape[0]:  # half full: the distinct keys into twice the slots
                    bits += 1
                    shift, mask = np.uint64(64 - bits), np.uint64((1 << bits) - 1)
                    slots = np.full(1 << bits, _EMPTY, np.uint64)
                    for t in range(m):
                        r = (uniq[t] * _FIB) >> shift
                        while slots[r] != _EMPTY:
                            r = (r + np.uint64(1)) & mask
                        slots[r] = uniq[t] << _S32 | np.uint64(t)
                    s = (key * _FIB) >> shift
                    continue
                slots[s] = key << _S32 | np.uint64(m)
                uniq[m] = key
                inverse[i] = m
                m += 1
                break
            s = (s + np.uint64(1)) & mask
    return uniq[:m].copy(), inverse, True


@njit(nogil=True, cache=True)
def _general(keys, expect):  # type: ignore[no-untyped-def]
    """``unique_inverse`` for any uint64 keys: a slot holds an index into ``uniq`` (-1: empty)."""
    n = keys.shape[0]
    bits = _start_bits(n, expect)
    shift, mask = np.uint64(64 - bits), np.uint64((1 << bits) - 1)
    slots = np.full(1 << bits, -1, np.int32)
    uniq = np.empty(n, np.uint64)
    inverse = np.empty(n, np.int64)
    m = 0
    for i in range(n):
        key = keys[i]
        s = (key * _FIB) >> shift
        while True:
            u = slots[s]
            if u < 0:
                if 2 * m >= slots.shape[0]:  # half full: the distinct keys into twice the slots
                    bits += 1
                    shift, mask = np.uint64(64 - bits), np.uint64((1 << bits) - 1)
                    slots = np.full(1 << bits, -1, np.int32)
                    for t in range(m):
                        r = (uniq[t] * _FIB) >> shift
                        while slots[r] >= 0:
                            r = (r + np.uint64(1)) & mask
                        slots[r] = t
                    s = (key * _FIB) >> shift
                    continue
                slots[s] = m
                uniq[m] = key
                inverse[i] = m
                m += 1
                break
            if uniq[u] == key:
                inverse[i] = u
                break
            s = (s + np.uint64(1)) & mask
    return uniq[:m].copy(), inverse


@njit(nogil=True, cache=True)
def unique_inverse(keys, expect=0):  # type: ignore[no-untyped-def]
    """Distinct keys in first-seen order and, for every key, its index among them.  The
    table starts at twice ``expect`` distinct keys (default: a quarter of ``len(keys)``)
    and doubles when half full."""
    # full 64-bit keys (hashed at --hash-bits 0): no packed table first; nor past 2^32 - 1
    # occurrences, whose indices would not fit a slot's 32 bits
    if keys.shape[0] and (keys[0] >= _LOW32 or keys.shape[0] >= _LOW32):
        return _general(keys, expect)
    uniq, inverse, packed = _packed(keys, expect)
    if packed:
        return uniq, inverse
    return _general(keys, expect)
