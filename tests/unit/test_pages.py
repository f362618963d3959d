"""``_runtime/pages.py``: a queue worked by a thread that runs only while items wait."""

from __future__ import annotations

import threading
import time

from paramserver._runtime.pages import MADVISE, WhileQueued


class _Recorder(WhileQueued[int]):
    def __init__(self, limit: int = 0) -> None:
        super().__init__("test-while-queued", limit)
        self.worked: list[int] = []
        self.gate = threading.Event()
        self.paused = False

    def _paused(self) -> bool:
        return self.paused

    def _work(self, item: int) -> None:
        self.gate.wait(10)
        self.worked.append(item)


def test_items_are_worked_in_order_and_the_thread_ends_with_the_queue():
    q = _Recorder()
    q.gate.set()
    for i in range(5):
        q._put(i)
    q.wait()
    assert q.worked == [0, 1, 2, 3, 4] and q._thread is None


def test_past_its_limit_the_oldest_waiting_item_is_dropped():
    q = _Recorder(limit=2)
    q._put(0)  # taken by the thread, which waits at the gate
    deadline = time.monotonic() + 10
    while q._queue and time.monotonic() < deadline:  # until the thread holds item 0
        time.sleep(0.001)
    assert not q._queue
    for i in range(1, 5):
        q._put(i)
    q.gate.set()
    q.wait()
    assert q.worked == [0, 3, 4] and q.dropped == 2


def test_a_paused_queue_keeps_its_items_until_it_is_started_again():
    q = _Recorder()
    q.gate.set()
    q.paused = True
    q._put(7)
    assert q._thread is None and list(q._queue) == [7]
    q.paused = False
    with q._lock:
        q._start()
    q.wait()
    assert q.worked == [7]


def test_madvise_is_bound_here():
    assert MADVISE is not None  # Linux: the engine's populater, release and read-ahead use it
