"""What a worker owes the servers: the part of each key's update it has not sent yet.

Two filters keep such a residual: a lossy value codec (error feedback: what the rounding
took off a push is added to the next push of that key) and the significantly-modified
filter (a key's update waits until it is large enough).  ``Residuals`` is one table's,
an open-addressing hash map of uint64 keys to float32 rows (numba, one pass a push).

``before_routing`` and ``after_routing`` are what a push does with it, once per call:
before the keys are routed (take what is owed, then keep back what ``sigmod`` does not
send) and after (each server's piece rounded as its receiver will decode it, the
difference kept).  A retry resends the rounded piece as it is, and a piece routed again
after a ring change keeps its vnode segments whole, so the codec gives the same values
(``kernels.int8_encode``): what is applied is what was accounted for, exactly once.

A worker that dies loses what it owed (``pending`` says how much, the report counts it).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from paramserver.filters.chain import Chain


@njit(nogil=True, cache=True)
def _slot(table_keys, used, key, mask):  # type: ignore[no-untyped-def]
    h = (key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(17)
    i = np.int64(h & mask)
    while used[i] and table_keys[i] != key:
        i = (i + 1) & np.int64(mask)
    return i


@njit(nogil=True, cache=True)
def _take(table_keys, used, rows, keys, into):  # type: ignore[no-untyped-def]
    """Add the rows owed for ``keys`` into ``into`` and clear them."""
    mask = np.uint64(used.shape[0] - 1)
    for k in range(keys.shape[0]):
        i = _slot(table_keys, used, keys[k], mask)
        if used[i]:
            for j in range(rows.shape[1]):
                into[k, j] += rows[i, j]
                rows[i, j] = 0.0


@njit(nogil=True, cache=True)
def _add(table_keys, used, rows, keys, values):  # type: ignore[no-untyped-def]
    """Add ``values`` to the rows owed for ``keys`` (a new key takes a slot); the slots taken."""
    mask = np.uint64(used.shape[0] - 1)
    taken = 0
    for k in range(keys.shape[0]):
        i = _slot(table_keys, used, keys[k], mask)
        if not used[i]:
            used[i] = True
            table_keys[i] = keys[k]
            taken += 1
        for j in range(rows.shape[1]):
            rows[i, j] += values[k, j]
    return taken


#: bytes a table's residuals may take on a worker (each store; a row is 4·dim bytes, its
#: slot 9 more, at most half the slots used)
RESIDUAL_BYTES = 64 << 20


class Residuals:
    """One table's residual rows on one worker, at most ``max_rows`` keys (``full``:
    whether one more push's keys would pass it)."""

    def __init__(self, dim: int, capacity: int = 1 << 12, max_bytes: int = RESIDUAL_BYTES) -> None:
        self.dim = dim
        self.max_rows = max(1024, max_bytes // (2 * (4 * dim + 9)))
        self.dropped, self.dropped_keys = 0.0, 0  # what ``clear`` let go: sum of |value|, keys
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        self.keys = np.zeros(capacity, np.uint64)
        self.used = np.zeros(capacity, np.bool_)
        self.rows = np.zeros((capacity, self.dim), np.float32)
        self.size = 0

    def take(self, keys: np.ndarray, into: np.ndarray) -> None:
        """Add what is owed for ``keys`` (distinct) to ``into``, and owe it no more."""
        if self.size:
            _take(self.keys, self.used, self.rows, keys, into)

    def full(self, more: int) -> bool:
        return self.size + more > self.max_rows

    def clear(self) -> None:
        """Let everything owed go (counted in ``dropped``): what a store of rounding does
        when it is full, rather than grow with every key a worker ever pushed."""
        keys, mass = self.pending()
        self.dropped += mass
        self.dropped_keys += keys
        self._alloc(min(self.used.shape[0], 1 << 12))

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        if not keys.shape[0]:
            return
        while 2 * (self.size + keys.shape[0]) > self.used.shape[0]:
            self._grow()
        self.size += int(_add(self.keys, self.used, self.rows, keys, np.ascontiguousarray(values, np.float32)))

    def _grow(self) -> None:
        keys, rows = self.drain(keep_zeros=False)
        self._alloc(self.used.shape[0] * 2)
        if keys.size:
            self.size = int(_add(self.keys, self.used, self.rows, keys, rows))

    def drain(self, keep_zeros: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Every key owed something and its row; afterwards nothing is owed."""
        live = self.used & (keep_zeros | (self.rows != 0).any(axis=1))
        keys, rows = self.keys[live].copy(), self.rows[live].copy()
        self.used[:] = False
        self.rows[:] = 0.0
        self.size = 0
        return keys, rows

    def pending(self) -> tuple[int, float]:
        """Keys owed something, and the sum of |what is owed|."""
        if not self.size:
            return 0, 0.0
        owed = self.rows[self.used]
        return int((owed != 0).any(axis=1).sum()), float(np.abs(owed).sum())


class Owed:
    """What one table owes on one worker: the updates ``sigmod`` holds back (``held``:
    flushed every N clocks) and the codecs' rounding (``rounding``: added to the next push
    of each key, and flushed when the worker's part ends)."""

    def __init__(self, dim: int, max_bytes: int = RESIDUAL_BYTES) -> None:
        self.held, self.rounding = Residuals(dim, max_bytes=max_bytes), Residuals(dim, max_bytes=max_bytes)

    def take(self, keys: np.ndarray, into: np.ndarray) -> None:
        self.held.take(keys, into)
        self.rounding.take(keys, into)

    def drain(self, held_only: bool) -> tuple[np.ndarray, np.ndarray]:
        keys, rows = self.held.drain()
        if held_only:
            return keys, rows
        more, extra = self.rounding.drain()
        return np.concatenate([keys, more]), np.concatenate([rows, extra])

    def pending(self) -> tuple[int, float]:
        a, b = self.held.pending(), self.rounding.pending()
        return a[0] + b[0], a[1] + b[1]

    def must_flush(self) -> bool:
        """Sigmod holds back as many keys as a store may keep: push them now."""
        return self.held.full(0)


def before_routing(chain: Chain, owed: Owed, keys: np.ndarray, grads: np.ndarray,
                   counts: dict[str, int], select_keys: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """A push's distinct ``keys`` and ``grads`` with what is owed added, less what the
    significantly-modified filter keeps back (``counts``: keys in and out; not
    ``select_keys``: a flush, everything goes)."""
    grads = np.array(grads, np.float32, copy=True)
    owed.take(keys, grads)
    select = chain.select
    if select is None or not select_keys:
        return keys, grads
    big = np.abs(grads).max(axis=1) > getattr(select, "threshold", 0.0) if grads.size else np.zeros(0, bool)
    counts["sigmod_in"] = counts.get("sigmod_in", 0) + int(keys.shape[0])
    counts["sigmod_out"] = counts.get("sigmod_out", 0) + int(big.sum())
    if big.all():
        return keys, grads
    owed.held.add(keys[~big], grads[~big])
    return keys[big], grads[big]


def after_routing(chain: Chain, owed: Owed, keys: np.ndarray, values: np.ndarray,
                  counts: np.ndarray) -> np.ndarray:
    """One piece's values as its receiver will decode them; the rounding is owed."""
    if not chain.lossy:
        return values
    sent = chain.roundtrip(np.ascontiguousarray(values, np.float32), counts)
    if owed.rounding.full(keys.shape[0]):  # bounded: the oldest rounding goes (under half a step a key)
        owed.rounding.clear()
    owed.rounding.add(keys, values - sent)
    return sent
