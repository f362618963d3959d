"""Dense tables (``TableSpec.key_bits``): the key → vnode → row mapping, agreement with
hash tables to the bit, and keys that do not belong refused before anything changes."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.train import TrainConfig
from paramserver.data.reader import DataFormat
from paramserver.errors import ConfigError, ProtocolError
from paramserver.routing.hashing import dense_keys_of, dense_range, vnodes_of_keys
from paramserver.routing.partition import route_pull, route_push
from paramserver.routing.ring import Ring, plan_moves
from paramserver.store.dense import DenseVnode
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message


@pytest.mark.parametrize("bits", [1, 7, 20, 32])
@pytest.mark.parametrize("n_vnodes", [1, 3, 64])
def test_vnodes_cut_the_key_positions_into_contiguous_ranges(bits, n_vnodes):
    keys = np.arange(min(1 << bits, 1 << 16), dtype=np.uint64)
    if bits == 32:
        keys = np.concatenate([keys, np.array([2**32 - 1, 2**31], np.uint64)])
    positions = (keys * np.uint64(0x9E3779B97F4A7C15)) & np.uint64((1 << bits) - 1)  # wraps mod 2**64
    np.testing.assert_array_equal(dense_keys_of(0, positions.astype(np.int64), bits), keys)  # a bijection
    vnodes = vnodes_of_keys(keys, n_vnodes, bits)
    bounds = np.array([dense_range(v, n_vnodes, bits) for v in range(n_vnodes)])
    assert bounds[0, 0] == 0 and bounds[-1, 1] == 1 << bits
    np.testing.assert_array_equal(bounds[1:, 0], bounds[:-1, 1])  # a partition, in order
    assert ((bounds[vnodes, 0] <= positions) & (positions < bounds[vnodes, 1])).all()


def test_sequential_ids_spread_evenly_over_the_vnodes():
    ids = np.arange(100_000, dtype=np.uint64)  # ids filling 10 % of a 2**20 key space
    counts = np.bincount(vnodes_of_keys(ids, 64, 20), minlength=64)
    assert counts.min() > 0.95 * ids.size / 64 and counts.max() < 1.05 * ids.size / 64


OPTIMIZERS = [("sgd", "zeros", 2), ("adagrad", {"name": "normal", "std": 0.1}, 4),
              ({"name": "ftrl", "alpha": 0.1, "l1": 0.5}, "zeros", 1),
              ("adam", {"name": "uniform", "low": -0.2, "high": 0.2}, 3)]


def _serve(sets, ring, bits, keys, grads=None, dim=1):
    """Push (grads given) or pull ``keys`` through the servers' VnodeSets, as servers do."""
    routed = route_push(ring, keys, grads, bits) if grads is not None else route_pull(ring, keys, bits)
    out = np.empty((routed.keys.size, dim), np.float32)
    for part in routed.parts:
        table, k = sets[part.server], routed.keys[part.start:part.stop]
        assert table.check(part.vnodes, part.counts, k) == -1
        if grads is None:
            table.lookup(part.vnodes, part.counts, k, out[part.start:part.stop])
        else:
            table.apply(part.vnodes, part.counts, k, routed.grads[part.start:part.stop])
    if grads is None:
        result = np.empty_like(out)
        result[routed.order] = out
        return result
    return None


@pytest.mark.parametrize("optimizer,initializer,dim", OPTIMIZERS)
def test_dense_and_hash_tables_give_the_same_bits(optimizer, initializer, dim):
    ring = Ring.create([1, 2], 4)
    rng = np.random.default_rng(0)
    tables = {}
    for bits in (0, 16):
        spec = TableSpec("t", dim, optimizer=optimizer, initializer=initializer, seed=5, key_bits=bits)
        tables[bits] = {s: VnodeSet(spec, ring.n_vnodes, ring.vnodes_of(s)) for s in (1, 2)}
    for _ in range(10):
        keys = rng.integers(0, 1 << 16, 3000).astype(np.uint64)  # duplicates too: summed
        grads = rng.standard_normal((keys.size, dim)).astype(np.float32)
        for bits, sets in tables.items():
            _serve(sets, ring, bits, keys, grads)
    probe = np.concatenate([rng.integers(0, 1 << 16, 5000).astype(np.uint64), np.array([0, 65535], np.uint64)])
    hashed, dense = (_serve(tables[b], ring, b, probe, dim=dim) for b in (0, 16))
    np.testing.assert_array_equal(hashed, dense)
    stored = {}
    for bits, sets in tables.items():
        rows = {}
        for table in sets.values():
            for vt in table.tables.values():
                keys, values = vt.items()
                rows.update({int(k): v.tobytes() for k, v in zip(keys, values)})
        stored[bits] = rows
    assert stored[0] == stored[16] and len(stored[0]) > 20_000  # keys, values and optimiser state


def test_a_dense_vnode_loads_its_own_keys_and_refuses_others_whole():
    spec = TableSpec("t", 1, optimizer="adagrad", key_bits=12)
    a, b = DenseVnode(spec, 4, 1), DenseVnode(spec, 4, 1)
    keys = np.arange(1 << 12, dtype=np.uint64)
    mine = keys[vnodes_of_keys(keys, 4, 12) == 1]
    rows = np.arange(mine.size * 2, dtype=np.float32).reshape(-1, 2)
    a.load(mine, rows)
    k, r = a.items()
    b.load(k, r)
    assert len(a) == len(b) == mine.size
    np.testing.assert_array_equal(np.sort(k), np.sort(mine))
    np.testing.assert_array_equal(r[np.argsort(k)], rows[np.argsort(mine)])
    other = keys[vnodes_of_keys(keys, 4, 12) == 2][:1]
    for bad in (np.concatenate([mine[:5], other]), np.array([mine[0], 1 << 12], np.uint64)):
        with pytest.raises(ProtocolError, match="not in this dense vnode"):
            b.load(bad, np.zeros((bad.size, 2), np.float32))
    np.testing.assert_array_equal(b.items()[1], r)  # nothing written


def test_dense_specs_are_checked_and_keys_outside_the_space_named():
    for bad in (-1, 33, True, 2.0):
        with pytest.raises(ConfigError, match="key_bits must be an int in"):
            TableSpec("t", key_bits=bad)
    spec = TableSpec("t", key_bits=10)
    assert TableSpec.from_wire(spec.to_wire()) == spec and TableSpec.from_wire({"name": "t"}).key_bits == 0
    spec.check_keys(np.arange(1024, dtype=np.uint64))
    with pytest.raises(ConfigError, match=r"keys must be < 2\*\*10, got 5000 at index 2 \(1 such keys\); fold"):
        spec.check_keys(np.array([1, 2, 5000], np.uint64))


def test_a_dense_push_with_a_misplaced_key_is_refused_whole(h):
    (a,) = h.make(1)
    ring = Ring.create([1], 4)
    h.ring(ring, [TableSpec("d", 1, optimizer={"name": "sgd", "lr": 1.0}, key_bits=10)])
    keys = np.arange(100, dtype=np.uint64)
    routed = route_push(ring, keys, np.ones((keys.size, 1), np.float32), 10)
    wrong_vnode = routed.keys.copy()
    wrong_vnode[0] = routed.keys[-1]  # a key of another vnode in the first segment
    outside = routed.keys.copy()
    outside[-1] = 1 << 10
    part = routed.parts[0]
    for sent in (wrong_vnode, outside):
        h.replies.clear()
        h.deliver(a, {"op": "push", "table": "d", "ring_version": ring.version, "id": 1},
                  [sent, routed.grads, part.vnodes, part.counts])
        assert h.replies[-1][1]["op"] == "error" and "is dense" in h.replies[-1][1]["error"]
        h.deliver(a, {"op": "pull", "table": "d", "ring_version": ring.version, "id": 2},
                  [sent, part.vnodes, part.counts])
        assert h.replies[-1][1]["op"] == "error"
    assert len(a.tables["d"]) == 0
    h.push(ring, "d", keys, -np.ones((keys.size, 1), np.float32))
    assert len(a.tables["d"]) == keys.size and h.value(a, "d", 7) == 1.0


def test_dense_vnodes_move_whole_to_a_joining_server(h):
    a, n = h.make(1, 2)
    spec = TableSpec("d", 2, optimizer="adagrad", initializer={"name": "normal", "std": 0.1}, key_bits=14)
    ring = Ring.create([1], 4)
    h.ring(ring, [spec])
    keys = np.arange(1, 5000, dtype=np.uint64)
    h.push(ring, "d", keys, np.ones((keys.size, 2), np.float32))
    before = {int(k): h.value(a, "d", k) for k in keys[::50]}
    target = ring.with_server(2)
    moves = plan_moves(ring, target, {"d": 1})
    assert moves
    a.control_plane.on_migrate(Message({"op": "migrate", "migration": 3,
                                        "moves": [[t, v, d] for _, t, v, d in moves]}, []))
    h.pump()
    assert h.control[-1][1]["op"] == "migrated" and not h.control[-1][1]["failed"]
    h.ring(target, [spec])
    owner = target.owner_of_keys(keys[::50], 14)
    assert set(owner.tolist()) == {1, 2}
    for k, o in zip(keys[::50], owner):
        assert h.value(h.by_id(int(o)), "d", k) == before[int(k)]
    assert len(a.tables["d"]) + len(n.tables["d"]) == keys.size


def test_train_layout_auto_is_dense_when_the_key_space_is_small_enough():
    lr24 = TrainConfig(Model("lr"), DataFormat("criteo", hash_bits=24))
    assert lr24.table_spec().key_bits == 24  # 2**24 rows of 16 bytes: 256 MiB
    assert TrainConfig(Model("fm", k=8), DataFormat("criteo", hash_bits=24)).table_spec().key_bits == 0  # 1.2 GiB
    assert TrainConfig(Model("lr"), DataFormat("criteo")).table_spec().key_bits == 24  # the default: 24 bits
    assert TrainConfig(Model("lr"), DataFormat("criteo", hash_bits=0)).table_spec().key_bits == 0  # 64-bit keys
    assert TrainConfig(Model("lr"), DataFormat("criteo", hash_bits=24), layout="hash").table_spec().key_bits == 0
    assert TrainConfig(Model("fm", k=8), DataFormat("criteo", hash_bits=24),
                       layout="dense").table_spec().key_bits == 24
    with pytest.raises(ConfigError, match="--table-layout dense needs --hash-bits in"):
        TrainConfig(Model("lr"), DataFormat("criteo", hash_bits=0), layout="dense").table_spec()
    with pytest.raises(ConfigError, match="--table-layout must be one of"):
        TrainConfig(layout="sparse")


def test_train_layout_auto_is_a_hash_table_when_the_input_cannot_fill_the_arrays(tmp_path):
    """Issue 34: a dense table's 2**B rows are paid up front; auto takes one only for input
    of at least 64 bytes a row (2**24 rows: 1 GiB of text; a compressed file counts 4x its
    size) or a stream, whose size is not known.  10^6 heavy rows (260 MB) made 1.5 M keys:
    40 MB in a hash table against 256 MB of arrays."""
    from paramserver.data.reader import COMPRESSION_RATIO, input_bytes

    lr24 = TrainConfig(Model("lr"), DataFormat("criteo", hash_bits=24))
    fill = (1 << 24) * 64
    assert lr24.table_spec(input_bytes=fill - 1).key_bits == 0
    assert lr24.table_spec(input_bytes=fill).key_bits == 24
    assert lr24.table_spec(input_bytes=None).key_bits == 24  # a stream
    assert TrainConfig(Model("lr"), DataFormat("criteo", hash_bits=16)).table_spec(input_bytes=(1 << 16) * 64
                                                                                    ).key_bits == 16
    assert TrainConfig(Model("lr"), DataFormat("criteo", hash_bits=24), layout="dense"
                       ).table_spec(input_bytes=1).key_bits == 24  # asked for: given
    plain, packed = tmp_path / "a.tsv", tmp_path / "b.tsv.gz"
    plain.write_bytes(b"x" * 1000)
    packed.write_bytes(b"y" * 100)
    assert input_bytes([str(plain), str(packed)]) == 1000 + 100 * COMPRESSION_RATIO
    assert input_bytes(["-"]) is None


def test_a_resumed_auto_job_keeps_the_layout_its_checkpoint_has():
    """auto weighs the input; a job resumed with other input keeps the checkpoint's layout
    rather than being refused, while a layout asked for must match."""
    from paramserver.apps.ctr.resume import _check_tables

    dense = TrainConfig(Model("lr"), DataFormat("criteo", hash_bits=24)).table_spec(input_bytes=None)
    manifest = {"tables": {dense.name: dense.to_wire()}}
    auto = TrainConfig(Model("lr"), DataFormat("criteo", hash_bits=24))
    hashed = auto.table_spec(input_bytes=1000)
    assert hashed.key_bits == 0 and dense.key_bits == 24
    assert _check_tables("step", manifest, hashed, auto).key_bits == 24
    asked = TrainConfig(Model("lr"), DataFormat("criteo", hash_bits=24), layout="hash")
    with pytest.raises(ConfigError, match=r"--table-layout: the checkpoint has dense \(--hash-bits 24\), this command "
                                          "asks hash"):
        _check_tables("step", manifest, asked.table_spec(), asked)


@pytest.mark.parametrize("bits", [1, 3])
def test_a_dense_table_of_a_few_keys_is_made_with_its_loops_run_once(monkeypatch, bits):
    """Making a table runs its request loops once on a scratch table of its row
    (``store/exercise.loops``): within the few keys a small dense key space has (LDA's word
    blocks: ``key_bits`` 3), where a hash table's scratch takes enough keys to grow."""
    from paramserver.store import exercise
    from paramserver.store.vnodes import VnodeSet

    monkeypatch.setattr(exercise, "EXERCISED", set())  # as in a fresh server
    table = VnodeSet(TableSpec("t", 4, key_bits=bits, optimizer={"name": "sgd"}), 2, [0, 1])
    assert len(table) == 0 and exercise.EXERCISED
