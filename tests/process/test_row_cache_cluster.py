"""The row cache on a real cluster: a cached read never misses more than ``s`` of the
servers' updates, even those of another worker, and what a worker summed is applied
once it flushes."""

import numpy as np

from paramserver import Client, LocalCluster


def test_a_cached_read_is_never_more_than_s_updates_behind_and_sums_land_on_flush():
    s = 2
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster, \
            Client(cluster.address) as cached, Client(cluster.address) as other:
        cached.create_table("w", dim=1, optimizer="sgd", row_cache=f"s={s},rows=1024")
        keys = np.arange(64, dtype=np.uint64)
        ones = np.ones((64, 1), np.float32)
        for _ in range(2):
            cached.pull("w", keys).result(timeout=30)
        assert cached.stats.row_cache_stats()["w"]["hits"] == 64, "the second read came from the cache"
        for updates in range(1, 6):  # the other client's pushes: each moves both servers' versions by one
            other.push("w", keys, ones, distinct=True).result(timeout=30)
            seen = cached.pull("w", keys).result(timeout=30)
            missed = np.round((-0.01 * updates - seen[:, 0]) / -0.01)  # sgd lr 0.01: each update -0.01
            assert missed.max() <= s, f"a read {missed.max()} updates behind with s={s}"
        stats = cached.stats.row_cache_stats()["w"]
        assert stats["lag_p99"] <= s
        cached.push("w", keys, ones, distinct=True).result(timeout=30)  # gathered, not sent (1 use of 2)
        pushed_before = cached.stats.keys.get("push", 0)
        assert cached.flush() == 64 and cached.stats.keys["push"] == pushed_before + 64
        cached.cache_rows("w", "off")
        np.testing.assert_allclose(cached.pull("w", keys).result(timeout=30), -0.06, rtol=1e-5)


def test_a_worker_killed_holding_cache_sums_has_them_counted_lost_and_a_clean_job_loses_none(tmp_path):
    """Issue 46.3: a worker that dies loses only its unpushed sums, and the report counts them
    (as the scheduler last heard them: each worker reports how its held sums changed)."""
    import signal
    import threading

    from support import wait_for

    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.synth import write_synth
    from paramserver.apps.ctr.train import TrainConfig, run_training

    data = str(tmp_path / "rows.tsv")
    write_synth(data, 200_000, seed=3, shape="heavy")
    cfg = TrainConfig(Model("lr"), row_cache="s=8,rows=32768", epochs=2)
    seen = {}

    def kill_while_worker_1_holds_sums(cluster):
        def watch():
            with Client(cluster.address) as watcher:
                def holding():
                    status = watcher.job.status()
                    held = {int(n): w.get("sums_held", 0) for n, w in status.get("per_worker", {}).items()}
                    return len(held) == 2 and min(held.values()) > 0 and held
                # killed while stopped, and only if what it last reported still holds sums: a worker that
                # flushed between the status and the kill (a shard's end) would die holding none
                while True:
                    seen["held"] = wait_for(holding, what="both workers holding sums")
                    cluster.kill("worker-1", signal.SIGSTOP)
                    if holding():
                        cluster.kill("worker-1")
                        return
                    cluster.kill("worker-1", signal.SIGCONT)

        threading.Thread(target=watch, daemon=True).start()

    report = run_training(cfg, [data], [], servers=1, workers=2, shard_bytes=4 << 20,
                          setup=kill_while_worker_1_holds_sums,
                          cluster_options={"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 1.5})
    assert report["failed_workers"] == ["worker-1 died (exit code -9)"]
    assert report["examples"] == 400_000  # its shard was trained again by the survivor
    assert report["row_cache"]["sums_lost"] > 0 and report["row_cache"]["sums_held"] == 0, report["row_cache"]
    assert report["row_cache"]["sums_lost"] <= 2 * 32_768  # one worker's: its slots, and a push's evicted sums

    clean = run_training(cfg, [data], [], servers=1, workers=2, shard_bytes=4 << 20)
    assert clean["failed_workers"] == [] and clean["row_cache"]["sums_lost"] == 0
    assert clean["row_cache"]["rows_read_back"] > 0, "two workers: a merge brings back the rows the other wrote to"


def test_a_cache_that_trains_its_rows_leaves_the_model_its_steps_would_in_fewer_key_operations():
    """Issue 46: ``apply=local`` (the default, ``auto``, for an FTRL table) trains the cached rows by the
    table's rule and merges their changes: one worker's model is the uncached one's, to rounding; a rule
    whose state does not add is refused by name."""
    import pytest

    from paramserver.errors import ConfigError

    rng = np.random.default_rng(5)
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster, Client(cluster.address) as c:
        c.create_table("w", dim=1, optimizer={"name": "ftrl", "l1": 0.01}, row_cache="s=4,rows=1024")
        c.create_table("ref", dim=1, optimizer={"name": "ftrl", "l1": 0.01})
        pool = np.arange(1, 65, dtype=np.uint64)
        target = rng.uniform(-1, 1, (pool.shape[0], 1)).astype(np.float32)
        for _ in range(40):  # a regression on the rows read: each gradient depends on the steps before it
            pick = np.unique(rng.integers(0, pool.shape[0], 24))
            for table in ("w", "ref"):
                seen = c.pull(table, pool[pick]).result(timeout=30)
                c.push(table, pool[pick], seen - target[pick], distinct=True).result(timeout=30)
        stats = c.stats.row_cache_stats()["w"]
        assert stats["hits"] > 0 and stats["sums_pushed"] < stats["grads_gathered"], stats
        c.flush()
        c.cache_rows("w", "off")
        np.testing.assert_allclose(c.pull("w", pool).result(timeout=30), c.pull("ref", pool).result(timeout=30),
                                   rtol=1e-5, atol=1e-6)
        with pytest.raises(ConfigError, match="cannot train its rows.*does not add"):
            c.create_table("a", dim=1, optimizer="adam", row_cache="s=4,apply=local")


def test_a_cache_that_trains_its_rows_through_filters_reads_and_merges_them_exactly():
    """A table's filters leave the cache training its rows (they sent it back to gradient sums
    before): its merges and whole-row replies go through the lossless filters alone, so an
    fp16 reply chain rounds none of the rows it trains, and the model is the uncached one's."""
    rng = np.random.default_rng(11)
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster, Client(cluster.address) as c:
        ftrl = {"name": "ftrl", "l1": 0.01}
        c.create_table("ref", dim=1, optimizer=ftrl)
        for name, filters in (("lossless", "lossless"), ("fp16", "reply=fp16")):
            c.create_table(name, dim=1, optimizer=ftrl, filters=filters, row_cache="s=4,rows=1024")
        pool = np.arange(1, 65, dtype=np.uint64)
        target = rng.uniform(-1, 1, (pool.shape[0], 1)).astype(np.float32)
        for _ in range(40):
            pick = np.unique(rng.integers(0, pool.shape[0], 24))
            for table in ("ref", "lossless", "fp16"):
                seen = c.pull(table, pool[pick]).result(timeout=30)
                c.push(table, pool[pick], seen - target[pick], distinct=True).result(timeout=30)
        stats = c.stats.row_cache_stats()
        assert all(stats[t]["apply"] == "local" and stats[t]["hits"] > 0 for t in ("lossless", "fp16")), stats
        c.flush()
        ref = c.pull("ref", pool).result(timeout=30)
        for table in ("lossless", "fp16"):
            c.cache_rows(table, "off")
            trained = c.pull(table, pool).result(timeout=30)
            if table == "fp16":  # the plain pull's reply is rounded, as any: to fp16's 11 bits
                np.testing.assert_allclose(trained, ref, rtol=1e-3, atol=1e-4)
                continue
            np.testing.assert_allclose(trained, ref, rtol=1e-5, atol=1e-6)
        fp16_rows = np.empty_like(ref)
        c.cache_rows("fp16", "s=4,rows=1024")  # read back whole, through the lossless filters: exact
        c.pull("fp16", pool).result(timeout=30)
        c.pull("fp16", pool).result(timeout=30)
        fp16_rows[:] = c.pull("fp16", pool).result(timeout=30)
        np.testing.assert_allclose(fp16_rows, ref, rtol=1e-5, atol=1e-6)


def test_a_hot_rows_own_merge_keeps_it_fresh_with_no_pull_of_its_own():
    """A merge's answer carries the rows it left and the server's version (``read_back``): the
    cache takes them, so rows written every s uses are never read again from the servers, and
    what it reads still holds another worker's steps."""
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster, \
            Client(cluster.address) as c, Client(cluster.address) as other:
        c.create_table("w", dim=1, optimizer="sgd", row_cache="s=2,rows=1024")
        keys = np.arange(64, dtype=np.uint64)
        ones = np.ones((64, 1), np.float32)
        c.pull("w", keys).result(timeout=30)
        misses = c.stats.row_cache_stats()["w"]["misses"]
        for step in range(1, 21):
            if step % 4 == 0:  # another worker's step, applied on the servers alone
                other.push("w", keys, ones, distinct=True).result(timeout=30)
            c.pull("w", keys).result(timeout=30)
            c.push("w", keys, ones, distinct=True).result(timeout=30)
        stats = c.stats.row_cache_stats()["w"]
        assert stats["apply"] == "local" and stats["misses"] - misses <= 64 and stats["rows_read_back"] > 0, stats
        seen = c.pull("w", keys).result(timeout=30)  # 20 own steps sent, 5 of the other's: sgd lr 0.01
        np.testing.assert_allclose(seen, -0.25, rtol=1e-5)
        for _ in range(6):  # alone again: once the other's last step is s versions old, no rows come back
            c.push("w", keys, ones, distinct=True).result(timeout=30)
        before = c.stats.row_cache_stats()["w"]
        for _ in range(16):  # its rows go stale by its own merges, and are pulled again when due
            c.pull("w", keys).result(timeout=30)
            c.push("w", keys, ones, distinct=True).result(timeout=30)
        stats = c.stats.row_cache_stats()["w"]
        assert stats["rows_read_back"] == before["rows_read_back"] and stats["misses"] > before["misses"], stats
        np.testing.assert_allclose(c.pull("w", keys).result(timeout=30), -0.47, rtol=1e-5)
