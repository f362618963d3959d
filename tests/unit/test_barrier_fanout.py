"""The scheduler's barrier and fan-outs (sans-IO) under seeded random events: a barrier
releases exactly the workers waiting, only once all the ones taking part are there; a
fan-out finishes exactly once, with every server it was sent to answered, errored or lost."""

from __future__ import annotations

import random

import pytest

from paramserver.scheduler.barrier import Barrier
from paramserver.scheduler.fanout import FanOuts
from paramserver.wire.message import Message


def _barrier_run(seed: int) -> int:
    """200 random steps; the number of releases."""
    rng = random.Random(seed)
    barrier, live, waiting, releases = Barrier(), set(range(rng.randint(1, 6))), set(), 0
    for step in range(200):
        event = rng.random()
        if event < 0.6 and live - waiting:
            w = rng.choice(sorted(live - waiting))
            barrier.arrive(b"w%d" % w, step, w, float(step))
            waiting.add(w)
        elif event < 0.7 and len(live) > 1:
            w = rng.choice(sorted(live))
            live.discard(w)
            waiting.discard(w)
            barrier.drop(w)
        elif event < 0.8:
            live.add(max(live, default=0) + 1)
        out = barrier.release(len(live))
        if waiting and waiting == live:
            assert sorted(int(i[1:]) for i, _ in out) == sorted(waiting), (seed, step)
            releases += 1
            waiting.clear()
        else:
            assert out == [], (seed, step, waiting, live)
    return releases


@pytest.mark.parametrize("seed", range(200))
def test_a_barrier_releases_everyone_once_and_only_when_all_are_there(seed):
    _barrier_run(seed)


def test_the_barrier_runs_release_often():
    assert sum(_barrier_run(seed) for seed in range(50)) >= 50  # the release path is exercised, not skipped


@pytest.mark.parametrize("seed", range(200))
def test_a_fan_out_finishes_once_with_every_server_accounted_for(seed):
    rng = random.Random(seed)
    sent: list[tuple[int, dict]] = []
    fanouts = FanOuts(lambda server, header: sent.append((server, header)))
    done = []
    servers = list(range(1, rng.randint(1, 5) + 1))
    op_id = fanouts.start({"op": "checkpoint", "url": "u"}, servers, done.append, now=0.0, timeout_s=10.0)
    assert sorted(s for s, _ in sent) == servers and all(h["id"] == op_id for _, h in sent)
    pending = list(servers)
    rng.shuffle(pending)
    now = 0.0
    while pending and not done:
        server = pending.pop()
        event = rng.random()
        if event < 0.4:
            fanouts.answered(server, Message({"op": "ok", "id": op_id}, []))
            fanouts.answered(server, Message({"op": "ok", "id": op_id}, []))  # a duplicate changes nothing
        elif event < 0.6:
            fanouts.answered(server, Message({"op": "error", "id": op_id, "error": "disk full"}, []))
        elif event < 0.8:
            fanouts.node_lost(server)
        else:
            now += rng.choice([1.0, 20.0])  # maybe past the deadline: every silent server is given up on
            fanouts.expire(now)
            pending.append(server)
    if not done:
        fanouts.expire(1e9)
    (op,) = done
    assert not op.waiting and set(op.replies) | set(op.errors) | op.lost == set(servers)
    assert not set(op.replies) & set(op.errors) and not (set(op.replies) | set(op.errors)) & op.lost
    assert op_id not in fanouts.open
