"""The one key hash of the system, and the vnode a hash falls in.

``hash64`` is the 64-bit finaliser of MurmurHash3 (``fmix64``): a bijection on uint64
with full avalanche, so hashed feature ids that are already uniform stay uniform and
sequential ids (0, 1, 2, ...) spread evenly.  Every component hashes a key the same way:
the ring takes the *high* 32 bits (which vnode), the per-vnode hash table takes the *low*
32 bits (which slot), so the two never correlate.

A *dense* table (``TableSpec.key_bits = b``) takes keys in ``[0, 2**b)`` only and
stores them in plain arrays rather than a hash table.  There a key's position on the
ring is ``dense_pos(key, b)``, the key times an odd constant modulo ``2**b`` (Fibonacci
hashing: a bijection, and sequential ids still spread over every vnode); vnode ``v`` is
the contiguous position range ``dense_range(v)``, and a key's row is its position minus
the range's start.

All functions are numba kernels; the ``*_array`` forms are the vectorised entry points
for Python callers.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
_S32 = np.uint64(32)
_LOW32 = np.uint64(0xFFFFFFFF)
#: the widest key space a dense table may have (positions times n_vnodes fit in 64 bits)
MAX_KEY_BITS = 32
_FIB = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, odd


def _inverse_mod_2_64(a: int) -> int:
    x = a  # Newton's iteration doubles the correct low bits each step (a * a = 1 mod 8)
    for _ in range(6):
        x = x * (2 - a * x) % (1 << 64)
    return x


_FIB_U = np.uint64(_FIB)
_FIB_INV = np.uint64(_inverse_mod_2_64(_FIB))


@njit(inline="always", nogil=True, cache=True)
def hash64(key):
    """MurmurHash3 fmix64 of one uint64 key."""
    k = np.uint64(key)
    k ^= k >> _S33
    k *= _C1
    k ^= k >> _S33
    k *= _C2
    k ^= k >> _S33
    return k


@njit(inline="always", nogil=True, cache=True)
def vnode_of_hash(h, n_vnodes):
    """Which of ``n_vnodes`` equal arcs of the ring the hash ``h`` falls in.

    Multiply-high of the top 32 bits ("fastrange"): exact equal arcs for any
    ``n_vnodes < 2**32``, no division, no search.
    """
    return np.int64(((h >> _S32) * np.uint64(n_vnodes)) >> _S32)


@njit(inline="always", nogil=True, cache=True)
def slot_of_hash(h, capacity):
    """Home slot of hash ``h`` in a table of ``capacity`` slots (low 32 bits)."""
    return np.int64(((h & _LOW32) * np.uint64(capacity)) >> _S32)


@njit(inline="always", nogil=True, cache=True)
def dense_pos(key, bits):
    """Position of ``key`` (< 2**bits) in a dense table's key space: a bijection."""
    return (np.uint64(key) * _FIB_U) & ((np.uint64(1) << np.uint64(bits)) - np.uint64(1))


@njit(inline="always", nogil=True, cache=True)
def dense_key(pos, bits):
    """The key at position ``pos``: the inverse of ``dense_pos``."""
    return (np.uint64(pos) * _FIB_INV) & ((np.uint64(1) << np.uint64(bits)) - np.uint64(1))


@njit(inline="always", nogil=True, cache=True)
def dense_start(v, n_vnodes, bits):
    """First position of vnode ``v``: ``ceil(v * 2**bits / n_vnodes)``."""
    return np.int64((np.uint64(v) * (np.uint64(1) << np.uint64(bits)) + np.uint64(n_vnodes - 1))
                    // np.uint64(n_vnodes))


@njit(inline="always", nogil=True, cache=True)
def vnode_of_key(key, n_vnodes, bits):
    """The vnode of ``key``: by its hash (``bits == 0``), or by its dense position."""
    if bits == 0:
        return vnode_of_hash(hash64(key), n_vnodes)
    return np.int64((dense_pos(key, bits) * np.uint64(n_vnodes)) >> np.uint64(bits))


def dense_range(v: int, n_vnodes: int, bits: int) -> tuple[int, int]:
    """Positions ``[start, stop)`` of vnode ``v`` in a dense table of ``2**bits`` keys."""
    return (-(-v * (1 << bits) // n_vnodes), -(-(v + 1) * (1 << bits) // n_vnodes))


@njit(nogil=True, cache=True)
def hash64_array(keys):
    out = np.empty(keys.shape[0], np.uint64)
    for i in range(keys.shape[0]):
        out[i] = hash64(keys[i])
    return out


@njit(nogil=True, cache=True)
def vnodes_of_keys(keys, n_vnodes, bits=0):
    out = np.empty(keys.shape[0], np.int64)
    for i in range(keys.shape[0]):
        out[i] = vnode_of_key(keys[i], n_vnodes, bits)
    return out


@njit(nogil=True, cache=True)
def dense_keys_of(start, positions, bits):
    """Keys at ``start + positions`` of a dense table (vectorised ``dense_key``)."""
    out = np.empty(positions.shape[0], np.uint64)
    for i in range(positions.shape[0]):
        out[i] = dense_key(start + positions[i], bits)
    return out
