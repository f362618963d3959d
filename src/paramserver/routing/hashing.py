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

A dense table may instead be *range-partitioned* into parameter blocks
(``TableSpec.block_size = 2**s``): a key's position is the key itself, and each vnode is
a run of whole blocks of ``2**s`` contiguous keys, so a block lives wholly on one server
and a scheduled worker pulls or pushes it in one request (ps-lite's range ``Slicer``).

Dense functions take the table's *layout*, one int that says all of it
(``layout_code``): bits 0-7 are ``key_bits``, bits 8-15 are ``s + 1`` for a
range-partitioned table and 0 for a scattered one; 0 alone is the hash layout.

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
def hash64(key):  # type: ignore[no-untyped-def]
    """MurmurHash3 fmix64 of one uint64 key."""
    k = np.uint64(key)
    k ^= k >> _S33
    k *= _C1
    k ^= k >> _S33
    k *= _C2
    k ^= k >> _S33
    return k


@njit(inline="always", nogil=True, cache=True)
def vnode_of_hash(h, n_vnodes):  # type: ignore[no-untyped-def]
    """Which of ``n_vnodes`` equal arcs of the ring the hash ``h`` falls in.

    Multiply-high of the top 32 bits ("fastrange"): exact equal arcs for any
    ``n_vnodes < 2**32``, no division, no search.
    """
    return np.int64(((h >> _S32) * np.uint64(n_vnodes)) >> _S32)


@njit(inline="always", nogil=True, cache=True)
def slot_of_hash(h, capacity):  # type: ignore[no-untyped-def]
    """Home slot of hash ``h`` in a table of ``capacity`` slots (low 32 bits)."""
    return np.int64(((h & _LOW32) * np.uint64(capacity)) >> _S32)


def layout_code(key_bits: int, block_size: int = 0) -> int:
    """The layout int of a table: 0 (hash), or ``key_bits`` and, for a range-partitioned
    table, ``log2(block_size) + 1`` in bits 8-15 (``block_size``: a power of two)."""
    if not key_bits:
        return 0
    return key_bits | ((block_size.bit_length() << 8) if block_size else 0)


@njit(inline="always", nogil=True, cache=True)
def layout_bits(layout):  # type: ignore[no-untyped-def]
    """``key_bits`` of a layout: keys are < 2**key_bits (0: the hash layout)."""
    return np.int64(layout) & 0xFF


@njit(inline="always", nogil=True, cache=True)
def block_shift(layout):  # type: ignore[no-untyped-def]
    """``log2(block_size)`` of a range-partitioned layout; -1 for a scattered one."""
    return (np.int64(layout) >> 8) - 1


@njit(inline="always", nogil=True, cache=True)
def dense_pos(key, layout):  # type: ignore[no-untyped-def]
    """Position of ``key`` (< 2**key_bits) in a dense table's key space: a bijection
    (the identity for a range-partitioned table)."""
    mask = (np.uint64(1) << np.uint64(layout_bits(layout))) - np.uint64(1)
    if block_shift(layout) >= 0:
        return np.uint64(key) & mask
    return (np.uint64(key) * _FIB_U) & mask


@njit(inline="always", nogil=True, cache=True)
def dense_key(pos, layout):  # type: ignore[no-untyped-def]
    """The key at position ``pos``: the inverse of ``dense_pos``."""
    mask = (np.uint64(1) << np.uint64(layout_bits(layout))) - np.uint64(1)
    if block_shift(layout) >= 0:
        return np.uint64(pos) & mask
    return (np.uint64(pos) * _FIB_INV) & mask


@njit(inline="always", nogil=True, cache=True)
def block_vnode(block, block_bits, n_vnodes):  # type: ignore[no-untyped-def]
    """The vnode of parameter block ``b`` of ``N = 2**block_bits`` on ``n`` vnodes;
    non-decreasing in ``b``, so each vnode holds a contiguous run of blocks.

    With ``N >= n`` the runs are equal shares, ``floor(b n / N)``.  With fewer blocks
    than vnodes, an even spacing would put every block on vnodes ``0, g, 2g, ...``
    (``g = floor(n / N)``), which one server owns when the ring deals its vnodes
    round-robin and ``g`` is a multiple of the servers; so block ``b`` goes to
    ``b g + o_b`` instead, with ``o_b`` the sum of ``b``'s digits in base ``g``, mod ``g``
    (for ``g = 2``, the Thue-Morse sequence): strictly increasing, below ``N g <= n``,
    and its residues spread over every server's for any number of servers, where a plain
    ``b mod g`` only helps when the servers divide ``g``."""
    b = np.uint64(block)
    n = np.uint64(n_vnodes)
    if n <= (np.uint64(1) << np.uint64(block_bits)):
        return np.int64((b * n) >> np.uint64(block_bits))
    g = n >> np.uint64(block_bits)
    offset, x = np.uint64(0), b if g > 1 else np.uint64(0)  # b's digit sum in base g, mod g
    while x:
        offset += x % g
        x //= g
    return np.int64(b * g + offset % g)


@njit(inline="always", nogil=True, cache=True)
def vnode_of_key(key, n_vnodes, layout):  # type: ignore[no-untyped-def]
    """The vnode of ``key``: by its hash (``layout == 0``), by its dense position, or
    (range-partitioned) by its block (``block_vnode``)."""
    if layout == 0:
        return vnode_of_hash(hash64(key), n_vnodes)
    bits = layout_bits(layout)
    shift = block_shift(layout)
    if shift >= 0:
        return block_vnode(np.uint64(key) >> np.uint64(shift), bits - shift, n_vnodes)
    return np.int64((dense_pos(key, layout) * np.uint64(n_vnodes)) >> np.uint64(bits))


def to_positions(keys: np.ndarray, layout: int) -> np.ndarray:
    """``dense_pos`` of every key (a scattered dense layout), vectorised."""
    mask = np.uint64((1 << (layout & 0xFF)) - 1)
    with np.errstate(over="ignore"):
        out: np.ndarray = (keys.astype(np.uint64) * _FIB_U) & mask
    return out


def from_positions(positions: np.ndarray, layout: int) -> np.ndarray:
    """``dense_key`` of every position: ``to_positions``' inverse (keys < 2**key_bits)."""
    mask = np.uint64((1 << (layout & 0xFF)) - 1)
    with np.errstate(over="ignore"):
        out: np.ndarray = (positions.astype(np.uint64) * _FIB_INV) & mask
    return out


def dense_range(v: int, n_vnodes: int, layout: int) -> tuple[int, int]:
    """Positions ``[start, stop)`` of vnode ``v`` in a dense table's ``2**key_bits``
    positions: equal shares, cut at block boundaries if range-partitioned."""
    bits, shift = layout & 0xFF, (layout >> 8) - 1
    if shift < 0:
        return (-(-v * (1 << bits) // n_vnodes), -(-(v + 1) * (1 << bits) // n_vnodes))
    return (_blocks_before(v, bits - shift, n_vnodes) << shift, _blocks_before(v + 1, bits - shift, n_vnodes) << shift)


def _blocks_before(v: int, block_bits: int, n_vnodes: int) -> int:
    """How many blocks lie on vnodes before ``v`` (``block_vnode`` is increasing: a
    bisection over the blocks)."""
    lo, hi = 0, 1 << block_bits
    while lo < hi:
        mid = (lo + hi) // 2
        if int(block_vnode(mid, block_bits, n_vnodes)) < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(nogil=True, cache=True)
def hash64_array(keys):  # type: ignore[no-untyped-def]
    out = np.empty(keys.shape[0], np.uint64)
    for i in range(keys.shape[0]):
        out[i] = hash64(keys[i])
    return out


@njit(nogil=True, cache=True)
def vnodes_of_keys(keys, n_vnodes, layout=0):  # type: ignore[no-untyped-def]
    out = np.empty(keys.shape[0], np.int64)
    for i in range(keys.shape[0]):
        out[i] = vnode_of_key(keys[i], n_vnodes, layout)
    return out


@njit(nogil=True, cache=True)
def dense_keys_of(start, positions, layout):  # type: ignore[no-untyped-def]
    """Keys at ``start + positions`` of a dense table (vectorised ``dense_key``)."""
    out = np.empty(positions.shape[0], np.uint64)
    for i in range(positions.shape[0]):
        out[i] = dense_key(start + positions[i], layout)
    return out
