"""A server's lease: it serves clients only while the scheduler could not yet have
declared it dead.

The scheduler declares a server dead once it has heard nothing from it for
``heartbeat_timeout_s``, and then promotes its backups.  A server that was paused (SIGSTOP,
swap, a long GC) or cut off from the scheduler does not know that; before leases it went
on answering the clients that still routed to it, with values its promoted backups had
moved past (up to 43 stale answers in a test), until a heartbeat reply told it that it
was dead, and for ever if none came.

A heartbeat sent at ``t`` (this server's monotonic clock) and answered by the scheduler
was received at or after ``t``, so the scheduler will not declare this server dead before
``t + heartbeat_timeout_s`` (its clock runs at the same rate; a stalled scheduler only
moves its deadlines later).  The lease therefore runs to ``t + fraction * timeout`` for
the newest answered beat: the rest of the timeout is the margin for clock-rate skew and
the request in hand.  Past it the server refuses pulls and pushes with a stale-ring
error (clients refresh their view of the ring and retry; nothing is applied, so nothing
is lost) until an answer renews the lease, or the scheduler says the server is dead.

A scheduler that does not answer for ``scheduler_gone_s`` (60 s, or 12 heartbeat timeouts
if longer) is gone for good: no new scheduler can adopt a server, so the server stops
instead of running on for ever (servers left behind by a killed scheduler, or by Ctrl-C on
a hand-started one).  A stalled scheduler (a pause of seconds) is well within it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

LEASE_FRACTION = 0.75  # of heartbeat_timeout_s
SCHEDULER_GONE_S = 60.0


def scheduler_gone_s(config: Any) -> float:
    """Silence of the scheduler after which a server stops: it is gone for good."""
    return max(SCHEDULER_GONE_S, 12 * float(config.heartbeat_timeout_s))
_REMEMBERED = 64  # beats awaiting an answer (older ones can only grant shorter leases)


class Lease:
    """Grants from the scheduler's answers; ``valid()`` says whether to serve now."""

    def __init__(self, heartbeat_timeout_s: float, fraction: float = LEASE_FRACTION,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.length = fraction * heartbeat_timeout_s
        self._clock = clock
        self._until = -math.inf
        self._seq = 0
        self._sent: dict[int, float] = {}  # beat number -> when it was sent
        # times the lease ran out and came back: the scheduler's messages of that time may be
        # lost (a cut link), so each beat says it (``Membership.server_returned`` resyncs)
        self.regained = 0

    def granted(self, sent_at: float) -> None:
        """The scheduler answered a message this server sent at ``sent_at``."""
        lapsed = self._until > -math.inf and not self.valid()
        self._until = max(self._until, sent_at + self.length)
        if lapsed and self.valid():
            self.regained += 1

    def beat(self) -> int:
        """A heartbeat goes out now: its number, for the scheduler to echo."""
        self._seq += 1
        self._sent[self._seq] = self._clock()
        if len(self._sent) > _REMEMBERED:
            del self._sent[min(self._sent)]
        return self._seq

    def answered(self, seq: object) -> None:
        """The scheduler echoed beat ``seq`` (anything else is ignored)."""
        if isinstance(seq, int) and not isinstance(seq, bool) and seq in self._sent:
            self.granted(self._sent[seq])
            for old in [s for s in self._sent if s <= seq]:
                del self._sent[old]

    def valid(self) -> bool:
        return self._clock() < self._until

    def expired_for(self) -> float:
        """Seconds since the lease ran out (0 while it runs)."""
        return max(0.0, self._clock() - self._until)
