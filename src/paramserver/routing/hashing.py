"""The one key hash of the system, and the vnode a hash falls in.

``hash64`` is the 64-bit finaliser of MurmurHash3 (``fmix64``): a bijection on uint64
with full avalanche, so hashed feature ids that are already uniform stay uniform and
sequential ids (0, 1, 2, ...) spread evenly.  Every component hashes a key the same way:
the ring takes the *high* 32 bits (which vnode), the per-vnode hash table takes the *low*
32 bits (which slot), so the two never correlate.

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


@njit(nogil=True, cache=True)
def hash64_array(keys):
    out = np.empty(keys.shape[0], np.uint64)
    for i in range(keys.shape[0]):
        out[i] = hash64(keys[i])
    return out


@njit(nogil=True, cache=True)
def vnodes_of_keys(keys, n_vnodes):
    out = np.empty(keys.shape[0], np.int64)
    for i in range(keys.shape[0]):
        out[i] = vnode_of_hash(hash64(keys[i]), n_vnodes)
    return out
