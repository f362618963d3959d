"""The invariants of a table read and pushed through the workers' row caches
(``client/row_cache.py``), in the ``row-cache`` scenario: every gradient a worker hands to
``push`` is ``-1`` to one key of an ``sgd`` table at ``lr = 1``, so a key's value counts the
gradients applied to it, and a sum counts what it sums.

* The bound: a read never misses more than ``s`` of the pushes its row's server had
  applied to the key.  Every push acknowledged before the read went out was applied by
  then on the key's server (on every copy), so a row read within ``s`` of that server's
  versions holds all of them but at most ``s``: its value is at least their total less
  the ``s`` largest (``floor``; a push that sums ``n`` gradients counts ``n``).
* A cache that trains its rows (``apply=local``) pushes their changes (``merge``), which count
  the same gradients with the other sign; its reads hold its own gradients besides.
* Exactly once: what reaches the servers is counted push by push, as the cache sends it
  (``watch``), by ``Invariants`` (a stored value holds every acknowledged push once, and
  at most those in doubt besides), and at the end, once every live worker has pushed
  what its cache held, the gradients each worker handed to ``push`` are exactly those it
  sent, less what a worker that died still held (``final``).
"""

from __future__ import annotations

import heapq
from concurrent.futures import Future
from typing import Any

import numpy as np

from paramserver.testing.invariants import Invariants
from paramserver.testing.worker import SimWorker


class CacheLedger:
    """What the workers handed to ``push`` for ``table``, what their caches sent, and
    what was acknowledged, key by key."""

    def __init__(self, check: Invariants, table: str, s: int, keys: int, limit_s: float) -> None:
        self.check, self.table, self.s, self.keys, self.limit_s = check, table, s, keys, limit_s
        self.handed: dict[str, np.ndarray] = {}  # worker -> gradients handed to push, per key
        self.sent: dict[str, np.ndarray] = {}  # worker -> gradients its cache sent, per key
        self.applied: list[list[int]] = [[] for _ in range(keys)]  # per key: each acknowledged push's count
        self.reads = 0  # cached reads checked against the bound

    def _of(self, table: dict[str, np.ndarray], worker: str) -> np.ndarray:
        return table.setdefault(worker, np.zeros(self.keys, np.int64))

    def hand(self, worker: str, keys: np.ndarray) -> None:
        """``worker`` hands one gradient a key of ``keys`` to ``push``."""
        np.add.at(self._of(self.handed, worker), keys, 1)

    def unsent(self, worker: str, keys: np.ndarray) -> np.ndarray:
        """The gradients of ``keys`` ``worker`` handed to ``push`` and its cache has not sent
        (a column, as reads are)."""
        unsent: np.ndarray = self._of(self.handed, worker)[keys] - self._of(self.sent, worker)[keys]
        return unsent[:, None]

    def watch(self, worker: str, table: str, keys: np.ndarray, grads: np.ndarray, future: Future[Any],
              op: str = "update") -> None:
        """A push the cache of ``worker`` sent (``SimCachePort.watch``)."""
        if table != self.table:
            return
        ks = keys.astype(np.int64)
        counts = _counts(op, grads)
        np.add.at(self._of(self.sent, worker), ks, counts)
        call = self.check.call(f"{worker} cache push to {table!r}", self.limit_s, worker)
        self.check.pushed(call, table, ks, counts)

        def landed(f: Future[Any]) -> None:
            exc = f.exception()
            if exc is None and call in self.check.pushing:
                for key, n in zip(ks.tolist(), counts.tolist()):
                    self.applied[key].append(n)
            self.check.push_done(call, worker, table, None if exc is None else repr(exc))
            self.check.returned(call)

        future.add_done_callback(landed)

    def floor(self, keys: np.ndarray) -> np.ndarray:
        """The least a read of ``keys`` sent now may see: the pushes acknowledged so far,
        less the ``s`` largest of them."""
        return np.array([sum(self.applied[k]) - sum(heapq.nlargest(self.s, self.applied[k]))
                         for k in keys.tolist()], np.int64)

    def read(self, worker: str, keys: np.ndarray, values: np.ndarray, floor: np.ndarray) -> None:
        """A read through ``worker``'s cache returned ``values``; ``floor``: when it went out."""
        self.reads += 1
        short = values[:, 0] < floor
        if short.any() and not self.check.lost(self.table, keys[short]):
            i = int(np.flatnonzero(short)[0])
            k = int(keys[i])
            self.check.fail("cache-past-bound", f"{worker} read {values[i, 0]:g} for key {k} of {self.table!r} "
                            f"through its row cache (s={self.s}), but {len(self.applied[k])} pushes summing "
                            f"{sum(self.applied[k])} were acknowledged before: it missed more than {self.s}")

    def final(self, workers: list[SimWorker]) -> None:
        """Every gradient handed to ``push`` was sent once, or died held in a dead worker's cache."""
        for w in workers:
            handed, sent = self._of(self.handed, w.name), self._of(self.sent, w.name)
            held = np.zeros(self.keys, np.int64)
            cache = w.row_caches.get(self.table)
            if cache is not None:
                for op, keys, sums, _ in cache.take():  # a dead worker's sums died with it; a live one flushed
                    np.add.at(held, keys.astype(np.int64), _counts(op, sums))
            if w.live and held.any():
                self.check.fail("cache-unflushed", f"{w.name} still holds {int(held.sum())} gradients of "
                                f"{self.table!r} after it flushed its row cache")
            wrong = np.flatnonzero(handed != sent + held)
            if wrong.size:
                k = int(wrong[0])
                self.check.fail("cache-sums", f"{w.name} handed {handed[k]} gradients of key {k} of "
                                f"{self.table!r} to push; its cache sent {sent[k]} and "
                                f"{'held' if w.live else 'died holding'} {held[k]}")


def _counts(op: str, rows: np.ndarray) -> np.ndarray:
    """The gradients a pushed row counts: a sum of ``-1``s (``update``), or the change a cache
    that trains its rows made to a row (``merge``: ``+1`` a gradient, at ``lr = 1``)."""
    counts: np.ndarray = np.rint(rows[:, 0] if op == "merge" else -rows[:, 0]).astype(np.int64)
    return counts
