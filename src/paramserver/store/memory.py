"""Memory for vnodes: a hash vnode's slots (``new_slots``, ``slot_views``: a key and its row
side by side, on huge pages where the kernel allows), and for dense vnodes the up-front
check and zeroed arrays whose pages are mapped off the hot path.

A dense vnode is allocated whole when it is created, so its memory is known (and
refused, ``available_memory``) before any push.  Left to the first touch, a 2**24-row
dim-1 FTRL table took 65 536 page faults, ~0.35 s of server time inside a 1e6-row job on
this VM (~5 µs a fault).  ``MAP_POPULATE`` mapped those 256 MiB in one call, but that
call (0.06-0.2 s) sat on the path from ``create_table`` to a job's first example.

``zeroed_rows`` maps the array at once and has one background thread a process map its
pages with ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14+): the kernel faults every page
in as if it were written, without writing, so it is safe while the server already reads
and updates rows (a row touched first is faulted in by that touch, as before).  The
thread releases the GIL (a ctypes call) and ends once its queue is empty, so a process
that forks (``LocalCluster``) sees no thread of it afterwards.  Small arrays, and kernels
without ``MADV_POPULATE_WRITE``, have their pages touched at once, as before.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np

from paramserver._runtime.malloc import trim_heap
from paramserver._runtime.pages import MADVISE, WhileQueued

PAGE = 4096
MADV_POPULATE_WRITE = 23  # <linux/mman.h>
BACKGROUND_BYTES = 1 << 20  # smaller arrays are populated at once (256 pages: ~1 ms)
CHUNK = 16 << 20  # one madvise call: the thread notices a process exit between chunks
HUGE_BYTES = 2 << 20  # a hash vnode this large asks for huge pages (one is 2 MiB)
#: a hash vnode's capacity is raised to fill its last huge page where that adds at most this
#: share of its bytes (``huge_capacity``): over vnodes of 2-128 MB, sizes spread evenly on a
#: log scale, 2.6 % more resident bytes on average (1.5 % from 2 to 8 MB, 4.4 % from 8 to 32)
HUGE_SLACK = 1 / 8
#: heap bytes a table's growth let go for good (``heap_released``) gathered before the free
#: pages of malloc's arenas go back to the kernel
TRIM_BYTES = 32 << 20


def available_memory() -> int:
    """Bytes this machine can still give (``MemAvailable``), 0 where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def populating_later() -> AbstractContextManager[None]:
    """A block whose new arrays are mapped once it ends (``_Populater.held``)."""
    return _populater.held()


def zeroed_rows(n: int, width: int, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """``dtype[n, width]`` (float32 by default) of zeros whose pages are mapped now or by
    the background thread (never by the first pushes, unless they get there first)."""
    size = np.dtype(dtype).itemsize
    nbytes = n * width * size
    if not nbytes:
        return np.zeros((n, width), dtype)
    area, offset = _huge_mapping(nbytes, "a dense vnode")
    rows = np.frombuffer(area, dtype, n * width, offset).reshape(n, width)  # it keeps the mapping alive
    if nbytes < BACKGROUND_BYTES or not _populater.submit(rows):
        rows.reshape(-1)[:: PAGE // size] = 0  # touch every page now
    return rows


def _huge_mapping(nbytes: int, what: str) -> tuple[mmap.mmap, int]:
    """A private anonymous mapping for ``nbytes`` and their offset in it, its pages asked to
    be huge (``MADV_HUGEPAGE``) from 2 MiB on; where the kernel has no transparent huge
    pages, 4 KiB pages, as before.

    From 2 MiB the bytes start on a 2 MiB boundary: the kernel places a huge page only on
    such a boundary and only where the whole 2 MiB lie inside the advised bytes, so a 3.6 MB
    hash vnode mapped where it fell held one huge page or none (a mapping's start is only
    4 KiB-aligned), and one aligned always holds one; without the advice the default job's
    dense vnodes (2^24 rows, 64 of 4 MiB) had none at all.  The 2 MiB mapped beyond
    ``nbytes`` are never touched: address space, not memory.  The advice covers ``nbytes``
    only: a last 2 MiB they do not fill stays on 4 KiB pages (a partly used huge page would
    cost resident bytes a key), so a hash vnode fills its last huge page by its capacity
    where that is cheap (``huge_capacity``)."""
    huge = nbytes >= HUGE_BYTES
    extra = HUGE_BYTES if huge else 0
    try:
        area = mmap.mmap(-1, nbytes + extra, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, OverflowError) as exc:
        raise MemoryError(f"cannot map {nbytes:,} bytes for {what}: {exc}") from None
    offset = -np.frombuffer(area, np.uint8, 1).ctypes.data % HUGE_BYTES if extra else 0  # whole 4 KiB pages
    if huge:
        try:
            area.madvise(mmap.MADV_HUGEPAGE, offset, nbytes)
        except (AttributeError, OSError):  # no THP in this kernel, or it is off
            pass
    return area, offset


def huge_zeros(nbytes: int) -> np.ndarray:
    """``uint8[nbytes]`` of zeros whose pages the kernel may back with 2 MiB pages
    (``MADV_HUGEPAGE``, where transparent huge pages are ``madvise``, Debian's default),
    starting on a huge page's boundary: a table of random rows costs a TLB miss a key on
    4 KiB pages, whose page walk misses the cache as often as the row itself.  NumPy asks
    for huge pages only from 4 MiB, and a hash vnode of a 10^7-key table is 3.6 MB."""
    if on_heap(nbytes):
        return np.zeros(nbytes, np.uint8)
    area, offset = _huge_mapping(nbytes, "a hash vnode")
    return np.frombuffer(area, np.uint8, nbytes, offset)  # the array keeps the mapping alive


_released = 0  # heap bytes let go for good since the last trim (``heap_released``)
_released_lock = threading.Lock()


def heap_released(nbytes: int) -> None:
    """``nbytes`` of a vnode's heap arrays were freed for good: it grew onto a mapping of its own.

    A hash vnode under ``HUGE_BYTES`` lives on malloc's heap; one at or over it is a mapping
    of its own.  The processes raise malloc's trim threshold (``_runtime/malloc.py``: batch
    buffers stay mapped), so a vnode's last heap array, freed as it grows past
    ``HUGE_BYTES``, stayed resident, and no later growth of any vnode reuses it.  A table of
    10^7 dim-1 keys crossed over on all 64 vnodes at once and left ~128 MB in the vnode
    threads' arenas: 40.5 resident bytes a key, 24.1 of them in the tables.  Every
    ``TRIM_BYTES`` of them, the arenas' free pages go back to the kernel (``trim_heap``)."""
    global _released
    if not nbytes:
        return
    with _released_lock:
        _released += nbytes
        due = _released >= TRIM_BYTES
        if due:
            _released = 0
    if due:
        trim_heap()


def on_heap(nbytes: int) -> bool:
    """Whether an array of ``nbytes`` of slots lives on malloc's heap (``huge_zeros``)."""
    return nbytes < HUGE_BYTES


def new_slots(capacity: int, width: int, dtype: np.dtype[Any], key_bytes: int = 8) -> np.ndarray:
    """The bytes of ``capacity + 1`` slots of ``[key (uint64) | row (width x dtype)]``
    (and 4 bytes to shift them by, ``slot_views``)."""
    return huge_zeros(slots_bytes(capacity, width, dtype, key_bytes))


def slots_bytes(capacity: int, width: int, dtype: np.dtype[Any], key_bytes: int = 8) -> int:
    """Bytes of ``new_slots(capacity, width, dtype)``."""
    return (capacity + 1) * (key_bytes + width * dtype.itemsize) + 4


def huge_capacity(capacity: int, width: int, dtype: np.dtype[Any], key_bytes: int = 8) -> int:
    """``capacity``, or the capacity whose slots fill the last huge page ``capacity``'s slots
    begin, where that adds at most ``HUGE_SLACK`` of their bytes.  A vnode's last 2 MiB that
    its slots do not fill stays on 4 KiB pages (``_huge_mapping``), and a key there costs a
    page walk: at 10^7 dim-1 FTRL keys (64 vnodes of 3.6 MB) 45 % of the slots were on 4 KiB
    pages, and filling each vnode's last huge page (4 MB, 11 % more capacity: a lower load,
    a later growth) took an update from 28.6 to 25.6 ns a key and a read from 30.1 to 25.6
    (one process, the tables built both ways, worked in turn over the same Zipf batches)."""
    nbytes = slots_bytes(capacity, width, dtype, key_bytes)
    if on_heap(nbytes):
        return capacity
    whole = -(-nbytes // HUGE_BYTES) * HUGE_BYTES
    if whole - nbytes > nbytes * HUGE_SLACK:
        return capacity
    return (whole - 4) // (key_bytes + width * dtype.itemsize) - 1


def slot_views(slots: np.ndarray, capacity: int, width: int, dtype: np.dtype[Any],
               key_bytes: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """The key column (``uint64[capacity]``, or ``uint32`` where ``key_bytes`` is 4) and the
    rows (``dtype[capacity + 1, width]``) of ``slots``, as views whose stride is a slot: a key
    and its row share a cache line.  4-byte keys are always aligned (float32 rows: a slot is a
    multiple of 4 bytes), and a dim-1 FTRL slot of 16 bytes never crosses a line.

    Keys are unaligned wherever a slot is not a multiple of 8 bytes (one instruction on
    x86-64 and arm64 all the same); where it is, the slots start 4 bytes in, so that every
    table's keys are of one array type and the kernels are compiled (and warmed) once, not
    once for aligned keys and again for unaligned ones."""
    size = key_bytes + width * dtype.itemsize
    if key_bytes == 4:
        keys = np.ndarray((capacity,), np.uint32, slots, 0, (size,))
        rows = np.ndarray((capacity + 1, width), dtype, slots, 4, (size, dtype.itemsize))
        return keys, rows
    start = 4 if size % 8 == 0 else 0
    keys = np.ndarray((capacity,), np.uint64, slots, start, (size,))
    rows = np.ndarray((capacity + 1, width), dtype, slots, start + 8, (size, dtype.itemsize))
    return keys, rows


class _Populater(WhileQueued[np.ndarray]):
    """The background thread that maps the pages of new arrays, oldest first."""

    def __init__(self) -> None:
        super().__init__("paramserver-populate")
        self.supported: bool | None = None  # known after the first array
        self._held = 0  # inside held(): arrays wait in the queue, the thread starts after

    def submit(self, rows: np.ndarray) -> bool:
        """Queue ``rows`` (C-contiguous, page-aligned); False where the kernel cannot."""
        if self.supported is None:
            self.supported = self._probe(rows)
        if not self.supported:
            return False
        self._put(rows)
        return True

    def _paused(self) -> bool:
        return self._held > 0

    @contextmanager
    def held(self) -> Iterator[None]:
        """Map the arrays made inside the block once it ends: an ``mmap`` waits for the
        thread's ``madvise`` of the array before (both take the process's memory map
        lock), so a table of 64 dense vnodes took 9 ms to create with the thread running,
        4 ms without."""
        with self._lock:
            self._held += 1
        try:
            yield
        finally:
            with self._lock:
                self._held -= 1
                self._start()

    @staticmethod
    def _probe(rows: np.ndarray) -> bool:
        # EINVAL before Linux 5.14
        return MADVISE is not None and MADVISE(rows.ctypes.data, PAGE, MADV_POPULATE_WRITE) == 0

    def _work(self, rows: np.ndarray) -> None:
        address, size = rows.ctypes.data, rows.nbytes
        for offset in range(0, size, CHUNK):
            MADVISE(address + offset, min(CHUNK, size - offset), MADV_POPULATE_WRITE)


_populater = _Populater()
