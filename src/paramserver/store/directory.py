"""The directory of a table's vnodes by address (``loops/views.py``), and the arrays it
points into, held so that no address outlives its memory.

``VnodeSet`` enters a vnode wherever its arrays change (made, grown, loaded, rebuilt);
a vnode whose arrays were replaced and not entered again is read where it was (its old
arrays are held until then), never from freed memory.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from paramserver.store.loops import views

_NONE = np.zeros((0, 0), np.float32)  # the life rows of a table without a lifecycle


class Vnode(Protocol):
    """What the directory reads of a hash or dense vnode."""

    keys: np.ndarray
    rows: np.ndarray
    _meta: np.ndarray

    def _limit(self) -> int: ...


class Directory:
    """``d``: ``int64[vnodes, views.FIELDS]``, row ``t`` the vnode the loops know as ``t``;
    ``hash_args`` (``d`` and the first vnode's keys, rows, ``meta``) and ``dense_args``
    (``d``, rows, ``meta``) open a hash or dense loop's arguments; ``life0`` types the life rows."""

    def __init__(self, vnodes: list[Vnode]) -> None:
        self.d = np.zeros((len(vnodes), views.FIELDS), np.int64)
        # set by vnode 0's entry (a table with no vnodes is never walked)
        self.hash_args: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] = (self.d, _NONE, _NONE, _NONE)
        self.dense_args: tuple[np.ndarray, np.ndarray, np.ndarray] = (self.d, _NONE, _NONE)
        self.life0 = _NONE
        self._held: list[tuple[np.ndarray, ...]] = [()] * len(vnodes)
        for t, vt in enumerate(vnodes):
            self.enter(t, vt)

    def enter(self, t: int, vt: Vnode) -> None:
        """Write vnode ``t``'s arrays (hold them; let go of the ones it had)."""
        keys, rows, meta = vt.keys, vt.rows, vt._meta
        life = getattr(vt, "life", None)
        assert meta.flags.c_contiguous and (keys.shape[0] == 0 or keys.strides[0] == rows.strides[0]), \
            "a vnode's keys and rows share its slots"
        self.d[t] = (keys.ctypes.data, rows.ctypes.data, meta.ctypes.data,
                     life.ctypes.data if life is not None else 0, keys.shape[0], rows.shape[0], rows.strides[0],
                     vt._limit(), getattr(vt, "start", 0))
        self._held[t] = (keys, rows, meta, life if life is not None else _NONE)
        if t == 0:
            self.hash_args = (self.d, keys, rows, meta)
            self.dense_args = (self.d, rows, meta)
            self.life0 = self._held[0][3]

    def held(self) -> list[tuple[np.ndarray, ...]]:
        """The arrays the directory points into now (kept alive by whoever holds the list)."""
        return list(self._held)
