"""The scheduler's silence as a client sees it: heard, lost, or dead.

The scheduler answers every heartbeat.  Silent past the heartbeat timeout it is **lost**
(``lost``): the data plane's calls then fail at their deadline, or at once when its process is
known to be gone (``core.decide``).  What waits on the scheduler itself (a shard, a job's status,
a barrier) waits on: it holds the cluster's only control state, so, as a server holding a last
copy is, it is waited for up to ``last_copy_timeout_s`` (a paused or cut-off scheduler comes back
and answers what was sent meanwhile; found by the nemesis's training job, a scheduler paused 7 s).
Past that, or at the heartbeat timeout when its process is known to be gone (this machine's,
exited: ``wire/liveness.py``), it is **dead** (``check``): what waits on it fails instead of
waiting for ever.  Once it answers again it is neither (``heard``).  The client's I/O thread
owns one; this is its clock and bookkeeping, with no sockets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from paramserver.config import Config
from paramserver.wire.liveness import process_alive

logger = logging.getLogger("paramserver.client.io_thread")  # the I/O thread's log


class SchedulerWatch:
    def __init__(self, address: str, config: Config, clock: Callable[[], float]) -> None:
        self.address, self.config, self.clock = address, config, clock
        self.seen = clock()  # when it was last heard from
        self.silent = False  # past the heartbeat timeout
        self.dead = False  # past the grace: declared dead
        self.process = ""  # its process, as its welcome said (``liveness.process_alive``)

    @property
    def lost(self) -> bool:
        return self.silent or self.dead

    @property
    def grace_s(self) -> float:
        """How long a silent scheduler is waited for (the module's docstring)."""
        if process_alive(self.process) is False:
            return self.config.heartbeat_timeout_s
        return max(self.config.heartbeat_timeout_s, self.config.last_copy_timeout_s)

    def restart(self) -> None:
        """Heartbeats begin: its silence is counted from now."""
        self.seen = self.clock()

    def heard(self) -> bool:
        """It sent something: whether it had been lost (calls to it go through again)."""
        self.seen = self.clock()
        back, self.silent, self.dead = self.lost, False, False
        if back:
            logger.warning("the scheduler at %s answers again: calls to it go through again", self.address)
        return back

    def check(self) -> bool:
        """At a heartbeat: whether it is to be declared dead now (once)."""
        silent = self.clock() - self.seen
        if silent > self.config.heartbeat_timeout_s and not self.silent:
            self.silent = True
            logger.warning("the scheduler at %s has been silent for %.1f s: calls to it wait up to %g s for it",
                           self.address, silent, self.grace_s)
        if silent > self.grace_s and not self.dead:
            self.dead = True
            logger.error("the scheduler at %s has been silent for %.1f s: declared dead", self.address, silent)
            return True
        return False
