"""``Prefetch``: items produced ahead in a thread, bounded in number and (``budget``) in bytes."""

import os
import sys
import threading

import pytest

from paramserver.data.prefetch import READER_NICE, Prefetch, read_ahead


class _Counted:
    """An iterator of ``n`` items (each its own weight ``size``) that counts how many it has given."""

    def __init__(self, n, size):
        self.n, self.size, self.given = n, size, 0
        self.moved = threading.Condition()

    def __iter__(self):
        for i in range(self.n):
            with self.moved:
                self.given += 1
                self.moved.notify_all()
            yield (i, self.size)

    def wait_for(self, given):
        with self.moved:
            return self.moved.wait_for(lambda: self.given >= given, timeout=10)


def test_items_come_in_order_and_an_error_reaches_the_consumer():
    with Prefetch(iter(range(100)), depth=3) as items:
        assert list(items) == list(range(100))

    def failing():
        yield 1
        raise ValueError("line 7: bad label")

    with Prefetch(failing()) as items:
        assert next(items) == 1
        with pytest.raises(ValueError, match="line 7"):
            next(items)


def test_the_producer_holds_no_more_than_the_budget_of_bytes_ahead():
    source = _Counted(50, 10)
    with Prefetch(iter(source), depth=40, budget=25, weight=lambda item: item[1]) as items:
        assert source.wait_for(3)  # two queued (20 bytes), the third waits for room
        assert items._held == 20 and items._out.qsize() == 2 and source.given == 3
        assert next(items) == (0, 10)
        assert source.wait_for(4)  # one taken: one more produced, again two queued and one waiting
        assert source.given == 4
        rest = list(items)
    assert [i for i, _ in rest] == list(range(1, 50)) and items._held == 0


def test_an_item_over_the_budget_goes_alone_and_close_frees_a_waiting_producer():
    with Prefetch(iter(_Counted(5, 100)), budget=25, weight=lambda item: item[1]) as items:
        assert [i for i, _ in items] == list(range(5))  # one at a time, never stuck
    source = _Counted(10, 10)
    items = Prefetch(iter(source), budget=15, weight=lambda item: item[1])
    assert source.wait_for(2)  # one queued, the second waits for room
    items.close()
    assert not items._thread.is_alive()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="niceness a thread at a time is Linux's")
def test_a_reader_thread_runs_nicer_than_its_process_and_a_reader_of_a_reader_no_nicer():
    def mine():
        yield os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def outer():
        with Prefetch(mine()) as inner:
            yield os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), next(inner)

    process = os.getpriority(os.PRIO_PROCESS, os.getpid())
    with Prefetch(outer()) as items:
        reader, its_reader = next(items)
    assert reader == its_reader == min(19, process + READER_NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == process  # the caller's is its own


def test_elsewhere_than_linux_no_thread_id_is_taken_for_a_process(monkeypatch):
    """``setpriority`` takes a process id: on Linux a thread's id is one, elsewhere it may
    name another process, so there nothing is reniced."""
    from paramserver.data import prefetch

    def renice(*args):
        raise AssertionError(f"setpriority{args} called off Linux")

    monkeypatch.setattr(prefetch.sys, "platform", "darwin")
    monkeypatch.setattr(prefetch.os, "setpriority", renice)
    prefetch.lower_priority()  # nothing called
    with Prefetch(iter(range(3))) as items:
        assert list(items) == [0, 1, 2]


def test_closing_stops_the_producer_and_closes_its_generator():
    closed = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    items = Prefetch(endless(), depth=2)
    assert next(items) == 0
    items.close()
    assert closed.wait(5)
    assert not items._thread.is_alive()


def test_read_ahead_keeps_the_sources_order_with_several_producing_at_once():
    started, both = [], threading.Barrier(2, timeout=10)

    def source(k):
        def produce():
            started.append(k)
            if k < 2:  # the first two run at once: each waits for the other before its first item
                both.wait()
            yield from ((k, i) for i in range(5))
        return produce

    out = list(read_ahead([source(k) for k in range(4)], at_once=2))
    assert out == [(k, i) for k in range(4) for i in range(5)]
    assert sorted(started) == [0, 1, 2, 3]


def test_read_ahead_hands_on_an_error_and_stops_what_it_started():
    ended = threading.Event()

    def bad():
        yield 1
        raise ValueError("line 3: bad label")

    def endless():
        try:
            while True:
                yield 0
        finally:
            ended.set()

    gen = read_ahead([bad, endless], at_once=2)
    assert next(gen) == 1
    with pytest.raises(ValueError, match="line 3"):
        next(gen)
    assert ended.wait(5)  # the source started beside it is stopped, not left running
