"""Say that numba is compiling, while it does: a first run on a machine compiles the
kernels (tens of seconds) before it caches them, and a command that stays silent that
long looks hung.

``announce_compiles(say)`` listens to numba's compile events: at the first kernel a
command compiles it says what is happening and that it happens once; while compiles go on
it says, at most every ``EVERY_S``, how many kernels are done and which one compiles.
A run whose kernels load from numba's cache says nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

EVERY_S = 2.0  # while kernels compile, a line at least this often


class _Compiles:
    """numba's ``numba:compile`` listener (its ``Listener`` interface, duck-typed: the
    class is made when numba is loaded), and a ticker thread that speaks while a kernel
    compiles.  The ticker lives only as long as that compile: a ``LocalCluster`` forks its
    nodes only from a process with no other thread (else it spawns them, much slower)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say, self.lock = say, threading.Lock()
        self.depth, self.done, self.current, self.started = 0, 0, "", 0.0
        self.said_at = 0.0
        self.ticker: threading.Thread | None = None
        self.quiet = threading.Event()  # set: the compile is over, the ticker ends

    def on_start(self, event: Any) -> None:
        with self.lock:
            self.depth += 1
            if self.depth > 1:  # a kernel another one calls: part of it
                return
            self.current = getattr(event.data.get("dispatcher"), "__qualname__", "") or str(event.data.get(
                "dispatcher", ""))
            now = time.monotonic()
            if not self.started:
                self.started = self.said_at = now
                self.say("compiling numba kernels for this machine: once, then they are cached and later runs start "
                         "in seconds (a first run can take a minute)")
            self.quiet.clear()
            self.ticker = threading.Thread(target=self._tick, name="paramserver-compiling", daemon=True)
            self.ticker.start()

    def on_end(self, event: Any) -> None:
        with self.lock:
            self.depth = max(0, self.depth - 1)
            if self.depth:
                return
            self.done += 1
            ticker, self.ticker = self.ticker, None
            self.quiet.set()
        if ticker is not None:
            ticker.join()  # gone before the caller goes on (and perhaps forks)

    def _tick(self) -> None:
        while not self.quiet.wait(0.25):
            with self.lock:
                if time.monotonic() - self.said_at >= EVERY_S:
                    self.said_at = time.monotonic()
                    self.say(f"  still compiling: {self.done} kernel(s) done in {self.said_at - self.started:.0f} s, "
                             f"now {self.current}")


def announce_compiles(say: Callable[[str], None]) -> None:
    """Say (through ``say``) when numba compiles, for as long as this process runs."""
    from numba.core import event

    compiles = _Compiles(say)

    class Listener(event.Listener):  # numba's base class
        def on_start(self, ev: Any) -> None:
            compiles.on_start(ev)

        def on_end(self, ev: Any) -> None:
            compiles.on_end(ev)

    event.register("numba:compile", Listener())  # type: ignore[no-untyped-call]
