"""BSP exactness, the SSP bound under a straggler, ASP, and a killed worker."""

import os
import signal
import time

import numpy as np
import pytest
from support import wait_for

from paramserver import LocalCluster, WorkerError

D, B, T = 40, 16, 8  # keys, batch per worker, clocks


def batch(clock, rank):
    rng = np.random.default_rng(1000 * clock + rank)
    X = rng.standard_normal((B, D))
    y = X @ np.linspace(-1, 1, D) + 0.1 * rng.standard_normal(B)
    return X, y


def bsp_worker(client, table):
    keys = np.arange(D, dtype=np.uint64)
    for c in range(T):
        w = client.pull(table, keys).result(timeout=60)[:, 0].astype(np.float64)
        X, y = batch(c, client.rank)
        grad = X.T @ (X @ w - y)  # summed squared-loss gradient of this worker's batch
        client.push(table, keys, grad.astype(np.float32).reshape(-1, 1)).result(timeout=60)
        client.clock()
    return client.rank


def serial_reference(workers, optimizer):
    w = np.zeros(D, np.float32)
    acc = np.zeros(D, np.float64)
    for c in range(T):
        g = sum(((lambda X, y: X.T @ (X @ w.astype(np.float64) - y))(*batch(c, r))).astype(np.float32)
                for r in range(workers)).astype(np.float64)  # one step on the combined batch
        if optimizer == "sgd":
            w = (w - 0.002 * g).astype(np.float32)
        else:
            acc = (acc + g * g).astype(np.float32).astype(np.float64)
            w = (w - 0.1 * g / (np.sqrt(acc) + 1e-10)).astype(np.float32)
    return w


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_bsp_with_aggregation_equals_serial_training_on_the_combined_batch(optimizer):
    spec = {"name": "sgd", "lr": 0.002} if optimizer == "sgd" else {"name": "adagrad", "lr": 0.1}
    with LocalCluster(servers=2, workers=3, log_level="WARNING") as cluster:
        cluster.client.create_table("w", dim=1, optimizer=spec, consistency="bsp", aggregate=True)
        assert cluster.run(bsp_worker, "w", timeout_s=120) == [0, 1, 2]
        # the last clock's pushes are applied when the workers' ticks (sent without waiting
        # for an answer) reach every server: read after that, not before
        wait_for(lambda: all(s["min_clock"] == T for s in cluster.client.stats.server_stats()), what="the last clock")
        got = cluster.client.pull("w", np.arange(D, dtype=np.uint64)).result(timeout=30)[:, 0]
    np.testing.assert_allclose(got, serial_reference(3, optimizer), rtol=1e-5, atol=1e-6)


def counter_worker(client, rounds, straggler_s):
    seen = []
    for _ in range(rounds):
        value = client.pull("counter", [7]).result(timeout=60)[0, 0]
        seen.append((client.current_clock, float(value)))
        if client.rank == 0:
            time.sleep(straggler_s)  # the straggler
        client.push("counter", [7], [[-1.0]]).result(timeout=60)  # sgd lr=1: +1
        client.clock()
    return seen


@pytest.mark.parametrize("s", [0, 1, 3])
def test_ssp_bound_holds_under_a_straggler(s):
    W, rounds = 3, 10
    with LocalCluster(servers=2, workers=W, log_level="WARNING") as cluster:
        cluster.client.create_table("counter", optimizer={"name": "sgd", "lr": 1.0}, consistency=f"ssp:{s}")
        results = cluster.run(counter_worker, rounds, 0.03, timeout_s=120)
        stats = cluster.client.stats.consistency_stats()
    for seen in results:
        assert [c for c, _ in seen] == list(range(rounds))
        for c, value in seen:
            assert value >= W * max(0, c - s), (s, c, value)
    assert all(server["max_gap"] <= s for server in stats)  # no reader ever more than s ahead
    assert sum(sum(server["staleness_histogram"].values()) for server in stats) == W * rounds
    if s == 0:  # the fast workers did wait for the straggler
        assert sum(server["parked_pulls"] for server in stats) > 0


def test_asp_never_parks_a_pull():
    with LocalCluster(servers=1, workers=3, log_level="WARNING") as cluster:
        cluster.client.create_table("counter", optimizer={"name": "sgd", "lr": 1.0}, consistency="asp")
        cluster.run(counter_worker, 8, 0.03, timeout_s=120)
        stats = cluster.client.stats.consistency_stats()
    assert all(s["parked_pulls"] == 0 for s in stats)
    assert max(int(k) for k in stats[0]["staleness_histogram"]) > 0  # and it did read stale


def killed_mid_run(client):
    keys = np.arange(5, dtype=np.uint64)
    for c in range(12):
        if client.rank == 1 and c == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        client.pull("bsp", keys).result(timeout=60)
        client.push("bsp", keys, np.ones((5, 1), np.float32)).result(timeout=60)
        client.clock()
    return "finished"


def test_a_killed_worker_does_not_stop_the_others():
    timeout_s = 2.0
    with LocalCluster(servers=1, workers=3, heartbeat_interval_s=0.2, heartbeat_timeout_s=timeout_s,
                      log_level="WARNING") as cluster:
        cluster.client.create_table("bsp", consistency="bsp")
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as err:
            cluster.run(killed_mid_run, timeout_s=60)
        elapsed = time.monotonic() - t0
    text = str(err.value)
    assert text.count("died (exit code -9)") == 1 and "raised" not in text  # the other two finished
    assert elapsed < timeout_s + 8, elapsed


@pytest.mark.parametrize("consistency,workers", [("bsp", 1), ("ssp:2", 1), ("bsp", 2), ("ssp:2", 2), ("asp", 1)])
def test_training_with_checkpoints_under_bsp_and_ssp_finishes(tmp_path, consistency, workers):
    """Every coordinated checkpoint drains all the workers, so each server's vector clock
    was left empty; they came back at clock 0 (and, once that was fixed, a worker ahead
    came back at the other's lower clock) while their pulls carried their own clocks, which
    only their own next batches would tick: BSP and SSP pulls were parked for ever after a
    checkpoint, and ASP's were counted hundreds of clocks stale."""
    import json
    import subprocess
    import sys

    from paramserver.apps.ctr.synth import write_synth
    from paramserver.checkpoint.store import MANIFEST

    data, url, out = tmp_path / "d.tsv", tmp_path / "ckpt", tmp_path / "report.json"
    write_synth(str(data), 4000, seed=2)
    started = time.monotonic()
    try:  # a checkpoint every shard: each one empties the vector clocks
        proc = subprocess.run([sys.executable, "-m", "paramserver", "train", "--data", str(data), "--epochs", "2",
                               "--consistency", consistency, "--servers", str(workers), "--workers", str(workers),
                               "--shard-mb", "0.25", "--checkpoint-dir", str(url), "--checkpoint-every", "1",
                               "--keep-checkpoints", "0", "--metrics-out", str(out), "--quiet"],
                              capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"train --consistency {consistency} --checkpoint-dir with {workers} worker(s) hung "
                    f"(over {time.monotonic() - started:.0f} s)")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["examples"] == 2 * 4000 and report["checkpoints_abandoned"] == 0
    assert len(report["checkpoints"]) >= 4  # past the first, and well past it
    assert all(os.path.exists(os.path.join(step, MANIFEST)) for step in report["checkpoints"])
    bound = {"bsp": 0, "ssp:2": 2, "asp": 2}[consistency]  # asp, one worker: its own pipeline of 2 batches
    assert report["consistency"]["max_gap"] <= bound, report["consistency"]  # a checkpoint is no staleness
    if consistency != "asp":  # a gated table's reads stay s + 1 clocks late: link keeps it at 2, not an LR's 4
        assert report["pipeline_depth"] == 2, report["pipeline_depth"]
