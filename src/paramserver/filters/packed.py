"""Rows of float32 values held as the ``sparse`` filter packs them: ``PackedRows``.

A push whose values are mostly zero (the counts a topic model moves) used to be made dense
by its producer, then read whole again on its way out: checked finite, copied into its
servers' and vnodes' order, and packed by ``sparse`` into a mask of one bit a value and its
non-zero words.  At 1 000 topics a piece of 768 rows is 3 MB dense and ~0.1 MB packed, and
each of those passes read or wrote the 3 MB (``docs/filters.md``, "Rows packed by their
producer").  ``PackedRows`` is that packing made by the producer itself (an ``add`` of counts
whose changes it knows), and carried as it is: ``Client.push`` takes it where the table's
push filters start with ``sparse`` (``admin.takes_packed``), routing reorders its rows by their
bits and words (``take``), each server's piece is a run of its rows (``rows[lo:hi]``), and
``sparse`` puts a piece's mask and words on the wire unchanged: the bytes a dense push of the
same values sends, so a server cannot tell the two apart.

Row ``i`` is bits ``[i * dim, (i + 1) * dim)`` of ``mask`` (bit ``b & 7`` of byte ``b >> 3``)
and words ``[starts[i], starts[i + 1])`` of ``words``: the float32 bits of its marked values,
in order.  A word is zero only where all its bits are, so ``-0.0`` is a value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from paramserver.filters.kernels import marks_fit, row_starts, sparse_decode, sparse_encode


@dataclass(frozen=True, eq=False)
class PackedRows:
    """``float32[n, dim]`` held packed: ``mask`` (uint8, ``ceil(n * dim / 8)`` bytes, no bit
    set past ``n * dim``), ``words`` (uint32, the marked values' bits) and ``starts``
    (int64[n + 1], where each row's words begin: ``row_starts``).  ``known``: made by this
    module's kernels (``from_dense``, ``take``, a slice) or a producer's that fills them as they
    do, so ``fits`` holds without a pass over them; arrays built otherwise are checked where
    they are pushed."""

    n: int
    dim: int
    mask: np.ndarray
    words: np.ndarray
    starts: np.ndarray
    known: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.dim

    @property
    def nbytes(self) -> int:
        """The bytes of the dense rows it stands for (what a message's size is checked by)."""
        return self.n * self.dim * 4

    @property
    def packed_nbytes(self) -> int:
        return int(self.mask.nbytes + self.words.nbytes)

    def __len__(self) -> int:
        return self.n

    def fits(self) -> bool:
        """Whether the arrays are what the class says: the mask as long as the rows, marking
        as many words as there are, each row's words where ``starts`` says."""
        if self.known:
            return True
        return (self.mask.dtype == np.uint8 and self.words.dtype == np.uint32 and self.mask.ndim == 1
                and self.words.ndim == 1 and self.starts.shape == (self.n + 1,)
                and bool(marks_fit(self.mask, self.words.shape[0], self.n * self.dim))
                and np.array_equal(self.starts, row_starts(self.mask, self.n, self.dim)))

    def finite(self) -> bool:
        """Whether every value is finite (a NaN or an inf pushed would poison its row)."""
        return bool(np.isfinite(self.words.view(np.float32)).all())

    def dense(self) -> np.ndarray:
        """The rows as ``float32[n, dim]``."""
        bits, status = sparse_decode(self.mask, self.words, self.n * self.dim)
        if status:
            raise ValueError(f"packed rows of shape {self.shape}: the mask does not fit its {self.words.size} words")
        rows: np.ndarray = bits.view(np.float32).reshape(self.n, self.dim)
        return rows

    def take(self, order: np.ndarray) -> PackedRows:
        """Rows ``order[0], order[1], ...`` (each row once or not at all): itself when ``order``
        is ``0, 1, ..., n - 1``."""
        if order.shape[0] == self.n and _identity(order):
            return self
        mask, words, starts = _take(self.mask, self.words, self.starts, self.dim, order)
        return PackedRows(int(order.shape[0]), self.dim, mask, words, starts, self.known)

    def __getitem__(self, rows: slice) -> PackedRows:
        """Rows ``lo:hi`` (a step of 1): their words a view, their mask a view where both ends
        fall on a byte."""
        lo, hi, step = rows.indices(self.n)
        if step != 1:
            raise ValueError(f"packed rows are sliced by a run of rows, got step {step}")
        hi = max(hi, lo)
        first, last = lo * self.dim, hi * self.dim
        if not first & 7 and (not last & 7 or hi == self.n):
            mask = self.mask[first >> 3:(last + 7) >> 3]
        else:
            mask = np.zeros((last - first + 7) >> 3, np.uint8)
            _copy_bits(self.mask, first, mask, 0, last - first)
        starts = self.starts[lo:hi + 1]
        return PackedRows(hi - lo, self.dim, mask, self.words[starts[0]:starts[-1]], starts - starts[0], self.known)

    @classmethod
    def from_dense(cls, rows: np.ndarray) -> PackedRows:
        """``rows`` (float32, 2-d) packed, as ``sparse`` packs them."""
        rows = np.ascontiguousarray(rows, np.float32)
        n, dim = rows.shape
        mask, words = sparse_encode(rows.reshape(-1).view(np.uint32))
        return cls(n, dim, mask, words, row_starts(mask, n, dim), known=True)


@njit(nogil=True, cache=True)
def _identity(order):  # type: ignore[no-untyped-def]
    for i in range(order.shape[0]):
        if order[i] != i:
            return False
    return True


@njit(nogil=True, cache=True)
def _bits_at(src, bit, count):  # type: ignore[no-untyped-def]
    """``count`` (at most 8) bits of ``src`` from bit ``bit``, as the low bits of an int."""
    b, o = bit >> 3, bit & 7
    v = np.int64(src[b]) >> o
    if o + count > 8:
        v |= np.int64(src[b + 1]) << (8 - o)
    return v & ((1 << count) - 1)


@njit(nogil=True, cache=True)
def _copy_bits(src, sbit, dst, dbit, nbits):  # type: ignore[no-untyped-def]
    """Or ``nbits`` bits of ``src`` from bit ``sbit`` into ``dst`` from bit ``dbit``, a byte at
    a time (whole bytes copied where both sides fall on one)."""
    i = 0
    if not (sbit & 7) and not (dbit & 7):
        s, d = np.uint64(sbit >> 3), np.uint64(dbit >> 3)  # unsigned: no check for a negative index a byte
        whole = nbits >> 3
        for j in range(whole):
            dst[d + np.uint64(j)] |= src[s + np.uint64(j)]
        i = whole << 3
    while i < nbits:
        count = min(8, nbits - i)
        v = _bits_at(src, sbit + i, count)
        q = dbit + i
        b, o = q >> 3, q & 7
        dst[b] |= np.uint8((v << o) & 0xFF)
        if o + count > 8:
            dst[b + 1] |= np.uint8(v >> (8 - o))
        i += count


@njit(nogil=True, cache=True)
def _take(mask, words, starts, dim, order):  # type: ignore[no-untyped-def]
    n = order.shape[0]
    out_starts = np.empty(n + 1, np.int64)
    out_starts[0] = 0
    for i in range(n):
        r = order[i]
        out_starts[i + 1] = out_starts[i] + starts[r + 1] - starts[r]
    out_mask = np.zeros((n * dim + 7) >> 3, np.uint8)
    out_words = np.empty(out_starts[n], np.uint32)
    for i in range(n):
        r = order[i]
        _copy_bits(mask, r * dim, out_mask, i * dim, dim)
        out_words[out_starts[i]:out_starts[i + 1]] = words[starts[r]:starts[r + 1]]
    return out_mask, out_words, out_starts
