"""What the client's I/O thread runs later (``IOThread.call_later``: a retry's back-off, a
tick's next try): callbacks in a heap by due time, added from any thread and run on the
I/O thread.  They share the I/O thread's lock, under which it also decides it is closed:
a callback added after that is refused (``add`` returns False, and its caller runs it at
once), so none waits in a heap that nobody will run again."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Timers:
    """Callbacks by due time (``clock``'s seconds), under ``lock``."""

    def __init__(self, clock: Callable[[], float], lock: threading.Lock) -> None:
        self._clock, self._lock = clock, lock
        self._heap: list[tuple[float, int, Callable[[], None]]] = []  # (due, n, fn)
        self._ids = itertools.count()

    def add(self, delay_s: float, fn: Callable[[], None], closed: threading.Event) -> bool:
        """Run ``fn`` after ``delay_s``; False (nothing added) once ``closed`` is set."""
        with self._lock:
            if closed.is_set():
                return False
            heapq.heappush(self._heap, (self._clock() + delay_s, next(self._ids), fn))
            return True

    def run_due(self) -> float:
        """Run the callbacks that are due; seconds until the next one (inf: none)."""
        while True:
            with self._lock:
                if not self._heap:
                    return float("inf")
                due, _, fn = self._heap[0]
                now = self._clock()
                if due > now:
                    return due - now
                heapq.heappop(self._heap)
            try:
                fn()
            except Exception:
                logger.exception("timer callback failed")

    def drain(self) -> None:
        """Run every callback now: a retry in back-off finds the client closed and fails its
        future, instead of waiting for ever."""
        while True:
            with self._lock:
                if not self._heap:
                    return
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:
                logger.debug("timer failed at close", exc_info=True)
