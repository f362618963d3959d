"""Logging that a flood cannot turn into a disk-filler: ``Throttled`` lets a few messages of
a kind through, then counts the rest and says how many once a window is over."""

from __future__ import annotations

import logging
import time
from typing import Any


class Throttled:
    """At most ``burst`` messages every ``window_s`` seconds; the others are counted and
    reported in one line when the next message arrives after the window.

    Example:
        >>> bad = Throttled(logging.getLogger("x"), burst=5, window_s=10)
        >>> bad.warning("bad request from %r: %s", peer, exc)          # doctest: +SKIP
    """

    def __init__(self, logger: logging.Logger, burst: int = 5, window_s: float = 10.0):
        self.logger, self.burst, self.window_s = logger, burst, window_s
        self._start, self._sent, self.suppressed = -float("inf"), 0, 0

    def log(self, level: int, msg: str, *args: Any, exc_info: bool = False) -> None:
        now = time.monotonic()
        if now - self._start >= self.window_s:
            if self.suppressed:
                self.logger.log(level, "%d more such messages in the last %.0f s were not logged",
                                self.suppressed, now - self._start)
            self._start, self._sent, self.suppressed = now, 0, 0
        if self._sent < self.burst:
            self._sent += 1
            self.logger.log(level, msg, *args, exc_info=exc_info)
        else:
            self.suppressed += 1

    def warning(self, msg: str, *args: Any) -> None:
        self.log(logging.WARNING, msg, *args)

    def exception(self, msg: str, *args: Any) -> None:
        self.log(logging.ERROR, msg, *args, exc_info=True)
