"""``Sightings``: how many times each key not yet stored was seen, in at most ~2 bytes a key.

A counting Bloom filter (a count-min sketch with one array): ``HASHES`` counters a key,
``bits`` bits each (2 when the threshold is at most 3, 4 up to 15, else 8), saturating;
a key's count is the least of its counters, and an increment raises only the counters at
that least value (the conservative update, which overcounts less).  A key that reaches
the threshold is admitted.

Its size follows the keys it counts: it starts at ``MIN_BYTES``, and once the keys counted
and left below the threshold reach one per ``BYTES_PER_KEY`` bytes, a new array twice as
large takes the increments while the one before is still read (a key's count is the sum
of both), until the next doubling.  At ``max_bytes`` it stops growing: each time as many
keys were counted again, every counter is halved (TinyLFU's reset), so old sightings fade
and the filter never saturates.

A key seen once is falsely admitted when its ``HASHES`` counters (in both generations)
were already raised by others to ``threshold - 1``.  Over 10**6 distinct keys seen once,
in pushes of 1 000, that happened to 4.2 % of them with ``after:2`` and to 0.03 % with
``after:3``, the sketch holding 1.6 bytes a key (``tests/unit/test_lifecycle.py`` checks
the first under 6 % on 2*10**5 keys).
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


@njit(inline="always", nogil=True, cache=True)
def _least(counters, bits, h1, h2):  # type: ignore[no-untyped-def]
    """The count of a key (hash halves ``h1``, ``h2``) in ``counters``: its least counter."""
    m = counters.shape[0] * (8 // bits)
    low = (1 << bits) - 1
    for j in range(3):
        c = _get(counters, (h1 + j * h2) & (m - 1), bits)
        if c < low:
            low = c
    return low


@njit(nogil=True, cache=True)
def _see(counters, old, bits, keys, weights, threshold, admitted):  # type: ignore[no-untyped-def]
    """Count ``weights[i]`` sightings of each of ``keys`` in ``counters`` (``old``: the
    generation before, read only, whose counts add); ``admitted[i]`` when key i reached
    the threshold.  Returns how many keys were left below it."""
    m = counters.shape[0] * (8 // bits)
    top = (1 << bits) - 1
    below = 0
    for i in range(keys.shape[0]):
        h = hash64(keys[i] ^ np.uint64(0x9E3779B97F4A7C15))
        h1 = np.int64(h & np.uint64(0xFFFFFFFF))
        h2 = np.int64(h >> np.uint64(32)) | 1
        low = _least(counters, bits, h1, h2)
        if low < top:
            new = min(low + weights[i], top)
            for j in range(3):
                p = (h1 + j * h2) & (m - 1)
                if _get(counters, p, bits) < new:  # the conservative update
                    _set(counters, p, bits, new)
            low = new
        if old.shape[0]:
            low += _least(old, bits, h1, h2)
        admitted[i] = low >= threshold
        if low < threshold:
            below += 1
    return below


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
        bits: bits a counter (2, 4 or 8; default: what ``threshold`` needs).
    """

    def __init__(self, threshold: int, max_bytes: int = 64 << 20, bits: int = 0) -> None:
        self.threshold = threshold
        self.bits = bits or counter_bits(threshold)
        self.max_bytes = max(MIN_BYTES, 1 << max(int(max_bytes).bit_length() - 1, 0))
        self.counters = np.zeros(MIN_BYTES, np.uint8)
        self.old = np.zeros(0, np.uint8)  # the generation before the last doubling (read only)
        self.pending = 0  # keys counted and left below the threshold since then
        self.resets = 0

    @property
    def nbytes(self) -> int:
        return int(self.counters.nbytes + self.old.nbytes)

    def see(self, keys: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """Count a sighting of each of ``keys`` (distinct; ``weights[i]`` sightings, whole
        numbers >= 0, where given); which of them are now admitted."""
        admitted = np.empty(keys.shape[0], np.bool_)
        w = np.ones(keys.shape[0], np.int64) if weights is None else np.ascontiguousarray(weights, np.int64)
        self.pending += int(_see(self.counters, self.old, self.bits, keys, w, self.threshold, admitted))
        if self.pending * BYTES_PER_KEY > self.counters.nbytes:
            if 2 * self.counters.nbytes + self.counters.nbytes <= self.max_bytes:
                self.old, self.counters = self.counters, np.zeros(2 * self.counters.nbytes, np.uint8)
            else:  # at its size: old sightings fade (TinyLFU's reset)
                self.old = np.zeros(0, np.uint8)
                _halve(self.counters, self.bits)
                self.resets += 1
            self.pending = 0
        return admitted
