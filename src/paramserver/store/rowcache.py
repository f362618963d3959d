"""``RowStore``: the arrays of one worker's row cache for one table, worked by the compiled
loops of ``loops/cache.py`` (what it does with them, and when, is ``client/row_cache.py``'s).

A slot costs its key (8 bytes) and its record: 24 bytes of versions and counts, then the
row and the sum, 4 bytes a column each, rounded up to 8 (32 bytes for a dim-1 row, 152 for
dim 16); the sketch adds a byte a slot, the queue of sums 24.
"""

from __future__ import annotations

import numpy as np

from paramserver.errors import ConfigError
from paramserver.store.loops import cache as loops
from paramserver.store.memory import available_memory

#: sums taken from the queue by one push at most (the rest go with the next)
QUEUE_TAKE = 1 << 16


class RowStore:
    """``rows`` slots (rounded up to a power of two, at least one set) of ``dim`` columns,
    with sums ``width`` wide (a push's row: the value's gradient, and the shows and clicks
    of a table that counts them).  ``rule``: (the value's columns, the rule's kind, its
    hyper-parameters) of a cache that trains its rows (``write_local``): its rows are the
    server's whole rows (``dim`` = ``width`` = value and state) and its sums their changes."""

    def __init__(self, rows: int, dim: int, width: int, rule: tuple[int, int, np.ndarray] | None = None) -> None:
        self.rule = rule if rule is not None else (dim, -1, np.zeros(1))
        cap, words = _layout(rows, dim, width)
        _fits(rows, cap, _slot_bytes(words))
        self.dim, self.width, self.capacity = dim, width, cap
        self.keys = np.full(cap, loops.EMPTY, np.uint64)
        self.freq = np.zeros(cap, np.uint8)  # a slot's uses lately (TinyLFU's side of the residents)
        self.rec = np.zeros((cap, words), np.uint64)
        self.recf = self.rec.view(np.float32)
        self.sketch = np.zeros(max(64, cap), np.uint8)  # 4-bit counters, two a byte
        self.pend = np.zeros((cap, 3), np.int64)  # the queue of sums: slot, born, key
        self.meta = np.zeros(3, np.int64)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.freq.nbytes + self.rec.nbytes + self.sketch.nbytes + self.pend.nbytes

    def held(self) -> int:
        """Slots holding a sum not pushed yet."""
        live = self.keys != loops.EMPTY
        return int(np.count_nonzero(self.rec[live, loops.PACKED] & np.uint64(0xFFFFFFFF)))

    def read(self, keys: np.ndarray, out: np.ndarray, est: np.ndarray,
             s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
        """The rows of ``keys`` held within ``s`` versions, copied into ``out``: each key's
        slot (-1: a miss), a hit's stamp and server column, the hits, and a mask of the
        hits' servers (``loops.read``)."""
        n = keys.shape[0]
        slot_of, stamp_of, col_of = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        hits, servers = loops.read(keys, out, slot_of, stamp_of, col_of, self.keys, self.freq, self.rec, self.recf,
                                   est, s)
        return slot_of, stamp_of, col_of, int(hits), int(servers)

    def refresh(self, keys: np.ndarray, out: np.ndarray) -> int:
        """The value columns of the rows of ``keys`` held now, copied into ``out`` (``loops.refresh``)."""
        return int(loops.refresh(keys, out, self.keys, self.recf))

    def fill(self, keys: np.ndarray, rows: np.ndarray, version: int, server: int) -> tuple[np.ndarray, np.ndarray]:
        """Keep the rows server column ``server`` answered at ``version``; the sums of the
        slots given up (``loops.fill``)."""
        owed_keys = np.empty(keys.shape[0], np.uint64)
        owed_sums = np.empty((keys.shape[0], self.width), np.float32)
        n = loops.fill(keys, rows, version, server, self.keys, self.freq, self.rec, self.recf, self.sketch, self.meta,
                       owed_keys, owed_sums, *self.rule)
        return owed_keys[:n], owed_sums[:n]

    def refill(self, keys: np.ndarray, rows: np.ndarray, version: int, server: int) -> int:
        """The rows of the ``keys`` held (from server column ``server``, stamped at most
        ``version``) as a merge left them at ``version``, their change since kept (``loops.refill``)."""
        return int(loops.refill(keys, rows, version, server, self.keys, self.rec, self.recf, *self.rule))

    def write(self, keys: np.ndarray, grads: np.ndarray, slots: np.ndarray, est: np.ndarray,
              s: int) -> tuple[np.ndarray, np.ndarray]:
        """What a push of ``keys`` sends once through the cache (``loops.write``)."""
        room = keys.shape[0] + min(QUEUE_TAKE, self.capacity)
        out_keys = np.empty(room, np.uint64)
        out_grads = np.empty((room, self.width), np.float32)
        n = loops.write(keys, grads, slots, self.keys, self.rec, self.recf, self.pend, self.meta, est, s, self.dim,
                        out_keys, out_grads)
        return out_keys[:n], out_grads[:n]

    def write_local(self, keys: np.ndarray, grads: np.ndarray, slots: np.ndarray, est: np.ndarray,
                    s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What a push of ``keys`` sends through a cache that trains its rows: the rows'
        changes due (keys, whole rows), then the gradients of the keys not held
        (``loops.write_local``)."""
        room = keys.shape[0] + min(QUEUE_TAKE, self.capacity)
        out_keys, out_rows = np.empty(room, np.uint64), np.empty((room, self.width), np.float32)
        pass_keys, pass_grads = np.empty(keys.shape[0], np.uint64), np.empty(grads.shape, np.float32)
        vdim, okind, ohp = self.rule
        n, m = loops.write_local(keys, grads, slots, self.keys, self.rec, self.recf, self.pend, self.meta, est, s,
                                 vdim, okind, ohp, out_keys, out_rows, pass_keys, pass_grads)
        return out_keys[:n], out_rows[:n], pass_keys[:m], pass_grads[:m]

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        """Every sum held, taken out (the queue emptied)."""
        n_held = self.held()
        out_keys = np.empty(n_held, np.uint64)
        out_grads = np.empty((n_held, self.width), np.float32)
        n = loops.drain(self.keys, self.rec, self.recf, self.dim, out_keys, out_grads)
        self.meta[loops.META_HEAD] = self.meta[loops.META_TAIL]
        return out_keys[:n], out_grads[:n]

    def clear(self) -> None:
        """Forget every row (their sums taken out first: ``drain``)."""
        self.keys[:] = loops.EMPTY
        self.freq[:] = 0
        self.rec[:] = 0


def _layout(rows: int, dim: int, width: int) -> tuple[int, int]:
    """A cache of ``rows`` (rounded up to whole sets) of ``dim`` columns with sums ``width``
    wide: its slots, and the 8-byte words of a slot's record."""
    sets = 1 << max(0, (max(1, rows) - 1).bit_length() - 2)  # WAYS = 4 slots a set
    return sets * loops.WAYS, loops.HEAD_WORDS + -(-(dim + width) // 2)


def _slot_bytes(words: int) -> int:
    """A slot's bytes: its key, its record, its share of the sketch and of the queue."""
    return 8 + 1 + 8 * words + 1 + 24


def check_fits(rows: int, dim: int, width: int, copies: int) -> None:
    """``copies`` caches of ``rows`` (``RowStore``'s ``dim`` and ``width``) on this machine,
    as a local cluster's workers hold them, refused as ``RowStore`` refuses one: each
    worker's own check sees the memory left before the others fill theirs."""
    cap, words = _layout(rows, dim, width)
    _fits(rows, cap, _slot_bytes(words), copies)


def _fits(rows: int, cap: int, slot_bytes: int, copies: int = 1) -> None:
    """``copies`` caches of ``rows`` (``cap`` slots of ``slot_bytes`` with the sketch and
    queue) are refused, naming the fix, where this machine cannot give them half of the
    memory it has left."""
    free, nbytes = available_memory(), copies * cap * slot_bytes
    if free and nbytes > free // 2:
        fits = 1 << max(2, (free // 2 // (copies * slot_bytes)).bit_length() - 1)  # slots come in powers of two
        each = (f"on each of the {copies} workers on this machine needs {_size(nbytes)} in all" if copies > 1 else
                f"needs {_size(nbytes)}")
        raise ConfigError(f"a row cache of rows={rows:,} {each} and this machine has {_size(free)} available; give "
                          f"fewer rows (each worker holds one cache a table: rows={fits:,} takes "
                          f"{_size(copies * fits * slot_bytes)}{' in all' if copies > 1 else ''})")


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 1 << 30 else f"{nbytes / 2**20:.0f} MiB"
