"""A hash vnode that grows off malloc's heap (``store/memory.py``, ``HUGE_BYTES``) says how
many heap bytes it let go, and once enough have gathered the free pages of malloc's arenas
go back to the kernel: the processes raise malloc's trim threshold, so those arrays stayed
resident (a 10^7-key dim-1 table: 40.9 resident bytes a key, 24.1 in the tables)."""

from __future__ import annotations

import numpy as np

from paramserver._runtime import malloc
from paramserver.store import memory
from paramserver.store.table import VnodeTable
from paramserver.tables.optim import SGD, Zeros


def test_a_vnode_says_what_it_let_go_of_the_heap_once_when_it_moves_off_it():
    table = VnodeTable(1, SGD(lr=1.0), Zeros(), seed=0)
    released = []
    keys = np.arange(1, 4097, dtype=np.uint64)
    while table.slots.nbytes < 2 * memory.HUGE_BYTES:  # past the heap's limit, growth by growth
        before = table.slots.nbytes
        n = table._grow(int(table.capacity * 0.9))
        if n:
            assert memory.on_heap(before) and not memory.on_heap(table.slots.nbytes)
            assert n == before  # the old slots, whole
            released.append(n)
        else:
            assert memory.on_heap(before) == memory.on_heap(table.slots.nbytes)  # an ordinary growth
    assert len(released) == 1
    table.apply(keys, np.ones((keys.size, 1), np.float32))  # still a working table
    out = np.empty((keys.size, 1), np.float32)
    table.lookup(keys, out)
    assert (out == -1).all()


def test_the_heap_is_trimmed_once_enough_has_been_let_go(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "trim_heap", lambda: calls.append(1) or True)
    monkeypatch.setattr(memory, "_released", 0)
    step = memory.TRIM_BYTES // 4
    for _ in range(3):
        memory.heap_released(step)
    assert calls == []  # not yet: 3/4 of the threshold
    memory.heap_released(step)
    assert calls == [1]
    for _ in range(3):
        memory.heap_released(step)
    assert calls == [1]  # counting starts again after a trim


def test_trim_heap_trims_for_real_where_malloc_can():
    import ctypes.util

    glibc = ctypes.util.find_library("c") is not None and hasattr(ctypes.CDLL(None), "malloc_trim")
    assert malloc.trim_heap() is glibc  # glibc's malloc_trim, or False elsewhere: never an error
