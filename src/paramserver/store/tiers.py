"""A table's two tiers on one server (``TableSpec.memory``): its hot rows in memory, within
a budget, and the rest, cold, in arrays on the server's local disk (``disk.py``).

The tiers hold disjoint keys, each with its whole row (value and optimiser state, as
stored) and its life row.  The cold tier of a vnode is a hash vnode like a hot one
(``table.VnodeTable``), its arrays mapped from files, so the same loops read and write
both (``loops/tiers.py``: one compiled call a request, over all its vnodes), and a cold
row is found by one probe of a page the kernel may have cached.

* **Before a request** reads or writes its keys (``before``), one pass over them marks
  which are hot and stamps those with the request count (the life column ``seen``).  The
  others that the cold tier holds are moved back (promoted), whole.  A request therefore
  works on the rows it would have found without a budget, and a model trained with one
  is the model trained without, bit for bit.
* **After a request** (``settle``): the hot vnodes grow as any table's until their
  arrays reach the budget; they are then rebuilt at an equal share of it, and keep that
  size.  Whenever their keys pass ``HIGH`` of what the arrays hold, the least recently
  seen keys of all the vnodes (chosen by a histogram of ``seen``, not a sort) move to the
  cold tier, down to ``LOW``; their slots are freed in place and reused.  The cold arrays
  are grown to take them before any row moves (only growing a file can fail): a disk that
  cannot take them (``DiskFullError``, logged and counted) leaves every row where it was,
  and the budget over until the disk has room.

Keys new to the table have ``seen`` 0 until a request sees them again; a settle stamps
them as seen at that moment.
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from paramserver._runtime.intrinsics import frozen
from paramserver._runtime.malloc import trim_heap
from paramserver.routing.hashing import hash64_array
from paramserver.store.directory import Directory
from paramserver.store.disk import RELEASE_BYTES, DiskArena, DiskFullError
from paramserver.store.fingerprints import Generations
from paramserver.store.loops import tiers as tier_loops
from paramserver.store.memory import heap_released
from paramserver.store.readahead import PAGE_SHIFT, Policy, readahead
from paramserver.store.table import MIN_CAPACITY, VnodeTable

logger = logging.getLogger(__name__)

HIGH, LOW = 0.95, 0.85  # a settle starts past HIGH of the keys the hot arrays hold, and goes down to LOW
RETRY_REQUESTS = 1000  # after a full disk, requests before a settle tries again
BINS = 1024  # a vnode's histogram of ``seen``, from which a settle picks its threshold


@dataclass
class TierStats:
    """What the tiers did (``STATS``' and ``/metrics``' ``tiers``)."""

    requested: int = 0  # keys requests asked for
    promoted: int = 0  # of them, found cold and moved back to memory
    demoted: int = 0  # keys moved to the cold tier
    settles: int = 0
    cold_reads: int = 0  # requests some of whose keys were read back from disk ...
    cold_seconds: float = 0.0  # ... and the time that took
    settle_seconds: float = 0.0  # time spent holding the budget
    disk_full: int = 0  # settles a full disk stopped
    peak_hot_bytes: int = 0  # the most the hot vnodes took, as settles found them
    prefetched: int = 0  # keys named ahead (``prefetch``) that were not in memory ...
    prefetch_pages: int = 0  # ... and the pages of the cold arrays read ahead for them


class TierRows(Protocol):
    """What the tiers work on: a table's hot vnodes on this server (a ``VnodeSet``)."""

    @property
    def hash_vnodes(self) -> Mapping[int, VnodeTable]: ...

    @property
    def directory(self) -> Directory: ...

    @property
    def slot(self) -> np.ndarray: ...

    def enter(self, vnode: int) -> None:
        """Re-read ``vnode``'s arrays (they grew or were rebuilt)."""
        ...


class Vnodes:
    """Hash vnodes by vnode, and the directory the many-vnode loops walk them by."""

    def __init__(self, n_vnodes: int) -> None:
        self.tables: dict[int, VnodeTable] = {}
        self.slot = np.full(n_vnodes, -1, np.int64)
        self.directory = Directory([])
        self.vnode_of = np.zeros(0, np.int64)

    def add(self, tables: dict[int, VnodeTable]) -> None:
        self.tables.update(tables)
        self._rebuild()

    def drop(self, vnode: int) -> VnodeTable | None:
        vt = self.tables.pop(vnode, None)
        if vt is not None:
            self._rebuild()
        return vt

    def _rebuild(self) -> None:
        self.slot[:] = -1
        for t, v in enumerate(self.tables):
            self.slot[v] = t
        self.vnode_of = np.array(list(self.tables), np.int64)
        self.directory = Directory(list(self.tables.values()))

    def enter(self, vnode: int) -> None:
        self.directory.enter(int(self.slot[vnode]), self.tables[vnode])

    @property
    def hash_vnodes(self) -> Mapping[int, VnodeTable]:
        return self.tables


class Tiers:
    """The cold tier of one table on one server, and the budget that fills it.

    Args:
        rows: the table's hot vnodes here.
        budget: bytes the hot vnodes' arrays (slots and life rows) may take.
        column: the life column that holds ``seen``.
        n_vnodes: vnodes on the ring.
        new_cold: makes the (empty) cold vnode of a vnode with room for some keys, its
            arrays from ``arena``.
        arena: where the cold arrays are.
        generations: the hot vnodes' ``seen`` stamps are generations
            (``fingerprints.py``'s vnodes), not the request count.
    """

    def __init__(self, rows: TierRows, budget: int, column: int, n_vnodes: int,
                 new_cold: Callable[[int, int], VnodeTable], arena: DiskArena,
                 generations: Generations | None = None) -> None:
        self.rows, self.budget, self.column = rows, budget, column
        self.generations = generations  # ``seen`` as a byte's generation (fingerprinted hot vnodes), or the clock
        self._new_cold = new_cold
        self.arena = arena
        self.cold = Vnodes(n_vnodes)
        self.cold_keys = 0
        self.clock = 0.0
        self.dirty = False  # a vnode grew or rows came back since the last settle
        self.stats = TierStats()
        self._lock = threading.Lock()  # a request's vnodes may be worked by several threads (counters)
        self._traffic = 0  # bytes of cold pages the moves may have mapped since the last release
        self._retry_at = 0.0  # after a full disk: the clock a settle tries again at
        self.sized = False  # the hot vnodes' arrays are at their share of the budget
        self.reading = Policy()  # whether keys named ahead have their cold pages read (``prefetch``)

    # ---- a request's keys ---------------------------------------------------------------
    def before(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> None:
        """Stamp the request's hot keys as seen; bring back those the cold tier holds."""
        self.clock += 1.0
        if self.generations is not None and self.generations.request(self.clock):
            self.generations.down([vt.life for vt in self.rows.hash_vnodes.values() if vt.life is not None])
        hot, missing = self._stamp(vnodes, counts, keys)
        promoted = self._promote(vnodes, counts, keys, hot) if missing and self.cold_keys else 0
        with self._lock:
            self.stats.requested += int(keys.shape[0])
            self.stats.promoted += promoted

    def _stamp(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, int]:
        """Which of a request's keys are in memory, those stamped as seen now; how many are not."""
        if not self.rows.hash_vnodes:
            return np.zeros(keys.shape[0], np.bool_), int(keys.shape[0])
        hot = np.empty(keys.shape[0], np.bool_)
        d = self.rows.directory
        return hot, int(tier_loops.seen_many(*d.hash_args, d.life0, self.rows.slot, vnodes, counts, keys, self.column,
                                             self.now, hot))

    def prefetch(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> tuple[int, bool]:
        """Keys a later request will ask for.  While reading ahead pays (``readahead.Policy``:
        rows read back came from the disk), those in memory are stamped as seen (a settle
        meanwhile keeps them), and the disk pages where the others would be are read in
        the background (``readahead.py``), so that the request finds them in place.
        Nothing moves.  How many were not in memory, and whether it read ahead."""
        if not self.cold_keys or not self.reading.wanted():
            return 0, False
        hot, missing = self._stamp(vnodes, counts, keys)
        if not missing:
            return 0, True
        c = self.cold.directory
        out = np.empty(4 * int(missing), np.int64)
        n = tier_loops.cold_pages(c.d, self.cold.slot, vnodes, counts, keys, hot, c.life0.strides[0], PAGE_SHIFT, out)
        pages = np.unique(out[:n])
        readahead.submit(pages, c.held(), self.reading)
        with self._lock:
            self.stats.prefetched += int(missing)
            self.stats.prefetch_pages += int(pages.shape[0])
        return int(missing), True

    def _promote(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, hot: np.ndarray) -> int:
        t0 = time.perf_counter()
        c = self.cold.directory
        width, life_width = c.hash_args[2].shape[1], c.life0.shape[1]
        rows = np.empty((keys.shape[0], width), c.hash_args[2].dtype)
        life = np.empty((keys.shape[0], life_width), np.float32)
        found = np.empty(keys.shape[0], np.bool_)
        n = int(tier_loops.take_many(*c.hash_args, c.life0, self.cold.slot, vnodes, counts, keys, hot, rows, life,
                                     found, True))
        self.reading.promoted(n, time.perf_counter() - t0)  # the reads of the rows, before they are put back
        if n:
            self._put(self.rows, vnodes, counts, keys, rows, life, found, self.column, float(self.now))
            self._moved(n)
            self.dirty = True
        with self._lock:
            self.cold_keys -= n
            self.stats.cold_reads += 1
            self.stats.cold_seconds += time.perf_counter() - t0
        return n

    @staticmethod
    def _put(tier: TierRows, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, rows: np.ndarray,
             life: np.ndarray, take: np.ndarray, column: int, clock: float) -> None:
        """Insert the ``take``-marked keys into ``tier``'s vnodes, growing those that fill up."""
        seg, start = 0, 0
        tables = tier.hash_vnodes
        while True:
            d = tier.directory
            seg, start = tier_loops.put_many(*d.hash_args, d.life0, tier.slot, vnodes, counts, keys, rows, life,
                                             take, column, np.float32(clock), seg, start)
            if seg == vnodes.shape[0]:
                return
            v = int(vnodes[seg])
            a = int(counts[:seg].sum())
            vt = tables[v]
            heap_released(vt._grow(len(vt) + int(take[a + start:a + int(counts[seg])].sum())))
            tier.enter(v)

    def _moved(self, rows: int) -> None:
        """``rows`` moved between the tiers: each may have mapped a page of the cold arrays in."""
        with self._lock:
            self._traffic += rows * mmap.PAGESIZE
            due = self._traffic >= RELEASE_BYTES and self.arena.nbytes > RELEASE_BYTES  # (smaller: all may stay)
            if due:
                self._traffic = 0
        if due:
            self.arena.release()

    @property
    def now(self) -> np.float32:
        """What a ``seen`` stamp made now holds: the request count, or the generation."""
        return np.float32(self.clock if self.generations is None else self.generations.now)

    # ---- the budget -----------------------------------------------------------------------
    @property
    def hot_bytes(self) -> int:
        return sum(vt.nbytes for vt in self.rows.hash_vnodes.values())

    def settle(self) -> None:
        """Hold the budget.  Once the hot vnodes' arrays reach it, they are rebuilt at an
        equal share of it, and from then on, whenever a vnode's keys pass ``HIGH`` of what
        its share holds, the least recently seen keys of every vnode past ``LOW`` go to the
        cold tier: the arrays keep their size, and their slots are reused.  A vnode that
        grew anyway (a request filled it) is rebuilt at its share again."""
        self.dirty = False
        tables = self.rows.hash_vnodes
        if self.clock < self._retry_at or not tables:
            return
        hot = self.hot_bytes
        self.stats.peak_hot_bytes = max(self.stats.peak_hot_bytes, hot)
        over = hot > self.budget
        first = next(iter(tables.values()))
        slots = self.budget / len(tables) / (first.nbytes / (first.capacity + 1))  # a vnode's share of the budget
        share = max(MIN_CAPACITY, int(slots) - 1)  # its arrays: at least MIN_CAPACITY slots, ...
        lens = np.fromiter((len(vt) for vt in tables.values()), np.int64, len(tables))
        if not over and not (self.sized and lens.max() > HIGH * first.max_load * slots):  # ... its keys: the budget's
            return
        t0 = time.perf_counter()
        self.stats.settles += 1
        max_load = first.max_load
        try:
            self._demote(np.maximum(lens - int(LOW * max_load * slots), 0))
            if self.generations is not None and self.generations.step():  # the keys seen from now on are younger
                self.generations.down([vt.life for vt in tables.values() if vt.life is not None])
        except DiskFullError as exc:
            self.stats.disk_full += 1
            self._retry_at = self.clock + RETRY_REQUESTS
            logger.error("table %r: rows over the memory budget stay in memory: %s", self.arena.label, exc)
        if over:
            self._resize(share)
        self.stats.settle_seconds += time.perf_counter() - t0

    def _demote(self, excess: np.ndarray) -> None:
        """Move the ``excess[t]`` least recently seen keys of each hot vnode to the cold tier."""
        if not excess.any():
            return
        vnodes, counts, keys = self._oldest(excess)
        # every cold vnode grown first: a full disk stops the settle here, nothing moved; after
        # it the rows are taken out of memory and put on disk, where nothing can fail any more
        self._make_room(vnodes, counts)
        d = self.rows.directory
        rows = np.empty((keys.shape[0], d.hash_args[2].shape[1]), d.hash_args[2].dtype)
        life = np.empty((keys.shape[0], d.life0.shape[1]), np.float32)
        found = np.empty(keys.shape[0], np.bool_)
        tier_loops.take_many(*d.hash_args, d.life0, self.rows.slot, vnodes, counts, keys,
                             np.zeros(keys.shape[0], np.bool_), rows, life, found, True)
        self._put(self.cold, vnodes, counts, keys, rows, life, found, -1, 0.0)
        self.cold_keys += int(keys.shape[0])
        self.stats.demoted += int(keys.shape[0])
        self._moved(int(keys.shape[0]))

    def _oldest(self, excess: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ``excess[t]`` least recently seen keys of each hot vnode (of those last seen
        in the same ``BINS``-th of the clock, the first a walk meets), as a request's arrays."""
        d, n = self.rows.directory, len(self.rows.hash_vnodes)
        clock = self.now
        bins = np.zeros((n, BINS), np.int64)
        tier_loops.seen_counts(*d.hash_args, d.life0, n, self.column, clock, bins)
        cum = np.cumsum(bins, axis=1)
        cut = np.minimum((cum < excess[:, None]).sum(axis=1), BINS - 1)  # each vnode's threshold bin
        rows = np.arange(n)
        below = np.where(cut > 0, cum[rows, cut - 1], 0)  # the keys of the bins before: all go
        need = np.where(excess > 0, excess - below, 0)  # of the threshold's bin
        cut = np.where(excess > 0, cut, -1)
        vnode_of = np.array(list(self.rows.hash_vnodes), np.int64)
        out_v, out_k = np.empty(int(excess.sum()), np.int64), np.empty(int(excess.sum()), np.uint64)
        turn = int(hash64_array(np.array([self.stats.settles], np.uint64))[0] >> np.uint64(1))
        have = bins[rows, np.maximum(cut, 0)]
        k = tier_loops.oldest(*d.hash_args, d.life0, n, self.column, clock, BINS, cut, need, have, turn, vnode_of,
                              out_v, out_k)
        out_v, out_k = out_v[:k], out_k[:k]
        starts = np.flatnonzero(np.diff(out_v, prepend=-1))  # runs of one vnode (a vnode's keys are together)
        counts = np.diff(np.append(starts, k)).astype(np.int64)
        return frozen(out_v[starts].astype(np.int32)), frozen(counts), frozen(out_k)

    def _make_room(self, vnodes: np.ndarray, counts: np.ndarray) -> None:
        """Each cold vnode made (or grown) to take ``counts`` more keys."""
        tables = self.cold.tables
        new = {v: self._new_cold(v, 2 * c) for v, c in zip(vnodes.tolist(), counts.tolist(), strict=True)
               if v not in tables}
        if new:
            self.cold.add(new)
        for v, c in zip(vnodes.tolist(), counts.tolist(), strict=True):
            cold = tables[v]
            if len(cold) + c >= cold._limit():  # doubled: a cold vnode fills while the tier does
                cold._grow(max(2 * len(cold), len(cold) + c))
                self.cold.enter(v)

    def _resize(self, share: int) -> None:
        """Rebuild the vnodes whose arrays are not ``share`` slots at that size (or, the
        rare one whose keys it cannot hold at ``MAX_LOAD``, at the size they need)."""
        tables = self.rows.hash_vnodes
        for v, vt in tables.items():
            capacity = max(share, int(len(vt) / vt.max_load) + 2)
            if vt.capacity != capacity:
                vt.keep(np.ones(len(vt), bool), capacity=capacity)
                self.rows.enter(v)
        self.sized = True
        trim_heap()  # the heap arrays rebuilt leave free pages in malloc's arenas

    # ---- whole vnodes -------------------------------------------------------------------
    def drop(self, vnode: int) -> None:
        """Forget ``vnode``'s cold rows (it left this server, or a copy replaces it)."""
        cold = self.cold.drop(int(vnode))
        if cold is not None:
            self.cold_keys -= len(cold)

    def keep_only(self, vnodes: set[int]) -> None:
        for v in [v for v in self.cold.tables if v not in vnodes]:
            self.drop(v)

    def figures(self) -> dict[str, float]:
        s = self.stats
        hit = 1.0 - s.promoted / s.requested if s.requested else 1.0
        return {"budget_bytes": self.budget, "hot_bytes": self.hot_bytes, "cold_bytes": self.arena.nbytes,
                "cold_keys": self.cold_keys, "requested": s.requested, "promoted": s.promoted, "demoted": s.demoted,
                "hit_rate": hit, "settles": s.settles, "cold_reads": s.cold_reads, "cold_seconds": s.cold_seconds,
                "settle_seconds": s.settle_seconds, "disk_full": s.disk_full, "peak_hot_bytes": s.peak_hot_bytes,
                "prefetched": s.prefetched,
                "prefetch_pages": s.prefetch_pages}
