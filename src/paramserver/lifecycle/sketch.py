"""``Sightings``: how many times each key not yet stored was seen, in at most ~2 bytes a key.

A counting Bloom filter (a count-min sketch with one array): ``HASHES`` counters a key,
``bits`` bits each (2 when the threshold is at most 3, 4 up to 15, else 8), saturating;
a key's count is the least of its counters, and an increment raises only the counters at
that least value (the conservative update, which overcounts less).  A key that reaches
the threshold is admitted.

Its size follows the keys it counts: it starts at ``MIN_BYTES`` and doubles (each half a
copy of the old array, so no count is lost: positions are hash mod a power of two) while
the keys first seen exceed ``BYTES_PER_KEY`` a byte, up to ``max_bytes``.  There, once
as many new keys again were seen, every counter is halved (TinyLFU's reset), so old
sightings fade and the filter never saturates.

A key seen once is falsely admitted when its ``HASHES`` counters were already raised by
others to ``threshold - 1``.  At 2 bytes a key with 2-bit counters (threshold 2 or 3)
that is at most ``(1 - exp(-3 / 8))**3`` = 3.1 % of such keys (measured in
``tests/unit/test_lifecycle.py``); above the threshold 3 it is far smaller.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from paramserver.routing.hashing import hash64

HASHES = 3
MIN_BYTES = 1 << 12
BYTES_PER_KEY = 2
_SALT = np.uint64(0x9E3779B97F4A7C15)


@njit(inline="always", nogil=True, cache=True)
def _get(counters, p, bits):  # type: ignore[no-untyped-def]
    per = 8 // bits
    byte = p // per
    shift = (p % per) * bits
    return (counters[byte] >> shift) & ((1 << bits) - 1)


@njit(inline="always", nogil=True, cache=True)
def _set(counters, p, bits, value):  # type: ignore[no-untyped-def]
    per = 8 // bits
    byte = p // per
    shift = (p % per) * bits
    mask = ((1 << bits) - 1) << shift
    counters[byte] = (counters[byte] & ~mask) | (value << shift)


@njit(nogil=True, cache=True)
def _see(counters, bits, keys, threshold, admitted):  # type: ignore[no-untyped-def]
    """Count one sighting of each of ``keys``; ``admitted[i]`` when key i reached the
    threshold.  Returns how many keys were seen for the first time (all counters were 0)."""
    m = counters.shape[0] * (8 // bits)
    top = (1 << bits) - 1
    first = 0
    pos = np.empty(3, np.int64)
    for i in range(keys.shape[0]):
        h = hash64(keys[i] ^ np.uint64(0x9E3779B97F4A7C15))
        h1 = np.int64(h & np.uint64(0xFFFFFFFF))
        h2 = np.int64(h >> np.uint64(32)) | 1
        low = top
        for j in range(3):
            pos[j] = (h1 + j * h2) & (m - 1)
            c = _get(counters, pos[j], bits)
            if c < low:
                low = c
        if low == 0:
            first += 1
        if low < top:
            for j in range(3):
                if _get(counters, pos[j], bits) == low:
                    _set(counters, pos[j], bits, low + 1)
            low += 1
        admitted[i] = low >= threshold
    return first


@njit(nogil=True, cache=True)
def _halve(counters, bits):  # type: ignore[no-untyped-def]
    per = 8 // bits
    for b in range(counters.shape[0]):
        for q in range(per):
            p = b * per + q
            _set(counters, p, bits, _get(counters, p, bits) >> 1)


def counter_bits(threshold: int) -> int:
    """Bits a counter needs to count to ``threshold``."""
    return 2 if threshold <= 3 else 4 if threshold <= 15 else 8


class Sightings:
    """Counts of keys not yet stored, to admit each at its ``threshold``-th sighting.

    Args:
        threshold: sightings a key needs (2 to 255).
        max_bytes: the most the counters may take (they start at 4 KiB).
    """

    def __init__(self, threshold: int, max_bytes: int = 64 << 20) -> None:
        self.threshold = threshold
        self.bits = counter_bits(threshold)
        self.max_bytes = max(MIN_BYTES, 1 << max(int(max_bytes).bit_length() - 1, 0))
        self.counters = np.zeros(MIN_BYTES, np.uint8)
        self.first = 0  # keys first seen since the last doubling or halving
        self.resets = 0

    @property
    def nbytes(self) -> int:
        return int(self.counters.nbytes)

    def see(self, keys: np.ndarray) -> np.ndarray:
        """Count a sighting of each of ``keys`` (distinct); which of them are now admitted."""
        admitted = np.empty(keys.shape[0], np.bool_)
        self.first += int(_see(self.counters, self.bits, keys, self.threshold, admitted))
        if self.first * BYTES_PER_KEY > self.nbytes:
            if self.nbytes < self.max_bytes:
                self.counters = np.tile(self.counters, 2)  # counts kept: see the module's docstring
            else:
                _halve(self.counters, self.bits)
                self.resets += 1
            self.first = 0
        return admitted
