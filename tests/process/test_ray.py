"""``RayCluster`` on a local Ray this module starts: a9a trains as under ``LocalCluster``; a
killed server actor loses no acknowledged push and Ray's restart of it joins the ring; a
killed worker actor's shard is redone once and its restart joins the job; the scheduler
actor's death ends a run with an error, not a hang; ``scale`` joins and drains live.

Run apart from the other process tests (the Makefile does): a process connected to Ray has
Ray's threads, and ``LocalCluster`` then spawns its nodes instead of forking them."""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from support import shared, wait_for
from test_failover import CLOCKS, KEYS, N_KEYS, WORKERS, count

from paramserver import Client
from paramserver.errors import NodeLostError

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'paramserver[ray]'")

from paramserver.ray import RayCluster  # noqa: E402  (after the skip: it imports ray)

pytestmark = pytest.mark.timeout(240)
FAST = {"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 1.5, "log_level": "WARNING"}


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING", log_to_driver=False,
             object_store_memory=200 << 20)
    yield
    ray.shutdown()


def _a9a(tmp_path):
    train, test = shared("libsvm/a9a.libsvm.gz"), shared("libsvm/a9a.t.libsvm.gz")
    plain = tmp_path / "a9a.libsvm"  # uncompressed, so that it cuts into shards
    with gzip.open(train, "rb") as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return str(plain), test


def test_a9a_trains_through_ray_to_the_log_loss_of_the_local_launcher(tmp_path):
    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.train import TrainConfig, run_training
    from paramserver.data.reader import DataFormat

    train, test = _a9a(tmp_path)
    # two servers: pulled and pushed; the depth fixed, as ``link`` would deepen where the link's pings take
    # 1 ms or more twice (a loaded machine's rarely can), and a deeper pipeline trains another model
    cfg = TrainConfig(Model("lr"), DataFormat("libsvm", label_format="pm1"), pipeline=2)
    reports = {where: run_training(cfg, [train], [test], servers=2, workers=1,
                                   cluster_options={"cluster": where, "log_level": "WARNING"})
               for where in ("local", "ray")}
    assert reports["ray"]["examples"] == reports["local"]["examples"] == 32_561
    assert reports["ray"]["test_examples"] == 16_281
    assert reports["ray"]["logloss"] == pytest.approx(reports["local"]["logloss"], abs=1e-9), reports
    assert reports["ray"]["logloss"] <= 0.33


def test_a_killed_server_actor_loses_no_acknowledged_push_and_its_restart_joins_the_ring():
    gate = os.path.join(tempfile.mkdtemp(prefix="paramserver-gate-"), "go")
    with RayCluster(servers=3, workers=WORKERS, **FAST) as cluster:
        client = cluster.client
        client.create_table("counter", dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=2)
        before = {int(s) for s in client.admin.cluster_info()["ring_servers"]}
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(cluster.run, count, CLOCKS, gate, timeout_s=150)
            wait_for(lambda: running.done() or
                     client.pull("counter", KEYS[:1]).result(timeout=60)[0, 0] >= WORKERS * (CLOCKS // 3),
                     what="a third of the clocks")
            assert not running.done(), "the workers finished before the kill"
            cluster.kill("server-1")
            open(gate, "w").close()
            assert sorted(running.result()) == list(range(WORKERS))
        values = client.pull("counter", KEYS).result(timeout=60)
        np.testing.assert_array_equal(values, np.full((N_KEYS, 1), WORKERS * CLOCKS, np.float32))
        # Ray restarted the actor: a new server (a new node id) joined the ring elastically
        after = wait_for(lambda: (r := {int(s) for s in client.admin.cluster_info()["ring_servers"]}) and len(r) == 3
                         and r != before and r, what="the restarted server to join the ring")
        assert len(after & before) == 2
        client.admin.wait_for_servers(3, timeout_s=60)
        # each key has one primary again once every server has taken the ring the join ended
        # with (the scheduler answers when no vnode moves; a server may take that ring a beat later)
        wait_for(lambda: sum(s["tables"]["counter"]["primary_keys"] for s in client.stats.server_stats()) == N_KEYS,
                 what="every key held by one primary on the three servers")
        np.testing.assert_array_equal(client.pull("counter", KEYS).result(timeout=60), values)


def test_a_killed_worker_actor_has_its_shard_redone_once_and_its_restart_joins(tmp_path):
    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.train import TrainConfig, run_training
    from paramserver.data.reader import DataFormat

    train, test = _a9a(tmp_path)
    killed = {}

    def kill_once_a_shard_is_done(cluster):
        def watch():
            with Client(cluster.address) as watcher:
                killed["status"] = wait_for(lambda: (s := watcher.job.status()) and s["shards_done"] >= 1 and s,
                                            what="a shard done")
                cluster.kill("worker-1")

        threading.Thread(target=watch, daemon=True).start()

    cfg = TrainConfig(Model("lr"), DataFormat("libsvm", label_format="pm1"), epochs=3, batch_size=100)
    report = run_training(cfg, [train], [test], servers=1, workers=2, shard_bytes=100_000,
                          setup=kill_once_a_shard_is_done, cluster_options={"cluster": "ray", **FAST})
    assert not killed["status"]["finished"]  # the kill came mid-job
    assert len(report["failed_workers"]) == 1 and report["failed_workers"][0].startswith("worker-1 died")
    # the survivor (rank 0 or 1: ranks follow registration order) and the restarted worker: under a new rank 2
    # if it registered before the scheduler declared the killed one dead, else under the rank the dead one
    # freed (the smallest free rank goes to the next worker); which comes first is Ray's restart's timing
    ranks = sorted(report["traces"])
    assert len(ranks) == 2 and set(ranks) in ({0, 1}, {0, 2}, {1, 2}), sorted(report["traces"])
    assert report["examples"] == 32_561 * 3  # each example exactly once per epoch
    assert report["test_examples"] == 16_281 and report["logloss"] <= 0.34, report


def wait_on_gate(client, gate):
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return client.rank


def test_the_scheduler_actor_dying_ends_the_run_with_an_error_not_a_hang():
    gate = os.path.join(tempfile.mkdtemp(prefix="paramserver-gate-"), "go")
    with RayCluster(servers=1, workers=1, **FAST) as cluster, ThreadPoolExecutor(1) as pool:
        running = pool.submit(cluster.run, wait_on_gate, gate, timeout_s=120)
        wait_for(lambda: cluster.client.admin.cluster_info()["workers"], what="the worker")
        cluster.kill("scheduler")
        with pytest.raises(NodeLostError, match="scheduler's actor died"):
            running.result(timeout=60)
        open(gate, "w").close()


def test_scale_joins_and_drains_servers_and_workers_live():
    with RayCluster(servers=1, workers=1, **FAST) as cluster:
        client = cluster.client
        client.create_table("w", dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=1)
        keys = np.arange(500, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        client.push("w", keys, -np.ones((500, 1), np.float32)).result(timeout=60)
        cluster.scale(servers=2, workers=2)
        assert len(client.admin.cluster_info()["ring_servers"]) == 2
        assert sorted(cluster.run(lambda c: c.rank, timeout_s=60)) == [0, 1]
        cluster.scale(servers=1, workers=1)
        assert len(client.admin.cluster_info()["ring_servers"]) == 1
        assert cluster.run(lambda c: c.rank, timeout_s=60) == [0]
        np.testing.assert_array_equal(client.pull("w", keys).result(timeout=60), np.ones((500, 1), np.float32))


def test_the_train_command_joins_a_running_ray_cluster_by_its_address(tmp_path):
    import json
    import subprocess
    import sys

    train, test = _a9a(tmp_path)
    address = ray.get_runtime_context().gcs_address
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "paramserver", "train", "--format", "libsvm", "--data", train,
                           "--test", test, "--servers", "2", "--workers", "2", "--replicas", "2", "--quiet",
                           "--cluster", f"ray:{address}", "--metrics-out", str(report)],
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr
    result = json.loads(report.read_text())
    assert result["examples"] == 32_561 and result["test_examples"] == 16_281
    assert result["logloss"] <= 0.33, result
    assert not ray.util.placement_group_table() or all(  # the command removed what it placed
        g["state"] == "REMOVED" for g in ray.util.placement_group_table().values())


def test_a_worker_that_raises_fails_a_ray_run_at_once(tmp_path):
    from test_elastic import raise_on_rank_0_else_wait

    from paramserver import WorkerError

    gate = str(tmp_path / "gate")
    with RayCluster(servers=1, workers=2, **FAST) as cluster:
        with pytest.raises(WorkerError, match="bad line 7"):
            cluster.run_elastic(raise_on_rank_0_else_wait, gate, timeout_s=60)
        open(gate, "w").close()
        assert sorted(cluster.run(lambda c: c.rank, timeout_s=60)) == [0, 1]
