"""Elastic workers: a worker that dies hands its shard back, one that joins takes shards,
and every example is still counted once per epoch."""

import gzip
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from support import shared, wait_for

from paramserver import Client, ConfigError, LocalCluster, WorkerError
from paramserver.data.reader import Shard


def count_shards(client):
    """Take shards until the job is done; the first worker holds its first shard until
    another worker has taken one too, so a worker that joins does take shards."""
    done = 0
    while (task := client.job.next_shard(timeout_s=60)) is not None:
        if client.rank == 0 and done == 0:  # (epoch 0 cannot end while this shard is held)
            wait_for(lambda: (s := client.job.status())["running"] + s["shards_done"] >= 2,
                     what="another worker to take a shard")
        client.job.shard_done(task, examples=10)
        done += 1
    return client.rank, done


def test_a_worker_added_while_a_function_runs_runs_it_and_takes_shards():
    with LocalCluster(servers=1, workers=1, log_level="WARNING") as cluster:
        cluster.client.job.start([Shard("s", i, i + 1) for i in range(6)], 2)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(cluster.run_elastic, count_shards, timeout_s=90)
            wait_for(lambda: cluster.client.job.status()["running"] >= 1, what="the first shard")
            name = cluster.add_worker()
            results, failed = running.result(timeout=120)
        status = cluster.client.job.status()
    assert name == "worker-1" and failed == []
    assert [rank for rank, _ in results] == [0, 1]
    assert all(done >= 1 for _, done in results) and sum(done for _, done in results) == 12
    assert status["finished"] and status["examples"] == 120 and status["epoch_examples"] == [60, 60]


def test_run_stays_strict_and_run_elastic_fails_when_every_worker_dies():
    import os

    with LocalCluster(servers=1, workers=2, log_level="WARNING") as cluster:
        with pytest.raises(WorkerError, match="every worker died") as err:
            cluster.run_elastic(lambda c: os._exit(4), timeout_s=60)
        assert str(err.value).count("died (exit code 4)") == 2
        with pytest.raises(WorkerError, match="no workers"):  # the dead are not sent functions again
            cluster.run(lambda c: c.rank, timeout_s=60)
        cluster.add_worker()
        assert cluster.run(lambda c: c.rank, timeout_s=60) == [2]


def test_a9a_with_a_worker_killed_mid_job_counts_each_example_exactly_once(tmp_path):
    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.train import TrainConfig, run_training
    from paramserver.data.reader import DataFormat

    train, test = shared("libsvm/a9a.libsvm.gz"), shared("libsvm/a9a.t.libsvm.gz")
    plain = tmp_path / "a9a.libsvm"  # uncompressed, so it splits into shards (outside the repo)
    with gzip.open(train, "rb") as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    killed = {}

    def kill_once_a_shard_is_done(cluster):
        def watch():
            with Client(cluster.address) as watcher:
                status = wait_for(lambda: (s := watcher.job.status()) and s["shards_done"] >= 1 and s,
                                  what="a shard done")
                cluster.kill("worker-1")
                killed["status"] = status
                killed["joined"] = cluster.add_worker()  # and one joins mid-job

        threading.Thread(target=watch, daemon=True).start()

    cfg = TrainConfig(Model("lr"), DataFormat("libsvm", label_format="pm1"), epochs=2, batch_size=100)
    report = run_training(cfg, [str(plain)], [test], servers=1, workers=3, shard_bytes=100_000,
                          setup=kill_once_a_shard_is_done,
                          cluster_options={"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 1.5})
    assert not killed["status"]["finished"]  # the kill came mid-job
    assert report["failed_workers"] == ["worker-1 died (exit code -9)"]
    assert len(report["traces"]) == 3  # two survivors and the worker that joined ran the job
    assert report["examples"] == 32_561 * 2  # each example exactly once per epoch
    assert report["test_examples"] == 16_281 and report["logloss"] <= 0.34, report


def test_add_server_says_so_when_the_joiner_exits_before_it_joins():
    """Issue 13: add_server waited its whole timeout for a joiner that had already exited."""
    import time

    from paramserver.errors import ConnectError

    with LocalCluster(servers=1, workers=0, log_level="WARNING") as cluster:
        spawn = cluster._spawn
        cluster._spawn = lambda name, args, pass_fds=(): spawn(name, [*args, "--no-such-flag"], pass_fds)
        started = time.monotonic()
        with pytest.raises(ConnectError, match="exited with code 2 before it joined the ring"):
            cluster.add_server(timeout_s=60)
        assert time.monotonic() - started < 20
        assert cluster.client.admin.cluster_info()["ring_servers"] == [cluster.client.admin.ring.servers[0]]


def raise_on_rank_0_else_wait(client, gate):
    """Rank 0 raises (bad data, a bug); the others wait for ``gate``, as a worker waiting for
    a shard the raiser holds would wait for ever."""
    import os
    import time

    if client.rank == 0:
        raise ValueError("bad line 7")
    deadline = time.monotonic() + 100
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return client.rank


def test_a_worker_that_raises_fails_the_run_at_once_without_waiting_for_the_others(tmp_path):
    import time

    gate = str(tmp_path / "gate")
    with LocalCluster(servers=1, workers=2, log_level="WARNING") as cluster:
        for run in (cluster.run, cluster.run_elastic):
            started = time.monotonic()
            with pytest.raises(WorkerError, match="bad line 7"):
                run(raise_on_rank_0_else_wait, gate, timeout_s=150)
            assert time.monotonic() - started < 60  # not the 100 s the waiting worker would take
        open(gate, "w").close()
        assert sorted(cluster.run(lambda c: c.rank, timeout_s=60)) == [0, 1]  # late replies dropped


def test_train_with_a_bad_line_in_its_only_shard_and_two_workers_fails_instead_of_hanging(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "bad.libsvm"
    bad.write_text("1 3:1 7:0.5\n" * 50 + "1 3:abc\n" + "0 2:1\n" * 50)
    done = subprocess.run([sys.executable, "-m", "paramserver", "train", "--format", "libsvm", "--data", str(bad),
                           "--workers", "2", "--quiet"], capture_output=True, text=True, timeout=90)
    assert done.returncode == 2
    assert f"{bad}:51" in done.stderr and "--skip-bad-lines" in done.stderr


def test_the_name_add_server_returns_is_what_remove_server_takes():
    """Issue 33.1: remove_server('server-2') raised a raw ValueError; the node id was 4."""
    keys = np.arange(500, dtype=np.uint64)
    with LocalCluster(servers=1, workers=0, log_level="WARNING") as cluster:
        c = cluster.client
        c.create_table("t", dim=1, optimizer="sgd")
        c.push("t", keys, np.ones((500, 1), np.float32), op="add").result(timeout=60)
        name = cluster.add_server()
        assert len(c.admin.cluster_info()["ring_servers"]) == 2
        with pytest.raises(ConfigError, match="takes the server's node id"):
            c.admin.remove_server(name)
        with pytest.raises(ConfigError, match="no server process 'server-9'"):
            cluster.remove_server("server-9")
        cluster.remove_server(name)
        assert len(c.admin.cluster_info()["ring_servers"]) == 1
        np.testing.assert_array_equal(c.pull("t", keys).result(timeout=60), np.ones((500, 1), np.float32))
