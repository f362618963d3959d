"""The arithmetic of the built-in filters, vectorised (numba, GIL released): keys as
zigzag deltas in a variable-length code, floats as bf16, and int8 with a power-of-two
scale per block.

Every decoder checks what it reads (a truncated or overlong code, a block exponent out
of range) and reports it as a status, never reads past its input: a malformed message
is refused, it never crashes a node.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)


@njit(nogil=True, cache=True)
def _mix(h):  # type: ignore[no-untyped-def]
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


@njit(nogil=True, cache=True)
def digest128(words, seed):  # type: ignore[no-untyped-def]
    """Two independent 64-bit lanes over ``words`` (uint64): a 128-bit digest of a key list
    at memory speed (blake2b took 1.1 ms for 80 000 keys, 10x this).  Not a cryptographic
    hash: what it names is checked by the server that stores it (``KeyStore``), and a
    cluster that does not trust its workers has keys (CurveZMQ)."""
    a = np.uint64(seed) ^ _M1
    b = np.uint64(seed) ^ _M2
    for i in range(words.shape[0]):  # independent terms (a sum, with each word's place mixed in): vectorised
        p = np.uint64(i) * _M1
        a += _mix(words[i] ^ p)
        b += _mix((words[i] + p) ^ _M2)
    return _mix(a ^ np.uint64(words.shape[0])), _mix(b + a)


#: rows of an int8 block at most: a block is a run of rows inside one vnode segment
INT8_BLOCK_VALUES = 256
#: the exponent of an all-zero block
ZERO_BLOCK = -128


@njit(nogil=True, cache=True)
def varint_encode(keys):  # type: ignore[no-untyped-def]
    """``keys`` (uint64) as the LEB128 code of the zigzag of each difference from the key
    before it: sorted keys (a batch's ``np.unique``) of a 2**24 space take 1-3 bytes each,
    any order stays lossless (a difference wraps around 2**64)."""
    out = np.empty(keys.shape[0] * 10, np.uint8)
    prev = np.uint64(0)
    p = 0
    for i in range(keys.shape[0]):
        d = np.int64(keys[i] - prev)  # wraps: any order round-trips
        prev = keys[i]
        z = np.uint64((d << 1) ^ (d >> 63))
        while z >= np.uint64(0x80):
            out[p] = np.uint8((z & np.uint64(0x7F)) | np.uint64(0x80))
            z >>= np.uint64(7)
            p += 1
        out[p] = np.uint8(z)
        p += 1
    return out[:p]


@njit(nogil=True, cache=True)
def varint_decode(buf, n):  # type: ignore[no-untyped-def]
    """``varint_encode``'s inverse: (keys, status), status 0 when ``buf`` held exactly
    ``n`` codes, 1 when it ran out, 2 when bytes were left over, 3 for a code over 10 bytes."""
    keys = np.empty(n, np.uint64)
    prev = np.uint64(0)
    p = 0
    for i in range(n):
        z = np.uint64(0)
        shift = np.uint64(0)
        while True:
            if p >= buf.shape[0]:
                return keys, 1
            b = np.uint64(buf[p])
            p += 1
            z |= (b & np.uint64(0x7F)) << shift
            if b < np.uint64(0x80):
                break
            shift += np.uint64(7)
            if shift > np.uint64(63):
                return keys, 3
        d = np.int64(z >> np.uint64(1)) ^ -np.int64(z & np.uint64(1))
        prev = prev + np.uint64(d)
        keys[i] = prev
    if p != buf.shape[0]:
        return keys, 2
    return keys, 0


def bf16_encode(values: np.ndarray) -> np.ndarray:
    """float32 → the upper 16 bits, rounded to the nearest (ties to even); as uint16."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def bf16_decode(half: np.ndarray) -> np.ndarray:
    return (half.astype(np.uint32) << np.uint32(16)).view(np.float32)


@njit(nogil=True, cache=True)
def _block_exponent(lo, hi, flat):  # type: ignore[no-untyped-def]
    m = 0.0
    for j in range(lo, hi):
        a = abs(flat[j])
        if a > m:
            m = a
    if m == 0.0:
        return ZERO_BLOCK
    mant, e = math.frexp(m / 127.0)  # m/127 = mant * 2**e, mant in [0.5, 1): 2**e >= m/127
    if mant == 0.5:
        e -= 1  # m/127 is a power of two itself
    return max(min(e, 127), -127)


@njit(nogil=True, cache=True)
def int8_encode(values, counts, block_rows):  # type: ignore[no-untyped-def]
    """Rows of ``values`` (float32 [n, dim]) as int8 with one power-of-two scale per block
    (``block_rows`` rows at most, never across a segment of ``counts``).  Exact on its own
    output: a decoded block encodes to the same bytes, so a piece routed again after a
    ring change (its segments whole) carries the values its first encoding did."""
    n, dim = values.shape
    flat = values.reshape(-1)
    n_blocks = 0
    for c in counts:
        n_blocks += (c + block_rows - 1) // block_rows
    q = np.empty(n * dim, np.int8)
    exps = np.empty(n_blocks, np.int8)
    row, b = 0, 0
    for c in counts:
        end = row + c
        while row < end:
            stop = min(row + block_rows, end)
            e = _block_exponent(row * dim, stop * dim, flat)
            exps[b] = e
            scale = 0.0 if e == ZERO_BLOCK else math.ldexp(1.0, -e)
            for j in range(row * dim, stop * dim):
                q[j] = np.int8(min(max(np.rint(flat[j] * scale), -127.0), 127.0))
            row, b = stop, b + 1
    return q, exps


@njit(nogil=True, cache=True)
def int8_roundtrip(values, counts, block_rows):  # type: ignore[no-untyped-def]
    """``int8_decode(int8_encode(values))`` in one pass a block, without the int8 array:
    what a worker's error feedback needs to know of a push it rounds."""
    n, dim = values.shape
    flat = values.reshape(-1)
    out = np.empty((n, dim), np.float32)
    rounded = out.reshape(-1)
    row = 0
    for c in counts:
        end = row + c
        while row < end:
            stop = min(row + block_rows, end)
            e = _block_exponent(row * dim, stop * dim, flat)
            if e == ZERO_BLOCK:
                for j in range(row * dim, stop * dim):
                    rounded[j] = 0.0
            else:
                scale, step = math.ldexp(1.0, -e), math.ldexp(1.0, e)
                for j in range(row * dim, stop * dim):
                    rounded[j] = np.float32(min(max(np.rint(flat[j] * scale), -127.0), 127.0) * step)
            row = stop
    return out


@njit(nogil=True, cache=True)
def int8_decode(q, exps, counts, block_rows, dim):  # type: ignore[no-untyped-def]
    """``int8_encode``'s inverse: (values, status), status 0, or 1 when the blocks the
    counts make do not match ``exps`` and ``q``."""
    n = 0
    n_blocks = 0
    for c in counts:
        n += c
        n_blocks += (c + block_rows - 1) // block_rows
    out = np.zeros((n, dim), np.float32)
    if n_blocks != exps.shape[0] or n * dim != q.shape[0]:
        return out, 1
    flat = out.reshape(-1)
    row, b = 0, 0
    for c in counts:
        end = row + c
        while row < end:
            stop = min(row + block_rows, end)
            e = exps[b]
            if e != ZERO_BLOCK:
                scale = math.ldexp(1.0, e)
                for j in range(row * dim, stop * dim):
                    flat[j] = np.float32(q[j] * scale)
            row, b = stop, b + 1
    return out, 0


def _bit_positions() -> tuple[np.ndarray, np.ndarray]:
    """For each byte: how many bits it has set, and where (``sparse_decode``)."""
    count, where = np.zeros(256, np.int64), np.zeros((256, 8), np.int64)
    for byte in range(256):
        bits = [j for j in range(8) if byte >> j & 1]
        count[byte], where[byte, :len(bits)] = len(bits), bits
    return count, where


_SET, _AT = _bit_positions()


@njit(nogil=True, cache=True)
def sparse_encode(bits):  # type: ignore[no-untyped-def]
    """The non-zero words of ``bits`` (a float32 array's uint32 view, flat), and a mask of
    where they were (bit ``i & 7`` of byte ``i >> 3``): (mask, words).  A word is zero when
    all its bits are, so -0.0 is kept.  Eight zeros are passed over at once; otherwise each
    word is written and the count moves on by whether it was non-zero (no branch a word)."""
    n = bits.shape[0]
    mask = np.zeros((n + 7) >> 3, np.uint8)
    words = np.empty(n, np.uint32)
    m = 0
    whole = n & ~7
    for i in range(0, whole, 8):
        if (bits[i] | bits[i + 1] | bits[i + 2] | bits[i + 3] | bits[i + 4] | bits[i + 5] | bits[i + 6]
                | bits[i + 7]) == 0:
            continue
        byte = 0
        for j in range(8):
            w = bits[i + j]
            words[m] = w
            nonzero = int(w != 0)
            byte |= nonzero << j
            m += nonzero
        mask[i >> 3] = byte
    byte = 0
    for j in range(n - whole):
        w = bits[whole + j]
        words[m] = w
        nonzero = int(w != 0)
        byte |= nonzero << j
        m += nonzero
    if n > whole:
        mask[whole >> 3] = byte
    return mask, words[:m]


@njit(nogil=True, cache=True)
def marks_fit(mask, n_words, n):  # type: ignore[no-untyped-def]
    """Whether ``mask`` is ``n`` bits long, has none set past them and marks ``n_words``."""
    if mask.shape[0] != (n + 7) >> 3 or (n & 7 and mask[mask.shape[0] - 1] >> (n & 7)):
        return False
    marked = 0
    for b in range(mask.shape[0]):
        marked += _SET[mask[b]]
    return marked == n_words


@njit(nogil=True, cache=True)
def row_starts(mask, n, dim):  # type: ignore[no-untyped-def]
    """Where each of ``n`` rows of ``dim`` values begins among the words ``mask`` marks: a
    row's whole bytes counted by table, its ends (where a row does not start or end on a
    byte) bit by bit."""
    starts = np.zeros(n + 1, np.int64)
    for i in range(n):
        bit, end = i * dim, (i + 1) * dim
        marked = 0
        while bit < end and bit & 7:
            marked += (mask[bit >> 3] >> (bit & 7)) & 1
            bit += 1
        whole = (end - bit) >> 3
        first = np.uint64(bit >> 3)  # unsigned: no check for a negative index a byte
        for j in range(whole):
            marked += _SET[mask[first + np.uint64(j)]]
        bit += whole << 3
        while bit < end:
            marked += (mask[bit >> 3] >> (bit & 7)) & 1
            bit += 1
        starts[i + 1] = starts[i] + marked
    return starts


@njit(nogil=True, cache=True)
def sparse_decode(mask, words, n):  # type: ignore[no-untyped-def]
    """``sparse_encode``'s inverse: (the ``n`` words, status), status 0, or 1 when the mask
    is not ``n`` bits long, has a bit set past them, or marks other than ``words``' count."""
    out = np.zeros(n, np.uint32)
    if not marks_fit(mask, words.shape[0], n):  # counted first: the loop below reads no word past the last
        return out, 1
    m = 0
    for b in range(mask.shape[0]):
        byte = mask[b]
        if byte:  # eight zeros are already written
            for j in range(_SET[byte]):
                out[(b << 3) + _AT[byte, j]] = words[m + j]
            m += _SET[byte]
    return out, 0


@njit(nogil=True, cache=True)
def sparse_decode_rows(mask, words, index, out):  # type: ignore[no-untyped-def]
    """``sparse_decode`` of ``index.shape[0]`` rows of ``out.shape[1]`` values each, straight
    into ``out``'s rows: row ``i`` of the values becomes ``out[index[i]]``, which is zeroed
    and given its marked words (``out`` and ``words`` of the same kind: both a float32 array's
    uint32 view, bit for bit; or int32 and float32, each value converted as ``astype``
    converts).  Zeroing a row as it is written saves a dense array's zeroing, a pass over it
    and a scatter.  Status 0, or 1 as ``sparse_decode``'s (nothing written)."""
    n, dim = index.shape[0], out.shape[1]
    if not marks_fit(mask, words.shape[0], n * dim):
        return 1
    m = 0
    for i in range(n):
        row = out[index[i]]
        for j in range(dim):
            row[j] = 0
        lo, hi = i * dim, (i + 1) * dim
        first, last = lo >> 3, (hi - 1) >> 3
        for b in range(first, last + 1):
            byte = mask[b]
            if b == first:  # a row's bits need not start or end on a byte's
                byte &= (0xFF << (lo & 7)) & 0xFF
            if b == last and hi & 7:
                byte &= (1 << (hi & 7)) - 1
            at = (b << 3) - lo
            for j in range(_SET[byte]):
                row[at + _AT[byte, j]] = words[m + j]
            m += _SET[byte]
    return 0
