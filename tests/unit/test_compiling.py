"""A first run says that numba compiles, while it does, and leaves no thread behind (a
``LocalCluster`` forks its nodes only from a process with no other thread)."""

import threading
import time
from types import SimpleNamespace

from paramserver._runtime import compiling


def test_compiles_are_said_once_then_every_few_seconds_and_the_ticker_goes_with_them(monkeypatch):
    monkeypatch.setattr(compiling, "EVERY_S", 0.3)
    said: list[str] = []
    compiles = compiling._Compiles(said.append)
    threads = threading.active_count()

    def event(name):
        return SimpleNamespace(data={"dispatcher": SimpleNamespace(__qualname__=name)})

    compiles.on_start(event("parse_criteo"))
    compiles.on_start(event("inner"))  # a kernel it calls: part of it
    deadline = time.monotonic() + 10
    while len(said) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    compiles.on_end(event("inner"))
    compiles.on_end(event("parse_criteo"))
    assert said[0].startswith("compiling numba kernels for this machine: once")
    assert "still compiling: 0 kernel(s) done" in said[1] and "now parse_criteo" in said[1]
    assert threading.active_count() == threads and compiles.done == 1
    compiles.on_start(event("second"))
    compiles.on_end(event("second"))
    assert sum(s.startswith("compiling") for s in said) == 1 and threading.active_count() == threads
