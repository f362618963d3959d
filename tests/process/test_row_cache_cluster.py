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
