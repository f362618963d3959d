"""Redis unreachable: its calls retried for ``RETRY_S``, and the outage said in three kinds
of line, not one a retry.

- one WARNING when Redis stops answering, saying how long the job keeps trying and what
  happens then;
- a reminder every ``REMIND_S`` while it is down, with the time left;
- one INFO line when it answers again, with how long it was down.

Each process (the driver, each worker) says it once for its own calls: an ``Outage`` a
Redis URL, shared by the process's threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from paramserver.data.batch import DataError

logger = logging.getLogger(__name__)
# its lines are what a stream job's user must see of an outage, its end included, also where
# the command logs warnings only (train): this logger says INFO and up
logger.setLevel(logging.INFO)

RETRY_S = 60.0  # how long Redis may be unreachable before the job fails
REMIND_S = 30.0  # how often a reminder is said while it is
PAUSE_S = 0.5  # between two tries

_outages: dict[str, Outage] = {}
_lock = threading.Lock()


class Outage:
    """What the log says of one Redis being unreachable (see the module); ``now`` is given."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.since: float | None = None  # when it stopped answering (None: it answers)
        self.said = 0.0  # when a line was last said of it
        self.lock = threading.Lock()

    def failed(self, exc: BaseException, now: float, left_s: float) -> None:
        with self.lock:
            if self.since is None:
                self.since = self.said = now
                logger.warning("%s: Redis is unreachable (%s): the job keeps trying for %.0f s, then stops (what its "
                               "last checkpoint holds is kept: --resume goes on from there)", self.url, exc,
                               max(left_s, 0.0))
            elif now - self.said >= REMIND_S:
                self.said = now
                logger.warning("%s: Redis still unreachable after %.0f s (%s): %.0f s left before the job stops",
                               self.url, now - self.since, exc, max(left_s, 0.0))

    def answered(self, now: float) -> None:
        if self.since is None:  # the common case, without the lock
            return
        with self.lock:
            if self.since is not None:
                logger.info("%s: Redis is back, after %.1f s unreachable", self.url, now - self.since)
                self.since = None


def outage(url: str) -> Outage:
    """The process's ``Outage`` of ``url``."""
    with _lock:
        return _outages.setdefault(url, Outage(url))


def retrying(url: str, what: str, fn: Callable[..., Any], *args: Any, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep, **kw: Any) -> Any:
    """``fn(*args, **kw)``, a Redis call, retried while Redis is unreachable (a restart), up to
    ``RETRY_S``; then a ``DataError`` saying so."""
    import redis

    state = outage(url)
    deadline = clock() + RETRY_S
    while True:
        try:
            out = fn(*args, **kw)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            now = clock()
            if now >= deadline:
                raise DataError(f"{url}: Redis did not answer {what} for {RETRY_S:g} s ({exc}); the job stopped, "
                                "and what its last checkpoint holds is kept: --resume goes on from there") from None
            state.failed(exc, now, deadline - now)
            sleep(PAUSE_S)
            continue
        state.answered(clock())
        return out
