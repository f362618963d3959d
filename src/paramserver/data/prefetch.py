"""``Prefetch``: the items of an iterator, produced ahead in a background thread.

The training loop reads its shards through one: parsing and deduplication (numba, the
GIL released) overlap the loop's waits on the network.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any


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
        try:
            for item in items:
                if not self._put(True, item):
                    return
            self._put(True, self._END)
        except BaseException as exc:  # handed to the consumer
            self._put(False, exc)

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
