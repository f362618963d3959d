"""What the engine asks of the kernel about pages, shared: the C library's ``madvise``
(one binding a process, taking addresses as integers, so numba loops can call it too),
and ``WhileQueued``, a queue worked by a thread of its own that runs only while items
wait (a process that forks sees none of it afterwards)."""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def _libc_madvise() -> Any:
    """``madvise(address, length, advice)`` of the loaded C library (``find_library`` runs
    ldconfig: 2 ms), or None where there is none."""
    try:
        f = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    f.argtypes = (ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int)
    f.restype = ctypes.c_int
    return f


MADVISE = _libc_madvise()


class WhileQueued(Generic[T]):
    """Items handed to ``_work`` in a thread named ``name``, oldest first; at most
    ``limit`` wait (0: any number), past it the oldest is dropped (``dropped``).  The
    thread starts when an item arrives and ends when none is left, or while ``_paused``."""

    def __init__(self, name: str, limit: int = 0) -> None:
        self._lock = threading.Lock()
        self._queue: deque[T] = deque()
        self._thread: threading.Thread | None = None  # while items wait
        self._name, self._limit = name, limit
        self.dropped = 0

    def _put(self, item: T) -> None:
        with self._lock:
            self._queue.append(item)
            while self._limit and len(self._queue) > self._limit:
                self._queue.popleft()
                self.dropped += 1
            self._start()

    def _start(self) -> None:
        """Start the thread if items wait and it is not running (the lock held)."""
        if self._thread is None and self._queue and not self._paused():
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _paused(self) -> bool:
        return False

    def _work(self, item: T) -> None:
        raise NotImplementedError

    def wait(self) -> None:
        """Until every item is worked (tests and benchmarks)."""
        while (thread := self._thread) is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue or self._paused():  # done, or paused: whoever unpauses restarts it
                    self._thread = None
                    return
                item = self._queue.popleft()
            self._work(item)
            del item
