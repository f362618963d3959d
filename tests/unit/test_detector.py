"""The failure detector: a silent server that holds the last complete copy of some
vnodes is fenced and waited for, not written off at the heartbeat timeout; and the
liveness probe that lets the scheduler skip the wait for a process known to be gone."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np

from paramserver.routing.ring import Ring
from paramserver.scheduler.detector import Detector
from paramserver.scheduler.membership import Membership, NodeInfo
from paramserver.tables.spec import TableSpec
from paramserver.wire.liveness import process_alive, process_token


class Host:
    """What ``Detector`` and ``Membership`` read of a scheduler."""

    def __init__(self, replicas: int, alive: bool | None = None) -> None:
        from paramserver.config import Config

        self.config = Config(heartbeat_timeout_s=5.0, last_copy_timeout_s=30.0)
        self.nodes = {i: NodeInfo(i, "server", b"%d" % i, f"tcp://127.0.0.1:{7000 + i}", 0.0) for i in (1, 2, 3)}
        self.tables = {"w": TableSpec("w", replicas=replicas)}
        self.membership = Membership(self, 4, 3)
        self.membership.ring = Ring.create([1, 2, 3], 4)
        self._alive = alive

    def alive(self, process: str) -> bool | None:
        return self._alive

    def clock(self) -> float:
        return 0.0


def silent(host: Host, server: int, since: float) -> None:
    for node in host.nodes.values():
        node.last_seen = 100.0
    host.nodes[server].last_seen = since


def test_a_silent_server_with_complete_backups_is_dead_at_the_heartbeat_timeout():
    host = Host(replicas=2)
    silent(host, 2, since=94.0)
    assert Detector(host).dead(100.0, set()) == [2]


def test_a_silent_server_holding_last_copies_is_fenced_until_the_last_copy_timeout():
    host = Host(replicas=1)  # every server holds the only copy of its vnodes
    detector = Detector(host)
    silent(host, 2, since=90.0)
    assert detector.dead(100.0, set()) == []  # silent 10 s: fenced, waited for
    assert 2 in detector.fenced
    assert detector.dead(119.9, set()) == []
    assert detector.dead(120.5, set()) == [2]  # 30.5 s: written off, loudly


def test_a_fenced_server_that_beats_again_is_unfenced():
    host = Host(replicas=1)
    detector = Detector(host)
    silent(host, 3, since=90.0)
    assert detector.dead(100.0, set()) == []
    host.nodes[3].last_seen = 101.0  # it answered
    assert detector.dead(102.0, set()) == [] and not detector.fenced


def test_a_server_whose_process_is_gone_is_dead_at_once():
    host = Host(replicas=1, alive=False)
    silent(host, 1, since=94.0)
    assert Detector(host).dead(100.0, set()) == [1]


def test_backups_still_being_copied_do_not_count_as_complete():
    host = Host(replicas=2)
    m = host.membership
    ring = m.ring
    assert ring is not None
    v = int(np.flatnonzero(ring.chains[:, 0] == 2)[0])
    backup = int(ring.chains[v, 1])
    m.incomplete.add(("w", v, backup))  # the repair has not confirmed this copy yet
    assert m.last_copies(2) == {"w": [v]}
    silent(host, 2, since=94.0)
    assert Detector(host).dead(100.0, set()) == []


def _child() -> subprocess.Popen[bytes]:
    """A process that lives until its standard input closes."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_liveness_tells_a_running_process_from_a_dead_one():
    token = process_token()
    assert process_alive(token) is True
    child = _child()
    other = process_token(child.pid)
    assert process_alive(other) is True
    assert child.stdin is not None
    child.stdin.close()
    child.wait(10)
    assert process_alive(other) is False  # exited and reaped
    assert process_alive("") is None and process_alive(None) is None
    assert process_alive("linux:another-machine/pid:[1]:1:1") is None  # cannot tell: may be alive
    pid, start = token.rsplit(":", 2)[1:]
    recycled = token[: -len(f"{pid}:{start}")] + f"{pid}:{int(start) + 1}"
    assert process_alive(recycled) is False  # same pid, another start time: not that process


def test_a_zombie_counts_as_gone():
    child = _child()
    token = process_token(child.pid)
    assert child.stdin is not None
    child.stdin.close()
    try:
        deadline = time.monotonic() + 10
        while _state(child.pid) != "Z" and time.monotonic() < deadline:  # exited, not reaped yet
            time.sleep(0.01)
        assert _state(child.pid) == "Z"
        assert process_alive(token) is False
    finally:
        child.wait(10)
