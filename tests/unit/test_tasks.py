"""The task queue: each shard once per epoch, epochs in order, shards of the dead requeued."""

import pytest

from paramserver import ConfigError
from paramserver.scheduler.tasks import TaskQueue

SHARDS = [["a", 0, 10], ["a", 10, 20], ["b", 0, -1]]


def test_every_shard_once_per_epoch_and_epochs_in_order():
    q = TaskQueue(SHARDS, epochs=2)
    seen = []
    held = {}
    for node in (1, 2, 1, 2, 1, 2, 1, 2):
        task = q.next_shard(node)
        if task is None:  # epoch 0 not finished: finish what is held, then ask again
            for n, t in list(held.items()):
                q.shard_done(n, t["shard_id"], t["epoch"], {"examples": 5})
                seen.append((t["epoch"], t["shard_id"]))
                del held[n]
            task = q.next_shard(node)
        if task.get("done"):
            break
        if node in held:
            t = held.pop(node)
            q.shard_done(node, t["shard_id"], t["epoch"], {"examples": 5})
            seen.append((t["epoch"], t["shard_id"]))
        held[node] = task
    for n, t in held.items():
        q.shard_done(n, t["shard_id"], t["epoch"], {"examples": 5})
        seen.append((t["epoch"], t["shard_id"]))
    assert sorted(seen) == [(e, s) for e in (0, 1) for s in range(3)]
    assert q.finished and q.next_shard(1) == {"done": True}
    assert q.status()["examples"] == 30 and q.status()["epoch_examples"] == [15, 15]


def test_a_dead_workers_shards_go_back_first():
    q = TaskQueue(SHARDS, epochs=1)
    first = q.next_shard(7)
    assert q.release(7) == [first["shard_id"]]
    assert q.next_shard(8)["shard_id"] == first["shard_id"]
    with pytest.raises(ConfigError, match="not held by node 7"):
        q.shard_done(7, first["shard_id"], 0, {})


def test_bad_jobs_are_refused():
    with pytest.raises(ConfigError, match="at least one shard"):
        TaskQueue([], 1)
    with pytest.raises(ConfigError, match="epochs must be >= 1"):
        TaskQueue(SHARDS, 0)
