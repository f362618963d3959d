"""Issue 47's short campaign: real scheduler and server processes and a real client, each on an
emulated host (a network namespace on a bridge), through every kind of fault once, then a seeded
mix; every acknowledged add must be there exactly once after the heal, no add may wait out its
deadline, and adds must be acknowledged again after each heal.  (The long campaign is
``paramserver nemesis --seeds 100``.)"""

from __future__ import annotations

import os

import pytest

from paramserver.testing.nemesis.hosts import missing
from paramserver.testing.nemesis.plan import KINDS, Fault, Plan, draw
from paramserver.testing.nemesis.run import run

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(os.geteuid() != 0, reason="emulated hosts need root (network namespaces)")]


def _passes(plan: Plan) -> None:
    out = run(plan)
    s = out.summary()
    assert out.verdict.ok, f"{s['violations']} (logs: {out.folder}; events: {out.events})"
    assert min(s["acked"].values()) > 50, s  # the counters did move
    timed = [g for g in s["recovery_s"] if g is not None]  # None: the next fault began first
    assert len(timed) >= len(s["recovery_s"]) / 2 and max(timed) <= 5.0, s["recovery_s"]  # issue 47's bound


def test_the_machine_can_make_emulated_hosts():
    assert missing() is None  # make test installs nftables; root is checked above


def test_every_kind_of_fault_once_loses_no_acknowledged_add_and_hangs_nothing():
    faults = []
    t = 1.0
    for kind in KINDS:
        hosts = {"halves": (0, 2), "isolate-client": (4,), "scheduler-cut": (0,)}.get(kind, (1 + len(faults) % 3,))
        duration = 7.0 if kind in ("isolate", "pause") else 3.0  # past the heartbeat timeout: a failover
        faults.append(Fault(t, kind, hosts, duration, 20 if kind == "loss" else 0))
        t += duration + 2.0
    _passes(Plan(0, 3, tuple(faults)))


def test_a_seeded_mix_of_faults():
    _passes(draw(47, servers=3, window_s=12.0, longest_s=5.0))
