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


def drain(q, node=1, stop_after=None):
    """Run shards on ``node`` one at a time; return (epoch, shard) pairs done."""
    seen = []
    while stop_after is None or len(seen) < stop_after:
        task = q.next_shard(node)
        if task.get("done"):
            break
        q.shard_done(node, task["shard_id"], task["epoch"], {"examples": 10 + task["shard_id"],
                                                              "loss_sum": 1.5})
        seen.append((task["epoch"], task["shard_id"]))
    return seen


@pytest.mark.parametrize("stop_after", [0, 1, 2, 3, 4, 5])
def test_a_snapshot_resumes_where_it_left_off_with_its_totals(stop_after):
    q = TaskQueue(SHARDS, epochs=2)
    before = drain(q, stop_after=stop_after)
    running = q.next_shard(2)  # running shards are not done: a resumed job does them again
    snap = q.snapshot()
    assert snap["done"] == sorted(s for e, s in before if e == snap["epoch"])
    resumed = TaskQueue.resume(SHARDS, 2, snap)
    assert resumed.status()["examples"] == q.status()["examples"]
    after = drain(resumed, node=9)
    assert sorted(before + after) == [(e, s) for e in (0, 1) for s in range(3)]  # each once per epoch
    assert (running["epoch"], running["shard_id"]) in after
    status = resumed.status()
    assert status["finished"] and status["examples"] == 2 * (10 + 11 + 12)
    assert status["loss_sum"] == 6 * 1.5 and status["epoch_examples"] == [33, 33]


def test_bad_progress_is_refused():
    with pytest.raises(ConfigError, match="in epoch 2 .* has 2 epoch"):
        TaskQueue.resume(SHARDS, 2, {"epoch": 2, "done": []})
    with pytest.raises(ConfigError, match="distinct shard ids in \\[0, 3\\)"):
        TaskQueue.resume(SHARDS, 2, {"epoch": 0, "done": [1, 1]})
    with pytest.raises(ConfigError, match="distinct shard ids"):
        TaskQueue.resume(SHARDS, 2, {"epoch": 0, "done": [3]})
    with pytest.raises(ConfigError, match="totals to resume from must be numbers"):
        TaskQueue.resume(SHARDS, 2, {"epoch": 0, "done": [], "totals": {"examples": "many"}})
    with pytest.raises(ConfigError, match="epoch_examples to resume from must be 2 counts"):
        TaskQueue.resume(SHARDS, 2, {"epoch": 1, "done": [], "epoch_examples": [1]})
    with pytest.raises(ConfigError, match="must be a map"):
        TaskQueue.resume(SHARDS, 2, None)


def test_a_resumed_job_says_what_it_resumed_from_so_its_live_rate_is_this_runs():
    """Issue 33.4: after --resume the live line counted the examples done before in its rate."""
    from paramserver.cli.train_report import progress_line

    q = TaskQueue(SHARDS, epochs=2)
    drain(q, stop_after=2)
    resumed = TaskQueue.resume(SHARDS, 2, q.snapshot())
    done_before = resumed.status()["live"]["examples"]
    assert done_before > 0 and resumed.status()["resumed_examples"] == done_before
    resumed.progress({"examples": 50, "loss_sum": 1.0})
    assert "50/s" in progress_line(resumed.status(), 1.0)
    assert TaskQueue(SHARDS, epochs=1).status()["resumed_examples"] == 0


def test_the_last_shard_handed_out_is_marked_last():
    """What a worker settles its last batches by (``apps/ctr/depth.settles``): the job's last
    shard to hand out, in its last epoch, and no other."""
    q = TaskQueue(SHARDS, epochs=2)
    flags = []
    while not (task := q.next_shard(1)).get("done"):
        flags.append(task["last"])
        q.shard_done(1, task["shard_id"], task["epoch"], {"examples": 1})
    assert flags == [False] * 5 + [True]
