"""Parameter blocks on a real cluster (issue 14): a range-partitioned table is pulled and
pushed a block at a time, each block one request to the server the client computed,
and blocks keep their values through replication, a joining server and a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver import ConfigError, LocalCluster
from paramserver.wire.message import Op

pytestmark = pytest.mark.timeout(240)

BLOCK = 256
BITS = 12  # 16 blocks


def test_blocks_are_one_request_each_and_survive_a_join_and_a_checkpoint(tmp_path):
    rng = np.random.default_rng(11)
    n_blocks = (1 << BITS) // BLOCK
    with LocalCluster(servers=2, log_level="WARNING") as cluster:
        c = cluster.client
        c.create_table("job/w", dim=2, optimizer={"name": "sgd", "lr": 1.0}, replicas=2, key_bits=BITS,
                       block_size=BLOCK)
        c.create_table("plain", key_bits=BITS)
        with pytest.raises(ConfigError, match="has no parameter blocks"):
            c.blocks("plain")
        bmap = c.blocks("job/w")
        assert sorted(np.concatenate(list(bmap.by_server().values())).tolist()) == list(range(n_blocks))
        expect = np.zeros((1 << BITS, 2), np.float32)
        for block in range(n_blocks):
            pieces = c._pieces(Op.PUSH, bmap.keys(block), np.zeros((BLOCK, 2), np.float32),
                               c._spec("job/w").layout, distinct=True)
            assert [p.server for p in pieces] == [int(bmap.server_of(block)[0])]  # one request, where it said
            counts = rng.integers(0, 5, (BLOCK, 2)).astype(np.float32)
            c.push_block("job/w", block, counts, op="add").result(timeout=60)
            c.push_block("job/w", block, counts, op="add").result(timeout=60)
            c.push_block("job/w", block, np.ones((BLOCK, 2), np.float32)).result(timeout=60)  # sgd, lr 1
            expect[block * BLOCK:(block + 1) * BLOCK] = 2 * counts - 1
        for block in (0, 7, n_blocks - 1):
            np.testing.assert_array_equal(c.pull_block("job/w", block).result(timeout=60),
                                          expect[block * BLOCK:(block + 1) * BLOCK])
        url = str(tmp_path / "ckpt")
        c.checkpoint(url)
        version = bmap.ring_version
        cluster.add_server()
        moved = c.blocks("job/w")
        assert moved.ring_version > version and len(moved.by_server()) == 3
        assert all(len(b) for b in moved.by_server().values())
        got = np.concatenate([c.pull_block("job/w", b).result(timeout=60) for b in range(n_blocks)])
        np.testing.assert_array_equal(got, expect)
        stats = c.stats.server_stats()
        assert sum(s["tables"]["job/w"]["keys"] for s in stats) == 2 * (1 << BITS)  # both copies, whole
    with LocalCluster(servers=1, log_level="WARNING") as cluster:
        c = cluster.client
        assert c.restore(url) == {"job/w": 1 << BITS, "plain": 0}
        assert c.tables()["job/w"].block_size == BLOCK
        np.testing.assert_array_equal(c.pull_block("job/w", 3).result(timeout=60), expect[3 * BLOCK:4 * BLOCK])
