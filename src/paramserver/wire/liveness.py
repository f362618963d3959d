"""Is a node's process still there?  What a failure detector may know besides silence.

A heartbeat timeout cannot tell a dead process from a slow one (a JIT compile, a long
collection, a swapped-out VM, a SIGSTOP).  For most nodes that does not matter: one
declared dead by mistake is told so and stops, and its backups serve on.  For a server
that holds the last complete copy of some vnodes it is the difference between a pause and
lost data, so the scheduler waits longer for it (``scheduler/detector.py``), unless it
knows the process is gone.

It knows that when the node runs on the same machine and in the same PID namespace: the
node says at registration who it is (``process_token``: the boot's id, the PID
namespace, its pid and its start time, so that a recycled pid is not taken for it), and
``process_alive`` looks the pid up in ``/proc``.  Anywhere else (another machine, another
container, not Linux) the answer is ``None``: it may be alive.
"""

from __future__ import annotations

import functools
import os

_PROC = "/proc"


@functools.cache
def _machine() -> str:
    """This boot of this machine and this PID namespace, or "" where /proc cannot say."""
    try:
        with open(os.path.join(_PROC, "sys/kernel/random/boot_id")) as f:
            boot = f.read().strip()
        pidns = os.readlink(os.path.join(_PROC, "self/ns/pid"))
    except OSError:
        return ""
    return f"{boot}/{pidns}"


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of ``pid``, or None if no such process."""
    try:
        with open(os.path.join(_PROC, str(pid), "stat")) as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    return (fields[0], fields[19]) if len(fields) > 19 else None


def process_token(pid: int | None = None) -> str:
    """Who this process (or ``pid``) is, for ``process_alive`` on another process of the same
    machine: "" where it cannot be told."""
    machine = _machine()
    pid = os.getpid() if pid is None else pid
    stat = _stat(pid) if machine else None
    return f"linux:{machine}:{pid}:{stat[1]}" if stat else ""


def process_alive(token: object) -> bool | None:
    """False if the process ``token`` names is certainly gone (exited, a zombie, or its pid
    now another process's); True if it runs; None if this process cannot tell (another
    machine or PID namespace, no token)."""
    if not isinstance(token, str) or not token.startswith("linux:"):
        return None
    machine, _, rest = token[len("linux:"):].rpartition(":")  # machine:pid:start, machine has a colon
    machine, _, pid = machine.rpartition(":")
    if not machine or machine != _machine() or not pid.isdigit():
        return None
    stat = _stat(int(pid))
    if stat is None or stat[1] != rest:
        return False
    return stat[0] not in ("Z", "X")  # a zombie has exited; only its parent has not reaped it
