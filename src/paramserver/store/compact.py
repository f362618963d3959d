"""Compact rows, as the classes see them: the row dtype of each ``TableSpec.storage``, and
whole rows in and out as float32 (``items``, ``load``: checkpoints, exports and migrations
do not know the storage).  The 16-bit formats, their rounding and the helpers the loops
call are numba code in ``store/loops/compact.py``, which says how they work.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paramserver.store.loops.compact import decode_into, encode_into

#: the row array's dtype for each ``TableSpec.storage``
ROW_DTYPES: dict[str, np.dtype[Any]] = {"float32": np.dtype(np.float32), "fp16": np.dtype(np.int16),
                                        "bf16": np.dtype(np.uint16)}


def decode_rows(rows: np.ndarray, dim: int, width: int) -> np.ndarray:
    """``rows[:, :width]`` (compact or float32) as float32."""
    if rows.dtype == np.float32:
        return rows[:, :width]
    out = np.empty((rows.shape[0], width), np.float32)
    decode_into(rows, dim, out)
    return out


def encode_rows(rows: np.ndarray, dim: int, keys: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """float32 ``rows`` (of ``keys``) in the storage ``dtype``; a row ``decode_rows`` gave
    encodes to the bits it was decoded from."""
    src = np.ascontiguousarray(rows, np.float32)
    if dtype == np.float32:
        return src
    out = np.empty(src.shape, dtype)
    encode_into(src, dim, np.ascontiguousarray(keys, np.uint64), out)
    return out
