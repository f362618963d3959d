"""Parameter blocks (``TableSpec.block_size``): a range-partitioned dense table keeps each
block of contiguous keys wholly on one vnode, the client computes where every block is,
a block is one request, and blocks move whole when the ring changes."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.errors import ConfigError
from paramserver.routing.blocks import BlockMap
from paramserver.routing.hashing import dense_keys_of, dense_range, layout_code, vnodes_of_keys
from paramserver.routing.partition import route_pull, route_push
from paramserver.routing.ring import Ring, plan_moves
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message


@pytest.mark.parametrize("bits,shift", [(4, 0), (4, 4), (10, 3), (20, 6), (32, 12), (32, 0)])
@pytest.mark.parametrize("n_vnodes", [1, 3, 64, 256])
def test_each_block_lies_wholly_in_one_vnode_and_the_vnodes_cut_the_keys_in_order(bits, shift, n_vnodes):
    layout = layout_code(bits, 1 << shift)
    keys = np.arange(min(1 << bits, 1 << 16), dtype=np.uint64)
    keys = np.concatenate([keys, np.array([(1 << bits) - 1, (1 << bits) >> 1], np.uint64)])
    np.testing.assert_array_equal(dense_keys_of(0, keys.astype(np.int64), layout), keys)  # position = key
    vnodes = vnodes_of_keys(keys, n_vnodes, layout)
    bounds = np.array([dense_range(v, n_vnodes, layout) for v in range(n_vnodes)])
    assert bounds[0, 0] == 0 and bounds[-1, 1] == 1 << bits
    np.testing.assert_array_equal(bounds[1:, 0], bounds[:-1, 1])
    assert (bounds % (1 << shift) == 0).all()  # cut at block boundaries only
    assert ((bounds[vnodes, 0] <= keys.astype(np.int64)) & (keys.astype(np.int64) < bounds[vnodes, 1])).all()
    blocks = keys >> np.uint64(shift)
    first = vnodes_of_keys(blocks << np.uint64(shift), n_vnodes, layout)
    np.testing.assert_array_equal(vnodes, first)  # every key sits with its block's first key
    spec = TableSpec("t", key_bits=bits, block_size=1 << shift)
    ring = Ring.create(list(range(min(n_vnodes, 3))), max(1, n_vnodes // 3)) if n_vnodes % 3 == 0 else \
        Ring(np.arange(n_vnodes) % 2)
    bmap = BlockMap("t", spec.block_size, spec.n_blocks, ring)
    np.testing.assert_array_equal(bmap.vnode_of(blocks.astype(np.int64)), vnodes_of_keys(keys, ring.n_vnodes, layout))


def test_blocks_spread_over_the_servers_and_each_is_one_request():
    spec = TableSpec("t", dim=3, key_bits=12, block_size=64)
    ring = Ring.create([1, 2, 5], 8)
    bmap = BlockMap("t", spec.block_size, spec.n_blocks, ring)
    owned = bmap.by_server()
    together = np.sort(np.concatenate(list(owned.values())))
    np.testing.assert_array_equal(together, np.arange(spec.n_blocks))  # every block once
    sizes = [len(b) for b in owned.values()]
    assert min(sizes) > 0 and max(sizes) - min(sizes) <= 8  # even to one block a vnode (8 vnodes a server)
    for server, blocks in owned.items():
        np.testing.assert_array_equal(bmap.server_of(blocks), np.full(blocks.size, server))
        for b in blocks[:5]:
            keys = bmap.keys(int(b))
            assert keys.tolist() == list(range(b * 64, (b + 1) * 64))
            for routed in (route_pull(ring, keys, spec.layout),
                           route_push(ring, keys, np.ones((64, 3), np.float32), spec.layout)):
                assert [p.server for p in routed.parts] == [server] and routed.parts[0].vnodes.size == 1
    np.testing.assert_array_equal(bmap.block_of(np.array([0, 63, 64, 4095], np.uint64)), [0, 0, 1, 63])
    with pytest.raises(ConfigError, match=r"block 64 is out of range: it has 64 blocks of 64 keys \(0..63\)"):
        bmap.keys(64)
    with pytest.raises(ConfigError, match="block -1 is out of range"):
        bmap.server_of(np.array([3, -1]))


def test_block_specs_are_checked_with_the_fix_named():
    for bad in (3, -4, 2.0, True):
        with pytest.raises(ConfigError, match="block_size must be a power of two"):
            TableSpec("t", key_bits=8, block_size=bad)
    with pytest.raises(ConfigError, match="needs a dense table with at least that many keys: key_bits >= 4, "
                                          "got key_bits=0"):
        TableSpec("t", block_size=16)
    with pytest.raises(ConfigError, match="key_bits >= 9, got key_bits=8"):
        TableSpec("t", key_bits=8, block_size=512)
    spec = TableSpec("t", key_bits=8, block_size=256)
    assert spec.n_blocks == 1 and TableSpec.from_wire(spec.to_wire()) == spec
    assert TableSpec.from_wire({"name": "t", "key_bits": 8}).block_size == 0  # a spec from before blocks
    assert TableSpec("t", key_bits=8).layout == 8 and TableSpec("t").layout == 0 and spec.layout == 8 | (9 << 8)


def test_range_and_scattered_dense_tables_store_the_same_rows():
    ring = Ring.create([1, 2], 4)
    rng = np.random.default_rng(3)
    sets = {}
    for block_size in (0, 32):
        spec = TableSpec("t", 2, optimizer="adam", initializer={"name": "normal", "std": 0.1}, seed=9,
                         key_bits=12, block_size=block_size)
        sets[block_size] = (spec, {s: VnodeSet(spec, ring.n_vnodes, ring.vnodes_of(s)) for s in (1, 2)})
    for _ in range(5):
        keys = rng.integers(0, 1 << 12, 2000).astype(np.uint64)
        grads = rng.standard_normal((keys.size, 2)).astype(np.float32)
        for spec, by_server in sets.values():
            routed = route_push(ring, keys, grads, spec.layout)
            for part in routed.parts:
                k = routed.keys[part.start:part.stop]
                assert by_server[part.server].check(part.vnodes, part.counts, k) == -1
                by_server[part.server].apply(part.vnodes, part.counts, k, routed.grads[part.start:part.stop])
    stored = {}
    for block_size, (_, by_server) in sets.items():
        rows = {}
        for table in by_server.values():
            for vt in table.tables.values():
                k, v = vt.items()
                rows.update({int(a): b.tobytes() for a, b in zip(k, v)})
        stored[block_size] = rows
    assert stored[0] == stored[32] and len(stored[0]) > 3000
    spec, by_server = sets[32]
    for table in by_server.values():  # a server holds whole blocks: 32 contiguous keys each
        held = np.concatenate([np.arange(*dense_range(v, ring.n_vnodes, spec.layout)) for v in table.tables])
        assert held.size % 32 == 0 and (np.unique(held // 32, return_counts=True)[1] == 32).all()


def test_blocks_move_whole_to_a_joining_server(h):
    a, _ = h.make(1, 2)
    spec = TableSpec("b", 4, optimizer={"name": "sgd", "lr": 1.0}, key_bits=10, block_size=16)
    ring = Ring.create([1], 8)
    h.ring(ring, [spec])
    keys = np.arange(1 << 10, dtype=np.uint64)
    grads = np.repeat(np.arange(keys.size, dtype=np.float32)[:, None], 4, axis=1)
    h.push(ring, "b", keys, -grads)
    target = ring.with_server(2)
    moves = plan_moves(ring, target, {"b": 1})
    assert moves
    a.control_plane.on_migrate(Message({"op": "migrate", "migration": 1,
                                        "moves": [[t, v, d] for _, t, v, d in moves]}, []))
    h.pump()
    assert h.control[-1][1]["op"] == "migrated" and not h.control[-1][1]["failed"]
    h.ring(target, [spec])
    bmap = BlockMap("b", 16, spec.n_blocks, target)
    owners = bmap.server_of(np.arange(spec.n_blocks))
    assert set(owners.tolist()) == {1, 2}
    for block in range(0, spec.n_blocks, 7):
        node = h.by_id(int(owners[block]))
        for k in bmap.keys(block)[::5]:
            assert h.value(node, "b", k) == float(k)
