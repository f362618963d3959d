"""Compact rows: a table's rows stored in 16 bits a column instead of float32
(``TableSpec(storage="fp16" | "bf16")``), to cut the memory a key takes.

A compact row is ``[value (dim) | optimiser state]`` as 16-bit patterns:

* the value columns in the table's format, rounded to nearest even: IEEE half
  (``"fp16"``, 11 significant bits, finite up to 65504, overflow to inf) or bfloat16
  (``"bf16"``, 8 significant bits, float32's range);
* the state columns (accumulators, FTRL's z and n) always in bfloat16, float32's range
  so that an AdaGrad or FTRL accumulator cannot overflow, with *stochastic rounding*:
  a value between two bfloat16 neighbours goes up with probability proportional to its
  distance from the lower one, so many increments too small for one unit in the last
  place (a big accumulator's ``+= g²``) are kept in expectation.  The random bits are
  not random: they are a hash of the key, the column and the float32 bits of the whole
  updated row, so two replicas applying the same updates store the same bits, and a
  row whose update changed nothing stores the same bits again.

Numba has no float16 on the CPU, so the arrays hold bit patterns, and the dtype says
the value format: ``int16`` for fp16, ``uint16`` for bf16 (``store/compact.py``'s
``ROW_DTYPES``).  The table loops (``hash.apply``, ``dense.dense_apply_rows``, the lookups) call the helpers
below, which dispatch on the rows' dtype when the kernel is compiled (numba
``overload``): on a float32 table they are the identity and fold away, so one source,
compiled and cached once per dtype, serves every table.  An update decodes its row into
a float32 scratch row, runs the rule (``push_ops.push_row``, or a user rule's) on it and
encodes it back; a lookup decodes the value columns.  ``items``/``load`` see float32
rows (``store/compact.py``: ``decode_rows``/``encode_rows``): checkpoints, exports and migrations do not know
the storage, and a decoded value encodes to the same bits (a save/restore is exact).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, types
from numba.extending import overload

from paramserver._runtime import intrinsics
from paramserver.routing.hashing import hash64

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


_f32_bits: Any = intrinsics.f32_bits  # (mypy reads an intrinsic's signature wrongly)
_bits_f32: Any = intrinsics.bits_f32


# ---- scalar conversions (bit patterns as int64, 0..65535) --------------------------------


@njit(inline="always", nogil=True, cache=True)
def f32_to_f16(x):
    """IEEE half bits of ``x`` rounded to nearest even (numpy's ``float16(x)``)."""
    u = np.int64(_f32_bits(np.float32(x)))
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a >= 0x47800000:  # >= 65536, inf or nan
        return sign | (0x7E00 if a > 0x7F800000 else 0x7C00)
    if a < 0x38800000:  # below half's smallest normal: add 0.5 so float32's rounding does ours
        f = _bits_f32(np.uint32(a)) + np.float32(0.5)
        return sign | (np.int64(_f32_bits(f)) - 0x3F000000)
    a += -0x37FFF001 + ((a >> 13) & 1)  # rebias the exponent (127 → 15), round half to even
    return sign | (a >> 13)  # a carry into the exponent rounds 65520 up to inf


@njit(inline="always", nogil=True, cache=True)
def f16_to_f32(h):
    h = np.int64(h) & 0xFFFF
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:  # zero or subnormal: m * 2**-24
        v = np.float32(m) * np.float32(5.960464477539063e-08)
        return -v if sign else v
    if e == 31:
        return _bits_f32(np.uint32(sign | 0x7F800000 | (m << 13)))
    return _bits_f32(np.uint32(sign | ((e + 112) << 23) | (m << 13)))


@njit(inline="always", nogil=True, cache=True)
def f32_to_bf16(x):
    """bfloat16 bits of ``x`` rounded to nearest even."""
    u = np.int64(_f32_bits(np.float32(x)))
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 0x40  # a quiet nan
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


@njit(inline="always", nogil=True, cache=True)
def f32_to_bf16_sr(x, r):
    """bfloat16 bits of ``x`` rounded stochastically by the random bits ``r``: up (in
    magnitude) with probability (dropped bits) / 2**16; exact values stay exact."""
    u = np.int64(_f32_bits(np.float32(x)))
    if (u & 0x7FFFFFFF) >= 0x7F800000:
        return (u >> 16) | (0x40 if (u & 0x7FFFFFFF) > 0x7F800000 else 0)
    return (u + (np.int64(r) & 0xFFFF)) >> 16


@njit(inline="always", nogil=True, cache=True)
def bf16_to_f32(h):
    return _bits_f32(np.uint32((np.int64(h) & 0xFFFF) << 16))


# ---- what the kernels call: identity on float32 rows -----------------------------------


def value_at(rows: Any, s: Any, j: Any) -> Any:
    """Value column ``j`` of row ``s`` as a float."""


def new_scratch(rows: Any) -> Any:
    """A float32 row to update compact rows in (an empty view for float32 rows)."""


def work_rows(rows: Any, scratch: Any) -> Any:
    """The array an update runs on: ``rows`` itself, or the scratch row."""


def work_slot(rows: Any, s: Any) -> Any:
    """The row of ``work_rows`` that stands for row ``s``: ``s``, or the scratch row's 0."""


def load_row(rows: Any, s: Any, scratch: Any, width: Any, dim: Any) -> Any:
    """Row ``s`` decoded into ``scratch[0]``; returns the row of ``work_rows`` to update."""


def store_row(rows: Any, s: Any, scratch: Any, width: Any, dim: Any, key: Any) -> Any:
    """``scratch[0]`` encoded back into row ``s`` (nothing for float32 rows)."""


def _kind(rows: Any) -> int:
    """0 for float32 rows, 16 for fp16 (int16 bit patterns), 32 for bf16 (uint16)."""
    if not isinstance(rows, types.Array):
        return -1
    return {types.float32: 0, types.int16: 16, types.uint16: 32}.get(rows.dtype, -1)


@overload(value_at)
def _value_at(rows, s, j):
    kind = _kind(rows)
    if kind == 0:
        return lambda rows, s, j: rows[s, j]
    if kind == 16:
        return lambda rows, s, j: f16_to_f32(rows[s, j])
    if kind == 32:
        return lambda rows, s, j: bf16_to_f32(rows[s, j])
    return None


@overload(new_scratch)
def _new_scratch(rows):
    if _kind(rows) == 0:
        return lambda rows: rows[:0]
    if _kind(rows) > 0:
        return lambda rows: np.empty((1, rows.shape[1]), np.float32)
    return None


@overload(work_rows)
def _work_rows(rows, scratch):
    if _kind(rows) == 0:
        return lambda rows, scratch: rows
    if _kind(rows) > 0:
        return lambda rows, scratch: scratch
    return None


@overload(work_slot)
def _work_slot(rows, s):
    if _kind(rows) == 0:
        return lambda rows, s: s
    if _kind(rows) > 0:
        return lambda rows, s: 0
    return None


@overload(load_row)
def _load_row(rows, s, scratch, width, dim):
    kind = _kind(rows)
    if kind == 0:
        return lambda rows, s, scratch, width, dim: s
    if kind > 0:
        def load(rows, s, scratch, width, dim):
            for j in range(dim):
                scratch[0, j] = f16_to_f32(rows[s, j]) if kind == 16 else bf16_to_f32(rows[s, j])
            for j in range(dim, width):
                scratch[0, j] = bf16_to_f32(rows[s, j])
            return 0

        return load
    return None


@njit(inline="always", nogil=True, cache=True)
def _row_seed(scratch, width, key):
    """A hash of the key and the float32 bits of the updated row."""
    h = np.uint64(key)
    for j in range(width):
        h = (h ^ np.uint64(_f32_bits(scratch[0, j]))) * _GOLDEN
        h ^= h >> np.uint64(29)
    return h


@overload(store_row)
def _store_row(rows, s, scratch, width, dim, key):
    kind = _kind(rows)
    if kind == 0:
        return lambda rows, s, scratch, width, dim, key: None
    if kind > 0:
        dt = np.int16 if kind == 16 else np.uint16

        def store(rows, s, scratch, width, dim, key):
            for j in range(dim):
                x = scratch[0, j]
                rows[s, j] = dt(f32_to_f16(x) if kind == 16 else f32_to_bf16(x))
            if dim < width:
                h = _row_seed(scratch, width, key)
                r = np.uint64(0)
                for j in range(dim, width):  # one hash gives four columns 16 random bits each
                    q = (j - dim) & 3
                    if q == 0:
                        r = hash64(h + np.uint64(j) * _GOLDEN)
                    rows[s, j] = dt(f32_to_bf16_sr(scratch[0, j], r >> np.uint64(16 * q)))

        return store
    return None


# ---- whole rows, float32 in and out: ``store/compact.py``'s decode_rows and encode_rows ----


@njit(nogil=True, cache=True)
def decode_into(rows, dim, out):
    for i in range(rows.shape[0]):
        load_row(rows, i, out[i:i + 1], out.shape[1], dim)


@njit(nogil=True, cache=True)
def encode_into(src, dim, keys, out):
    for i in range(src.shape[0]):
        store_row(out, i, src[i:i + 1], src.shape[1], dim, keys[i])
