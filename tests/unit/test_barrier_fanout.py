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


@pytest.mark.parametrize("seed", range(100))
def test_numbered_barriers_release_each_round_once_when_every_live_worker_reached_it(seed):
    """SSP rounds: workers arrive at rounds ahead of one another (up to 3 ahead), some
    die; each round is released exactly once, with exactly the requests made for it,
    as soon as every live worker has arrived there, and the plain barrier is apart."""
    rng = random.Random(seed)
    workers = rng.randint(1, 5)
    live, at = set(range(workers)), {w: 0 for w in range(workers)}  # the next round each will arrive at
    barrier, made, released = Barrier(), {}, set()
    for step in range(300):
        slowest = min(at[w] for w in live)
        movers = [w for w in sorted(live) if at[w] < slowest + 3]
        if rng.random() < 0.05 and len(live) > 1:
            w = rng.choice(sorted(live))
            live.discard(w)
            barrier.drop(w)
            for g in made:
                made[g] = {(i, q) for i, q in made[g] if i != b"w%d" % w}
        elif movers:
            w = rng.choice(movers)
            barrier.arrive(b"w%d" % w, (w, at[w]), w, float(step), generation=at[w])
            made.setdefault(at[w], set()).add((b"w%d" % w, (w, at[w])))
            at[w] += 1
        for g in barrier.complete(len(live)):
            out = barrier.release(len(live), g)
            assert g not in released and set(out) == made[g], (seed, step, g)
            released.add(g)
        # released exactly the rounds every live worker has passed (and that anyone arrived at)
        assert released == {g for g in made if made[g] and all(at[w] > g for w in live)}, (seed, step)
        assert barrier.release(len(live)) == []  # nobody is at the plain barrier


def test_the_plain_barrier_and_a_round_are_released_apart():
    barrier = Barrier()
    barrier.arrive(b"a", 1, 1, 0.0, generation=7)
    barrier.arrive(b"a", 2, 1, 0.0)
    assert barrier.complete(2) == [] and barrier.release(2) == []
    barrier.arrive(b"b", 3, 2, 0.0)
    assert barrier.complete(2) == [None] and barrier.release(2) == [(b"a", 2), (b"b", 3)]
    barrier.drop(2)
    assert barrier.complete(1) == [7] and barrier.release(1, 7) == [(b"a", 1)]
    assert barrier.missing(100.0, {1: 0}, 1) is None  # nothing open
