"""Rows as a bit mask of their non-zero values and those values, against dense vnodes: a
push that adds rows which the ``sparse`` filter packed (``filters/builtin.Sparse``: bit
``i & 7`` of byte ``i >> 3`` marks value ``i`` of the rows laid end to end, the words are
the marked values in order) applied as it arrived, without the rows made dense first.

A topic model's changes are such rows: ``paramserver lda`` at K = 1 000 pushes ~5 % non-zero
values, which the server decoded into a dense array (zeroed first), checked value by value,
and added value by value, zeros too: a pass over every value, four times.  Here the mask is
read eight bytes at a time and only the marked words are checked and added, each as the
generic loop adds it (``push_ops.push_row``: ``row + value`` in float32), so a value that
was not sent (a zero) is not added: a row holding -0.0 keeps it, where adding +0.0 made it
+0.0 (nothing else differs).  A push of 768 rows of 1 000 values, 4 % marked: 0.13 ms
against 0.53-0.57 ms decoded and added (one process, the two in turn).  Float32 rows only
(a compact row, fp16 or bf16, is updated through a float32 copy by the generic loop).

Everything is checked before anything is written: every key in its segment's vnode (by the
caller, ``VnodeSet.check``), the mask as long as the rows and marking as many words as there
are, every word finite; anything else changes nothing (``BAD``, or False from the caller), so
the caller can take the generic path, which refuses the request with its own error.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from paramserver._runtime.intrinsics import load_u64, prefetch_row
from paramserver.filters.kernels import marks_fit
from paramserver.routing.hashing import dense_pos
from paramserver.store.loops.hash import COUNT
from paramserver.store.loops.views import START, dense_arrays
from paramserver.tables.optim import init_row

#: what ``dense_add_masked_many`` answers when it applied nothing (see the module's doc)
BAD = 1
#: rows asked for this many keys ahead: a topic model's rows are kilobytes, a few in flight suffice
ROWS_AHEAD = 4
_EXPONENT = np.uint32(0x7F800000)  # a float32 is finite unless every bit of its exponent is set


@njit(nogil=True, cache=True)
def _finite(words):
    """Whether every word (a float32's bits) is finite: a running maximum, no branch a word."""
    top = np.uint32(0)
    for i in range(words.shape[0]):
        top = max(top, words[i] & _EXPONENT)
    return top != _EXPONENT


@njit(nogil=True, cache=True)
def dense_add_masked_many(d, rows0, meta0, slot, vnodes, counts, keys, mask, words, dim, layout, okind, ohp, ikind,
                          ihp, seed):
    """Add the masked rows (``mask`` and ``words``, a float32 array's uint32 view:
    ``keys.shape[0]`` rows of ``dim`` values end to end) to the float32 rows of ``keys``,
    grouped by vnode as ``dense_apply_many``'s; a row never stored starts as ``init_row``
    makes it; every key must be in its segment's vnode (``dense_check_many``, which the
    caller asks first).  0, or ``BAD`` with nothing written (see the module's doc)."""
    n = keys.shape[0]
    if not marks_fit(mask, words.shape[0], n * dim) or not _finite(words):
        return BAD
    values = words.view(np.float32)
    a, m = 0, 0
    for s in range(vnodes.shape[0]):
        t = slot[vnodes[s]]
        rows, meta = dense_arrays(d, t, rows0, meta0)
        flag, start = rows.shape[1] - 1, d[t, START]
        for i in range(a, a + counts[s]):
            _fetch_ahead(rows, start, keys, i + ROWS_AHEAD, a + counts[s], layout)
            r = np.int64(dense_pos(keys[i], layout)) - start
            if rows[r, flag] == 0:  # stored, as the general loop stores it, whether or not a value is marked
                init_row(rows, r, keys[i], dim, flag, okind, ohp, ikind, ihp, seed)
                rows[r, flag] = 1
                meta[COUNT] += 1
            m = _add_row(rows[r], mask, values, m, i * dim, (i + 1) * dim)
        a += counts[s]
    return 0


@njit(inline="always", nogil=True, cache=True)
def _add_row(row, mask, values, m, lo, hi):
    """Add the marked values ``[lo, hi)`` of the rows end to end (``values`` from ``m`` on) to
    ``row``, each as ``push_row`` adds it; the next value's index.  The mask is read eight
    bytes at a time and a marked value found by its bit (a count of trailing zeros): at 5 %
    non-zero, three words in four have none."""
    size, b = mask.shape[0], lo >> 3
    base = b << 3  # the bit the word read at byte b starts with
    while base < hi:
        word = load_u64(mask, b) if b + 8 <= size else _tail(mask, b)
        if base < lo:  # the row before's bits
            word &= ~((np.uint64(1) << np.uint64(lo - base)) - np.uint64(1))
        if hi - base < 64:  # the row after's
            word &= (np.uint64(1) << np.uint64(hi - base)) - np.uint64(1)
        while word:
            j = base + np.int64(trailing_zeros(word)) - lo
            row[j] = row[j] + values[m]
            m += 1
            word &= word - np.uint64(1)
        b += 8
        base += 64
    return m


@njit(inline="always", nogil=True, cache=True)
def _fetch_ahead(rows, start, keys, i, end, layout):
    """Ask for the first line of key ``i``'s row (in this vnode, ``i < end``): the rest of a
    wide row the hardware's prefetcher follows."""
    if i < end:
        r = np.int64(dense_pos(keys[i], layout)) - start
        if 0 <= r < rows.shape[0]:
            prefetch_row(rows, r)


@njit(inline="always", nogil=True, cache=True)
def _tail(mask, b):
    """The mask's last bytes from ``b`` on (fewer than eight) as the low bytes of a word."""
    word = np.uint64(0)
    for j in range(mask.shape[0] - b):
        word |= np.uint64(mask[b + j]) << np.uint64(8 * j)
    return word

