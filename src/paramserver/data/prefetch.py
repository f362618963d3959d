"""``Prefetch``: the items of an iterator, produced ahead in a background thread.

The training loop reads its shards through one: parsing and deduplication (numba, the
GIL released) overlap the loop's waits on the network.  The thread runs at a lower
priority (``READER_NICE``): on a machine whose cores the job fills, the loops that others
wait on (a server's, the worker's own) go first, and the reading fills the time they leave.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

#: how much nicer a reader thread is than its process's main thread (Linux sets it a thread at
#: a time; elsewhere nothing changes).
#: The default job on 2 cores, its reader threads at 0 against 10 (alternating, 8 pairs):
#: 742 k and 741 k examples/s against 771 k and 789 k; the same model
READER_NICE = 10


def lower_priority(by: int = READER_NICE) -> None:
    """This thread ``by`` nicer than the process's main thread (whose niceness the process id
    reads; at most 19), where the system allows: a reader started by a reader is no nicer.
    Linux only: elsewhere a thread's id is no process id, and ``setpriority`` given one could
    reach another process."""
    if not sys.platform.startswith("linux"):
        return
    try:
        nice = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + by)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):  # no per-thread niceness here, or not allowed: as it was
        pass


class Prefetch:
    """The items of ``items``, produced in a background thread up to ``depth`` ahead, and
    (``weight``: an item's bytes) up to ``budget`` bytes of them, one item whatever its size.

    Parsing (numba, GIL released) then overlaps the consumer's waits on the network.
    Errors are re-raised in the consumer; ``close()`` (or leaving a ``with`` block) stops
    the thread.
    """

    _END = object()

    def __init__(self, items: Iterator[Any], depth: int = 4, budget: int = 0,
                 weight: Callable[[Any], int] | None = None):
        self._out: queue.Queue[tuple[bool, Any, int]] = queue.Queue(maxsize=depth)
        self._budget, self._weight = budget, weight if budget else None
        self._held = 0  # the weight of the items queued (with a budget)
        self._room = threading.Condition()
        self._stop = threading.Event()
        self._ended = False
        self._thread = threading.Thread(target=self._produce, args=(items,), name="paramserver-reader",
                                        daemon=True)
        self._thread.start()

    def _put(self, ok: bool, value: Any) -> bool:
        """Hand ``value`` over unless the consumer has stopped (then never block)."""
        weight = self._weight(value) if self._weight is not None and ok and value is not self._END else 0
        if weight:
            with self._room:  # the first item queued goes whatever its weight
                while self._held and self._held + weight > self._budget and not self._stop.is_set():
                    self._room.wait(0.1)
                self._held += weight
        while not self._stop.is_set():
            try:
                self._out.put((ok, value, weight), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self, items: Iterator[Any]) -> None:
        lower_priority()
        try:
            for item in items:
                if not self._put(True, item):
                    return
            self._put(True, self._END)
        except BaseException as exc:  # handed to the consumer
            self._put(False, exc)
        finally:  # a generator stopped early ends here, in the thread that ran it (its own blocks close)
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Prefetch:
        return self

    def __next__(self) -> Any:
        if self._ended:
            raise StopIteration
        ok, value, weight = self._out.get()
        if weight:
            with self._room:
                self._held -= weight
                self._room.notify()
        if not ok:
            self._ended = True
            raise value
        if value is self._END:
            self._ended = True
            raise StopIteration
        return value

    def ready(self) -> bool:
        """Whether the next item (or the end) is here: ``next`` would not wait."""
        return self._ended or not self._out.empty()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_ahead(sources: Iterable[Callable[[], Iterator[Any]]], at_once: int, depth: int = 2) -> Iterator[Any]:
    """The items of each source (an iterator, made when its turn to start comes), the
    sources one after the other, with up to ``at_once`` of them producing ahead at once,
    each in a thread of its own (``Prefetch``, ``depth`` items ahead): the byte ranges of a
    file parsed on several cores and handed over in the file's order."""
    pending = iter(sources)
    running: deque[Prefetch] = deque()
    try:
        while True:
            while len(running) < max(1, at_once) and (make := next(pending, None)) is not None:
                running.append(Prefetch(make(), depth))
            if not running:
                return
            yield from running[0]
            running.popleft().close()
    finally:
        for started in running:
            started.close()
