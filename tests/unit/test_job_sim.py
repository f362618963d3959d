"""The scheduler's job (``scheduler/jobs.py``) driven by a seeded simulation: workers
that ask ahead, finish, die mid-shard and join; checkpoints whose servers answer, fail or
are lost.  After every step: no shard is held by a worker that is gone, and a checkpoint
is only ever written at a boundary (no shard running); at the end, every example of
every epoch is counted exactly once.  No sockets, no sleeps: a few hundred seeds run in
a second or two, and a failing seed replays exactly.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from paramserver.routing.ring import Ring
from paramserver.scheduler.fanout import FanOut
from paramserver.scheduler.jobs import Jobs
from paramserver.wire.message import Message, decode, encode

SIZES = [3, 5, 7, 11, 13, 17]  # examples per shard


class _Host:
    """The scheduler around ``Jobs``: answers are decoded and kept, fan-outs held."""

    def __init__(self) -> None:
        self.ring = Ring.create([1], 4)
        self.tables: dict[str, Any] = {}
        self.losses: list[dict[str, Any]] = []
        self.failovers: list[dict[str, Any]] = []
        self.answers: list[tuple[bytes, Message]] = []
        self.fanouts: list[tuple[dict[str, Any], Any]] = []
        self.jobs: Jobs | None = None
        self.idle: set[int] = set()  # workers the servers were told to stop following (idle), not answered since
        self.answered_busy = 0  # shards handed to workers that asked while they held one: no rejoin needed

    def answer(self, identity: bytes, frames: list[Any]) -> None:
        self.answers.append((identity, decode([bytes(f) for f in frames])))

    def fan_out(self, header: dict[str, Any], on_done: Any, timeout_s: float) -> int:
        assert self.jobs is not None and self.jobs.job is not None
        assert not self.jobs.job.running, "a checkpoint started while shards were running"
        self.fanouts.append((header, on_done))
        return len(self.fanouts)

    def workers_changed(self) -> None:  # as the scheduler's: the servers follow the workers not idle
        assert self.jobs is not None
        self.idle |= self.jobs.idle_workers()

    def handed(self, worker: int, msg: Message) -> None:
        """A shard handed to ``worker``: a worker the servers stopped following must rejoin
        their clocks (``rejoin``); one they always followed need not ask them."""
        if worker in self.idle:
            assert msg.header.get("rejoin") is True, f"worker {worker} left the clocks and is not told to rejoin"
            self.idle.discard(worker)
        elif msg.header.get("rejoin") is False:
            self.answered_busy += 1


def _msg(header: dict[str, Any]) -> Message:
    return decode([bytes(f) for f in encode(header)])


def _simulate(seed: int, tmp_path, epochs: int = 2) -> dict[str, Any]:
    rng = random.Random(seed)
    host = _Host()
    jobs = host.jobs = Jobs(host)
    shards = [[f"s{i}", 0, size] for i, size in enumerate(SIZES)]
    checkpoint = {"url": str(tmp_path / f"ckpt-{seed}"), "every": rng.choice([1, 2, 4])} if rng.random() < 0.5 \
        else None
    jobs.start(b"driver", _msg({"op": "job_start", "id": 1, "shards": shards, "epochs": epochs,
                                **({"checkpoint": checkpoint} if checkpoint else {})}))
    live: set[int] = {10, 11}
    next_worker, asked, held = 12, {w: 0 for w in live}, {w: [] for w in live}
    counted: list[tuple[int, int]] = []  # (epoch, shard) of every shard_done sent
    rid = 100
    for _ in range(2000):
        job = jobs.job
        assert job is not None
        if job.finished:
            break
        for identity, msg in host.answers:  # shards handed out (the rest: acknowledgements)
            w = int(identity[1:]) if identity.startswith(b"w") else -1
            if msg.header.get("shard_id") is not None and w in live:
                host.handed(w, msg)
                held[w].append((msg.header["shard_id"], msg.header["epoch"]))
                asked[w] -= 1
        host.answers.clear()
        assert all(job.running[s] in live for s in job.running), "a shard is held by a worker that is gone"
        event = rng.random()
        workers = sorted(live)
        if host.fanouts and event < 0.15:  # the servers answer a checkpoint: written, failed or lost
            header, on_done = host.fanouts.pop(0)
            fate = rng.choice(["ok", "error", "lost"])
            op = FanOut(on_done, set(), 0.0)
            if fate == "ok":
                op.replies[1] = {"files": {}, "clocks": {}}
            elif fate == "error":
                op.errors[1] = "disk full"
            else:
                op.lost.add(1)
            on_done(op)
        elif event < 0.45 and workers:  # a worker asks for a shard (at most one ahead of the one it holds)
            w = rng.choice(workers)
            if asked[w] == 0 and len(held[w]) <= 1:
                rid += 1
                asked[w] += 1
                jobs.next_shard(b"w%d" % w, _msg({"op": "next_shard", "id": rid}), w)
        elif event < 0.85 and workers:  # a worker finishes the oldest shard it holds
            w = rng.choice(workers)
            if held[w]:
                sid, epoch = held[w].pop(0)
                rid += 1
                jobs.shard_done(b"w%d" % w, _msg({"op": "shard_done", "id": rid, "shard_id": sid, "epoch": epoch,
                                                 "stats": {"examples": SIZES[sid]}}), w)
                counted.append((epoch, sid))
        elif event < 0.93 and len(workers) > 1:  # a worker dies, with whatever it holds
            w = rng.choice(workers)
            live.discard(w)
            jobs.node_removed(w, "worker")
            jobs.maybe_checkpoint()
        else:  # a worker joins
            live.add(next_worker)
            asked[next_worker], held[next_worker] = 0, []
            next_worker += 1
    job = jobs.job
    assert job is not None and job.finished, f"seed {seed}: the job did not finish in 2000 steps"
    return {"job": job, "counted": counted, "checkpoints": jobs.checkpoints, "answered_busy": host.answered_busy}


@pytest.mark.parametrize("seed", range(300))
def test_every_example_is_counted_once_per_epoch_whatever_the_workers_do(seed, tmp_path):
    result = _simulate(seed, tmp_path)
    job = result["job"]
    assert job.epoch_examples == [sum(SIZES)] * 2, (seed, job.epoch_examples)
    assert job.totals["examples"] == 2 * sum(SIZES)
    assert sorted(result["counted"]) == sorted((e, s) for e in range(2) for s in range(len(SIZES)))


def test_a_worker_that_asked_while_it_held_a_shard_is_not_told_to_rejoin(tmp_path):
    """The question to every server that rejoining costs is asked only by a worker that may
    have left the clocks: across the seeds, shards go to busy workers without it."""
    assert sum(_simulate(seed, tmp_path)["answered_busy"] for seed in range(20)) > 0


def test_the_simulation_catches_a_worker_not_told_to_rejoin(tmp_path, monkeypatch):
    """Break the scheduler's memory of which workers went idle: some seed must say so."""
    def forgetful(self):
        busy = set(self.job.running.values()) if self.job is not None else set()
        return {w[2] for w in self.waiters} - busy

    monkeypatch.setattr(Jobs, "idle_workers", forgetful)
    failures = 0
    for seed in range(100):
        try:
            _simulate(seed, tmp_path)
        except AssertionError as exc:
            assert "not told to rejoin" in str(exc)
            failures += 1
    assert failures > 0


def test_the_same_seed_replays_the_same_run(tmp_path):
    a, b = _simulate(7, tmp_path / "a"), _simulate(7, tmp_path / "b")
    assert a["counted"] == b["counted"]


def test_checkpoints_are_written_abandoned_and_skipped_across_the_seeds(tmp_path):
    """The seeds reach every checkpoint path: some written, some abandoned."""
    written = abandoned = 0
    for seed in range(60):
        ckpt = _simulate(seed, tmp_path)["checkpoints"]
        if ckpt is not None:
            written += len(ckpt.written)
            abandoned += ckpt.abandoned
    assert written > 0 and abandoned > 0, (written, abandoned)


def _lose_shards(queue, node_id):  # a dead worker's shards are forgotten, not put back
    lost = [sid for sid, n in queue.running.items() if n == node_id]
    for sid in lost:
        del queue.running[sid]
    return lost


def _keep_running(queue, node_id):  # put back, but still listed as running
    lost = [sid for sid, n in queue.running.items() if n == node_id]
    queue.todo.extendleft(lost)
    return lost


@pytest.mark.parametrize("mutation", [_lose_shards, _keep_running])
def test_the_simulation_catches_a_broken_requeue(mutation, tmp_path, monkeypatch):
    """A check that cannot fail checks nothing: break how a dead worker's shards go back
    to the queue, and some seed must say so."""
    from paramserver.scheduler.tasks import TaskQueue

    monkeypatch.setattr(TaskQueue, "release", mutation)
    failures = 0
    for seed in range(100):
        try:
            test_every_example_is_counted_once_per_epoch_whatever_the_workers_do(seed, tmp_path)
        except AssertionError:
            failures += 1
    assert failures > 0


def test_a_failed_checkpoint_is_removed_and_tried_again_at_the_next_boundary(tmp_path):
    """Issue 28.7: a checkpoint that failed (a full disk) left its partial files, which made
    the next one fail too, and waited ``every`` more shards.  Its step is removed, and the
    next shard done brings the next attempt; after RETRIES failures in a row, the usual
    interval again."""
    import os

    from paramserver.scheduler.jobs import RETRIES

    host = _Host()
    jobs = host.jobs = Jobs(host)
    url = str(tmp_path / "ckpt")
    shards = [[f"s{i}", 0, 3] for i in range(20)]
    jobs.start(b"driver", _msg({"op": "job_start", "id": 1, "shards": shards, "epochs": 1,
                                "checkpoint": {"url": url, "every": 4}}))

    def one_shard(rid: int) -> None:
        jobs.next_shard(b"w10", _msg({"op": "next_shard", "id": rid}), 10)
        (msg,) = [m for _, m in host.answers if m.header.get("shard_id") is not None]
        host.answers.clear()
        jobs.shard_done(b"w10", _msg({"op": "shard_done", "id": rid + 1, "shard_id": msg.header["shard_id"],
                                      "epoch": 0, "stats": {"examples": 3}}), 10)

    for rid in range(0, 8, 2):  # 4 shards: the first checkpoint starts
        one_shard(100 + rid)
    for attempt in range(RETRIES + 1):
        assert len(host.fanouts) == 1, f"attempt {attempt}: no checkpoint started"
        header, on_done = host.fanouts.pop(0)
        os.makedirs(f"{header['url']}/t")  # a server wrote part of it, then the disk was full
        open(f"{header['url']}/t/0.npz", "wb").close()
        op = FanOut(on_done, set(), 0.0)
        op.errors[1] = "CheckpointError: No space left on device"
        on_done(op)
        assert not os.path.exists(header["url"]), "the abandoned step's files stay"
        one_shard(200 + 2 * attempt)  # the next boundary
    assert not host.fanouts, "a fourth failure in a row is retried at once, not after `every` shards"
    ckpt = jobs.checkpoints
    assert ckpt is not None and ckpt.abandoned == RETRIES + 1 and ckpt.since == 1
