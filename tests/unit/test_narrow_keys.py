"""``TableSpec(key_bytes=4)``: a hash table that keeps each key in 4 bytes (a dim-1 FTRL slot
of 16 bytes, not 20) holds, reads, updates, grows, exports and installs the same rows as one of
8-byte keys, to the bit; a key past 2**32 is refused by the client and by the server, by name;
``train`` takes 4-byte keys where its features are folded to 32 bits or fewer."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.errors import ConfigError, ProtocolError
from paramserver.routing.ring import Ring
from paramserver.server.requests import check_segments
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.optim import FTRL, AdaGrad, Zeros
from paramserver.tables.spec import TableSpec

N_VNODES = 4


def _frozen(*arrays):
    for a in arrays:
        a.flags.writeable = False
    return arrays


def _request(keys: np.ndarray, ring: Ring):
    """``keys`` grouped by vnode, as a request brings them: vnodes, counts, keys (read-only)."""
    vnodes = ring.vnodes(keys, 0)
    order = np.argsort(vnodes, kind="stable")
    segs, counts = np.unique(vnodes[order], return_counts=True)
    return _frozen(segs.astype(np.int32), counts.astype(np.int64), np.ascontiguousarray(keys[order]))


def _sorted_items(table: VnodeSet):
    keys, rows = [], []
    for vt in table.hash_vnodes.values():
        k, r = vt.items()
        keys.append(k)
        rows.append(r)
    keys_all, rows_all = np.concatenate(keys), np.concatenate(rows)
    order = np.argsort(keys_all)
    return keys_all[order], rows_all[order]


@pytest.mark.parametrize(("dim", "optimizer", "lifecycle"), [(1, FTRL(), None), (5, AdaGrad(lr=0.05), None),
                                                             (1, FTRL(), "track")])
def test_a_table_of_4_byte_keys_holds_the_rows_one_of_8_byte_keys_does(dim, optimizer, lifecycle):
    ring = Ring.create([1], N_VNODES)
    tables = {b: VnodeSet(TableSpec("t", dim, optimizer=optimizer, initializer=Zeros(), key_bytes=b,
                                    lifecycle=lifecycle), N_VNODES, range(N_VNODES)) for b in (8, 4)}
    assert tables[4].tables[0].keys.dtype == np.uint32 and tables[8].tables[0].keys.dtype == np.uint64
    rng = np.random.default_rng(1)
    for batch in range(30):  # pushes past several growths of every vnode, key 0 and 2**32 - 1 among them
        keys = np.unique(rng.integers(0, 1 << 32, 700, dtype=np.uint64))
        if batch % 7 == 0:
            keys = np.unique(np.concatenate([keys, np.array([0, (1 << 32) - 1], np.uint64)]))
        grads = rng.standard_normal((keys.shape[0], dim)).astype(np.float32)
        vnodes, counts, grouped = _request(keys, ring)
        order = np.argsort(ring.vnodes(keys, 0), kind="stable")
        (g,) = _frozen(np.ascontiguousarray(grads[order]))
        outs = {}
        for b, table in tables.items():
            assert table.check(vnodes, counts, grouped) == -1
            table.apply(vnodes, counts, grouped, g)
            outs[b] = np.empty((grouped.shape[0], dim), np.float32)
            table.lookup(vnodes, counts, grouped, outs[b])
        assert np.array_equal(outs[4], outs[8])
    (k8, r8), (k4, r4) = _sorted_items(tables[8]), _sorted_items(tables[4])
    assert k4.dtype == np.uint64 and np.array_equal(k4, k8) and np.array_equal(r4, r8)
    row = tables[4].tables[0].rows.shape[1] * 4
    assert {vt.keys.strides[0] for vt in tables[4].hash_vnodes.values()} == {4 + row}  # a slot 4 bytes smaller
    assert {vt.keys.strides[0] for vt in tables[8].hash_vnodes.values()} == {8 + row}
    copy = VnodeSet(TableSpec("t", dim, optimizer=optimizer, initializer=Zeros(), key_bytes=4,
                              lifecycle=lifecycle), N_VNODES, range(N_VNODES))
    for v, vt in tables[4].hash_vnodes.items():  # a vnode's copy received (a repair, a restore)
        copy.install(v, *vt.items())
    kc, rc = _sorted_items(copy)
    assert np.array_equal(kc, k8) and np.array_equal(rc, r8)


def test_a_slot_of_a_dim_1_ftrl_row_is_16_bytes():
    table = VnodeSet(TableSpec("t", 1, optimizer=FTRL(), key_bytes=4), 1, [0])
    vt = table.tables[0]
    assert vt.keys.strides == (16,) and vt.rows.strides == (16, 4)
    assert vt.keys.ctypes.data % 16 == 0  # four slots a cache line, none across two


def test_a_key_past_2_32_is_refused_by_the_client_and_the_server():
    spec = TableSpec("t", 1, optimizer=FTRL(), key_bytes=4)
    keys = np.array([5, 1 << 32, 7], np.uint64)
    with pytest.raises(ConfigError, match=r"4-byte keys \(key_bytes=4\): keys must be < 2\*\*32, got 4294967296"):
        spec.check_keys(keys)
    spec.check_keys(keys.astype(np.uint32))  # 4 bytes wide: nothing to check
    TableSpec("t", 1, optimizer=FTRL()).check_keys(keys)  # 8-byte keys: any key
    ring = Ring.create([1], N_VNODES)
    table = VnodeSet(spec, N_VNODES, range(N_VNODES))
    vnodes, counts, grouped = _request(keys, ring)
    with pytest.raises(ProtocolError, match=r"table 't' stores 4-byte keys \(key_bytes=4\): key 4294967296 is not"):
        check_segments(table, ring, grouped, vnodes, counts, None, 1, ring.version)


@pytest.mark.parametrize(("fields", "said"), [({"key_bytes": 5}, "must be 8"), ({"key_bytes": True}, "must be 8"),
                                              ({"key_bytes": 4, "key_bits": 8}, "dense"),
                                              ({"key_bytes": 4, "storage": "bf16"}, "rows are bf16"),
                                              ({"key_bytes": 4, "memory": 1 << 20}, "memory budget")])
def test_a_spec_says_where_4_byte_keys_do_not_go(fields, said):
    with pytest.raises(ConfigError, match=said):
        TableSpec("t", 1, **fields)


def test_a_spec_of_4_byte_keys_goes_on_the_wire_and_back():
    spec = TableSpec("t", 3, optimizer=AdaGrad(), key_bytes=4)
    assert spec.to_wire()["key_bytes"] == 4 and "key_bytes" not in TableSpec("t").to_wire()
    assert TableSpec.from_wire(spec.to_wire()) == spec
    with pytest.raises(ConfigError, match="key_bytes"):
        TableSpec.from_wire({"name": "t", "key_bytes": "4"})


@pytest.mark.parametrize(("changes", "key_bytes"), [({}, 4), ({"hash_bits": 32}, 4), ({"hash_bits": 0}, 8),
                                                    ({"storage": "bf16"}, 8), ({"table_memory": "64M"}, 8),
                                                    ({"layout": "dense"}, 8)])
def test_train_keeps_its_features_in_4_bytes_where_they_are_folded_to_32_bits(changes, key_bytes):
    from dataclasses import replace

    from paramserver.data.batch import DataFormat

    cfg = TrainConfig()
    if "hash_bits" in changes:
        cfg = replace(cfg, data=DataFormat(hash_bits=changes.pop("hash_bits")))
    cfg = replace(cfg, **changes)
    assert cfg.table_spec(1 << 20).key_bytes == key_bytes
