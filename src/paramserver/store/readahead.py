"""Cold rows read ahead of the request that needs them (``Tiers.prefetch``), in a thread
of their own: the server's loop names the pages, this thread has the kernel bring them in.

A tiered table's cold rows are in files mapped into memory (``disk.py``).  A request
that finds a row there reads it through the mapping: a page the kernel does not cache
stops the server's one loop for a disk read, and a cached page that ``DiskArena.release``
unmapped costs a fault all the same.  Pages named here are first all asked for at once
(``MADV_WILLNEED``: the reads queued together, each disk working on many), then mapped
into the process (``MADV_POPULATE_READ``, Linux 5.14: waits for them; not marked
written, which would make the kernel write back pages named for keys the tier turns out
not to hold); the loop's later read of the row finds it in place.  On an older kernel
the reads are queued and the mapping is left to the fault.

Reading ahead pays only where the pages are not in memory already: a row read back from
the page cache costs about a microsecond, and naming its pages costs as much again, on
cores the server and the workers need.  So each table reads ahead only while it must
(``Policy``): from when its promotions cost ``SLOW_ROW_S`` a row (their pages came from
the disk) until the pages it reads ahead cost under ``FAST_PAGE_S`` each (they were
cached); the server tells the workers which (``Client.prefetch``), who then name keys
only now and then.  Where the disk's random reads are the limit (a memory limit far
below the cold files), reading ahead reorders them more than it saves them: 1.11x the
examples/s there (``docs/benchmarks.md``).

It is a hint: nothing is read into Python, no row moves, and a page named for an array
that has been replaced since (the vnode grew) is read for nothing, never freed under the
thread (a submission holds the arrays its pages are in).  A server that names pages
faster than the disk reads them drops the oldest named, not the newest.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from numba import njit

from paramserver._runtime.pages import MADVISE, WhileQueued

MADV_WILLNEED = 3  # <sys/mman.h>
MADV_POPULATE_READ = 22  # Linux 5.14
PAGE_SHIFT = 12
#: submissions waiting for the thread at most; past it the oldest is dropped
MAX_PENDING = 4
SLOW_ROW_S = 10e-6  # rows read back at this cost or more a row came from the disk: read ahead
FAST_PAGE_S = 4e-6  # pages read ahead at less a page were in memory already: stop
ALPHA = 0.1  # the weight of a request's cost in the running averages


def _average(mean: float | None, sample: float) -> float:
    return sample if mean is None else mean + ALPHA * (sample - mean)


class Policy:
    """Whether one table reads ahead (``wanted``), from what its reads cost: rows read back
    by requests (``promoted``), pages read ahead (``read``, from the thread)."""

    def __init__(self) -> None:
        self.on = False
        self.row_s: float | None = None  # seconds a promoted row, on average, while off
        self.page_s: float | None = None  # seconds a page read ahead, on average, while on

    def promoted(self, rows: int, seconds: float) -> None:
        if rows and not self.on:
            self.row_s = _average(self.row_s, seconds / rows)

    def read(self, pages: int, seconds: float) -> None:
        if pages and self.on:
            self.page_s = _average(self.page_s, seconds / pages)

    def wanted(self) -> bool:
        if self.on and self.page_s is not None and self.page_s < FAST_PAGE_S:
            self.on, self.row_s = False, None  # cached: measure the rows afresh before reading ahead again
        elif not self.on and self.row_s is not None and self.row_s >= SLOW_ROW_S:
            self.on, self.page_s = True, None
        return self.on


_madvise = MADVISE  # a global of the loop below: numba calls it by its address


@njit(nogil=True)  # not cached: it calls a C function by its address in this process
def _advise(pages: np.ndarray, shift: int, advice: int) -> int:
    """``madvise(advice)`` over ``pages`` (sorted page numbers), a call a run of adjacent
    ones; how many calls succeeded."""
    done = 0
    i = 0
    n = pages.shape[0]
    while i < n:
        j = i + 1
        while j < n and pages[j] == pages[j - 1] + 1:
            j += 1
        if _madvise(pages[i] << shift, (j - i) << shift, advice) == 0:
            done += 1
        i = j
    return done


class Readahead(WhileQueued[tuple[np.ndarray, Any, Policy | None]]):
    """The thread that brings named pages in; it runs while submissions wait."""

    def __init__(self) -> None:
        super().__init__("paramserver-readahead", MAX_PENDING)
        self.populate = True  # MADV_POPULATE_READ works here (until a call says otherwise)
        self.pages = 0  # pages brought in

    def submit(self, pages: np.ndarray, held: Any, policy: Policy | None = None) -> None:
        """Bring ``pages`` (sorted distinct page numbers, ``PAGE_SHIFT``) in; ``held``
        keeps the arrays they are in mapped until it is done; ``policy`` learns the cost."""
        if pages.shape[0] and MADVISE is not None:
            self._put((pages, held, policy))

    def _work(self, item: tuple[np.ndarray, Any, Policy | None]) -> None:
        pages, _held, policy = item
        t0 = time.perf_counter()
        _advise(pages, PAGE_SHIFT, MADV_WILLNEED)  # every read queued before the first is waited for
        if self.populate and _advise(pages, PAGE_SHIFT, MADV_POPULATE_READ) == 0:
            self.populate = False  # (EINVAL before Linux 5.14: no call did)
        if policy is not None:
            policy.read(int(pages.shape[0]), time.perf_counter() - t0)
        with self._lock:
            self.pages += int(pages.shape[0])


def warm() -> None:
    """Compile the thread's kernel now (a tiered table's creation), not at its first run."""
    if MADVISE is not None:
        _advise(np.zeros(0, np.int64), PAGE_SHIFT, MADV_WILLNEED)


readahead = Readahead()
