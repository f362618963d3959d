"""The compiled loops of a step's narrowest forms (``wire/step_arrays.py``): keys in three
bytes each, and a step's offsets as its rows' lengths in a byte each.

numpy has no three-byte integer: the keys go as ``|u1[n, 3]``, which numpy's strided copies
packed at 5.5 ns a key and widened at 4.7 (a 5 000-key step), ~0.1 s of the default job's
10^7 keys on the two sides together, 5.6 % of its examples a second (ten pairs against the
four-byte keys).  These loops take ~0.5 ns a key.  A group's offsets are each batch's from 0,
so its rows' lengths skip each batch's start, and reading them back puts it again.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_BYTE = np.uint64(0xFF)
_S8, _S16 = np.uint64(8), np.uint64(16)
#: the longest row whose length goes in a byte
ROW_BYTE = 255


@njit(nogil=True, cache=True)
def pack_keys(keys, out):  # type: ignore[no-untyped-def]
    """``out[i]``: ``keys[i]`` (below 2^24) as three little-endian bytes."""
    for i in range(keys.shape[0]):
        k = np.uint64(keys[i])
        out[i, 0] = k & _BYTE
        out[i, 1] = (k >> _S8) & _BYTE
        out[i, 2] = (k >> _S16) & _BYTE


@njit(nogil=True, cache=True)
def unpack_keys(three, out):  # type: ignore[no-untyped-def]
    """``out[i]``: the key of ``three[i]``'s three little-endian bytes."""
    for i in range(three.shape[0]):
        out[i] = np.uint64(three[i, 0]) | (np.uint64(three[i, 1]) << _S8) | (np.uint64(three[i, 2]) << _S16)


@njit(nogil=True, cache=True)
def row_lengths(indptr, examples, out):  # type: ignore[no-untyped-def]
    """``out``: the rows' lengths, batch after batch (``examples[b]`` rows, whose offsets are
    ``indptr``'s next ``examples[b] + 1``); False, with ``out`` part written, where a row is
    longer than ``ROW_BYTE`` or its offsets fall (they go as offsets then)."""
    at, j = 0, 0
    for b in range(examples.shape[0]):
        for r in range(at, at + examples[b]):
            d = indptr[r + 1] - indptr[r]
            if d < 0 or d > ROW_BYTE:
                return False
            out[j] = d
            j += 1
        at += examples[b] + 1
    return True


@njit(nogil=True, cache=True)
def row_offsets(lengths, examples, out):  # type: ignore[no-untyped-def]
    """``out``: each batch's offsets from 0 (``examples[b] + 1`` of them) of rows of ``lengths``."""
    j, at = 0, 0
    for b in range(examples.shape[0]):
        total = 0
        out[at] = 0
        for r in range(examples[b]):
            total += lengths[j]
            j += 1
            out[at + 1 + r] = total
        at += examples[b] + 1
