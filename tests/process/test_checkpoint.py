"""Cold backup: checkpoint, stop everything, restore onto another number of servers."""

import json
import os

import numpy as np
import pytest

from paramserver import CheckpointError, LocalCluster


def fill(client):
    rng = np.random.default_rng(0)
    client.create_table("ftrl", dim=1, optimizer={"name": "ftrl", "alpha": 0.2, "l1": 0.5})
    client.create_table("emb", dim=4, optimizer="adam", initializer={"name": "normal", "std": 0.1}, seed=3)
    keys = np.concatenate([rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64, endpoint=True),
                           np.array([0, 2**64 - 1], np.uint64)])
    for step in range(3):
        client.push("ftrl", keys, rng.standard_normal((keys.size, 1)).astype(np.float32)).result(timeout=60)
        client.push("emb", keys[::2], rng.standard_normal((keys[::2].size, 4)).astype(np.float32)).result(timeout=60)
    return keys


def full_rows(client, table):
    """Every server's vnodes: key -> value and optimiser state, read through the stats-free path."""
    keys, values = client.export_table(table)
    order = np.argsort(keys)
    return keys[order], values[order]


def test_restore_onto_a_different_number_of_servers_is_bitwise_equal(tmp_path):
    url = str(tmp_path / "ckpt")
    with LocalCluster(servers=2, log_level="WARNING") as cluster:
        keys = fill(cluster.client)
        step = cluster.client.checkpoint(url)
        before = {t: full_rows(cluster.client, t) for t in ("ftrl", "emb")}
        pulled = cluster.client.pull("emb", keys[:100]).result(timeout=30)
    assert os.path.exists(os.path.join(step, "MANIFEST.json"))
    with LocalCluster(servers=3, log_level="WARNING") as cluster:
        restored = cluster.client.restore(url)
        assert restored == {"ftrl": keys.size, "emb": keys[::2].size}
        for table, (k, v) in before.items():
            k2, v2 = full_rows(cluster.client, table)
            np.testing.assert_array_equal(k2, k)
            np.testing.assert_array_equal(v2, v)  # bitwise
        np.testing.assert_array_equal(cluster.client.pull("emb", keys[:100]).result(timeout=30), pulled)
        # optimiser state came back too: the same next step gives the same values
        g = np.full((keys.size, 1), 0.5, np.float32)
        cluster.client.push("ftrl", keys, g).result(timeout=60)
        after_restored = cluster.client.pull("ftrl", keys).result(timeout=60)
    with LocalCluster(servers=1, log_level="WARNING") as cluster:
        cluster.client.restore(step)
        cluster.client.push("ftrl", keys, g).result(timeout=60)
        np.testing.assert_array_equal(cluster.client.pull("ftrl", keys).result(timeout=60), after_restored)


def test_missing_or_corrupt_manifests_are_refused(tmp_path):
    url = str(tmp_path / "ckpt")
    with LocalCluster(servers=1, log_level="WARNING") as cluster:
        cluster.client.create_table("t", dim=2)
        cluster.client.push("t", [1, 2], np.ones((2, 2), np.float32)).result(timeout=30)
        step = cluster.client.checkpoint(url)
        manifest = os.path.join(step, "MANIFEST.json")
        os.rename(manifest, manifest + ".gone")  # as if the writer died before the manifest
        with pytest.raises(CheckpointError, match="no complete checkpoint"):
            cluster.client.restore(url)
        with pytest.raises(CheckpointError, match="is missing: the checkpoint is incomplete"):
            cluster.client.restore(step)
        with open(manifest, "w") as f:
            f.write("{not json")
        with pytest.raises(CheckpointError, match="is corrupt"):
            cluster.client.restore(step)
        with open(manifest, "w") as f:
            json.dump({"format": "something-else"}, f)
        with pytest.raises(CheckpointError, match="not a paramserver-checkpoint-1 manifest"):
            cluster.client.restore(step)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        from paramserver.checkpoint import latest_step
        latest_step(str(tmp_path / "nothing-here"))
