"""A process's end, as far as ZeroMQ is concerned: what its sockets still hold is delivered.

A socket closed with a linger (the scheduler's, right after it queued the reply to SHUTDOWN
and the STOPs) hands its queue to ZeroMQ's I/O thread, which sends it on until the linger
runs out, or until the process ends, whichever comes first.  Python's own exit does not wait
for it (pyzmq leaves the shared context alone once exiting, so as not to hang), and a process
that ends with ``os._exit`` (``cli/main.command``, a forked node) ends it at once: the reply
was lost whenever the I/O thread had not been scheduled by then (found by CI: a driver's
``shutdown_cluster`` that waited for a scheduler already gone).

``deliver_queued`` ends the process's shared context in a thread of its own and waits for it,
a bounded time: ``term`` returns once every socket is closed and what each holds is sent or
its linger ran out.  A thread blocked on a socket of it (the ZAP handler's) is woken with
ETERM and closes its socket; a socket nobody closes holds ``term`` to the bound, no longer.
``term`` and not ``destroy``: ``destroy`` closes every socket from the calling thread, under
the threads still reading them, which aborts the process.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

END_S = 1.0  # the longest a process's end waits for ZeroMQ (the scheduler's linger is 0.5 s)


def deliver_queued(timeout_s: float = END_S) -> bool:
    """Send what this process's sockets still hold, within ``timeout_s``; whether ZeroMQ's
    context ended in time (True too where this process made none)."""
    zmq: Any = sys.modules.get("zmq")  # a command that never imported it has nothing queued
    if zmq is None:
        return True
    ctx = getattr(zmq.Context, "_instance", None)
    if ctx is None or ctx.closed or getattr(zmq.Context, "_instance_pid", os.getpid()) != os.getpid():
        return True  # none, or the parent's (a forked child's copy is not its own to end)
    ender = threading.Thread(target=_term, args=(ctx,), name="paramserver-zmq-end", daemon=True)
    ender.start()
    ender.join(timeout_s)
    return not ender.is_alive()


def _term(ctx: Any) -> None:
    try:
        ctx.term()
    except Exception:  # an interrupted term: the process ends all the same
        pass
