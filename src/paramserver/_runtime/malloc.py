"""Keep big buffers in the heap instead of mmap, so each batch does not page-fault.

glibc serves allocations above M_MMAP_THRESHOLD (128 KiB, adapted up to 32 MiB) with
mmap and returns them with munmap; the heap top above M_TRIM_THRESHOLD goes back to the
OS too.  A parameter server allocates the same 10-100 MB of batch buffers (keys, rows,
message frames) again and again, so every batch paid ~4 000 minor page faults per 16 MB
(measured: routing 1e6 keys took 11.4 ms with faults, 6.6 ms without).  Raising both
thresholds keeps those pages mapped and reused.  Applied by the processes paramserver
starts (servers, workers, scheduler); a user's own process opts in by calling it.

The other side of it: memory freed for good (a hash vnode's heap array once the vnode
grew onto a mapping of its own) stays resident too, until ``trim_heap`` gives the free
pages of malloc's arenas back (``store/memory.heap_released`` decides when).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


@functools.cache
def _glibc(name: str) -> Callable[..., int] | None:
    """glibc's function ``name`` (``mallopt``, ``malloc_trim``), or None where the C library is
    not glibc (macOS, musl).  The C library is already loaded: its symbols, without
    find_library's ldconfig run (2 ms)."""
    try:
        fn: Callable[..., int] = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    return fn


def tune_allocator(mmap_threshold: int = 256 << 20, trim_threshold: int = 1 << 30) -> bool:
    """Raise glibc's mmap and trim thresholds; return False where that is not possible."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False  # nothing to tune
    ok: bool = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1 and mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1
    logger.debug("malloc thresholds raised: %s", ok)
    return ok


def share_one_arena() -> bool:
    """Every thread this process starts from now on, and every process it forks, allocates
    from malloc's main arena (glibc's ``M_ARENA_MAX`` 1); False where that is not possible.

    glibc gives each new thread an arena of its own, whose heaps (64 MiB each) are unmapped
    once empty, whatever the trim threshold.  A training worker's batches are allocated by its
    reader and deduplication threads and freed by its main thread, so those heaps came and
    went and their pages were faulted in again: 27 000 faults in the default job's worker
    while it trained, 15 000 in its deduplication thread.  With one arena (whose top the raised
    trim threshold keeps) the default job (10^6 heavy rows, 1 + 1 nodes, ten pairs in turn)
    ran at 901 k examples/s against 844 k (medians; ahead in 8 of 10), on 2.88 CPU seconds
    against 3.15.  It must come before the process's first thread: glibc fixes the arenas'
    limit when a thread first needs one, so a node forked from a process with threads already
    keeps that process's limit (set in the nodes alone it saved 3 000 faults, and no time).
    Small allocations still go through each thread's own cache, without the arena's lock."""
    mallopt = _glibc("mallopt")
    return mallopt is not None and mallopt(_M_ARENA_MAX, 1) == 1


def trim_heap() -> bool:
    """Give the free pages of every malloc arena back to the kernel (glibc's
    ``malloc_trim(0)``); False where that is not possible."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True
