"""Rows packed by the ``sparse`` filter added to a dense table where they land
(``VnodeSet.add_masked``, ``store/loops/masked.py``): the same rows as a push with op add
of the same values made dense, and nothing written where anything is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.filters.base import Context
from paramserver.filters.chain import chains, pack
from paramserver.filters.kernels import sparse_encode
from paramserver.routing.partition import route_push
from paramserver.routing.ring import Ring
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.push_ops import OP_ADD
from paramserver.tables.spec import TableSpec


def _tables(dim: int, bits: int = 12, **spec: object) -> tuple[Ring, VnodeSet, VnodeSet]:
    ring = Ring.create([1], 16)
    s = TableSpec("t", dim, optimizer="sgd", key_bits=bits, **spec)  # type: ignore[arg-type]
    return ring, VnodeSet(s, 16, range(16)), VnodeSet(s, 16, range(16))


def _rows(rng: np.random.Generator, n: int, dim: int, density: float) -> np.ndarray:
    values = rng.integers(-3, 4, (n, dim)).astype(np.float32)
    values[rng.random((n, dim)) > density] = 0
    return values


@pytest.mark.parametrize("dim", [1, 5, 8, 13, 1000])
@pytest.mark.parametrize("initializer", ["zeros", {"name": "uniform", "low": -0.5, "high": 0.5}])
def test_masked_rows_add_as_a_dense_push_would(dim, initializer):
    rng = np.random.default_rng(dim)
    ring, dense, masked = _tables(dim, initializer=initializer)
    for round_ in range(4):  # rows stored already, and rows seen for the first time
        keys = rng.choice(1 << 12, 300, replace=False).astype(np.uint64)
        routed = route_push(ring, keys, _rows(rng, keys.size, dim, 0.05 * (round_ + 1)), 12, distinct=True)
        part = routed.parts[0]
        dense.apply(part.vnodes, part.counts, routed.keys, routed.grads, OP_ADD)
        mask, words = sparse_encode(np.ascontiguousarray(routed.grads).reshape(-1).view(np.uint32))
        assert masked.add_masked(part.vnodes, part.counts, routed.keys, mask, words)
    for vnode in range(16):  # every row of the key space, its flag too
        a, b = dense.tables[vnode], masked.tables[vnode]
        np.testing.assert_array_equal(a.rows.view(np.uint32), b.rows.view(np.uint32))  # bit for bit, flags too
        assert len(a) == len(b)


def test_nothing_is_written_where_anything_is_wrong():
    rng = np.random.default_rng(1)
    ring, _, table = _tables(6)
    keys = np.arange(1, 41, dtype=np.uint64)
    routed = route_push(ring, keys, _rows(rng, keys.size, 6, 0.3), 12, distinct=True)
    part = routed.parts[0]
    mask, words = sparse_encode(np.ascontiguousarray(routed.grads).reshape(-1).view(np.uint32))
    before = [t.rows.copy() for t in table.tables.values()]
    nan = words.copy()
    nan[len(nan) // 2] = np.float32(np.nan).view(np.uint32)
    wrong_vnode = part.vnodes.copy()
    wrong_vnode[[0, -1]] = wrong_vnode[[-1, 0]]
    for args in ((part.vnodes, part.counts, routed.keys, mask, nan),  # a value not finite
                 (part.vnodes, part.counts, routed.keys, mask, words[:-1]),  # fewer words than marks
                 (part.vnodes, part.counts, routed.keys, mask[:-1], words),  # a mask too short
                 (wrong_vnode, part.counts, routed.keys, mask, words)):  # keys outside their vnodes
        assert not table.add_masked(*args)
    for t, rows in zip(table.tables.values(), before, strict=True):
        np.testing.assert_array_equal(t.rows, rows)
        assert len(t) == 0


@pytest.mark.parametrize("spec", [{"key_bits": 0}, {"storage": "fp16"}])
def test_tables_that_do_not_take_them_say_so(spec):
    ring = Ring.create([1], 4)
    table = VnodeSet(TableSpec("t", 4, optimizer="sgd", **{"key_bits": 10, **spec}), 4, range(4))
    keys = np.arange(1, 9, dtype=np.uint64)
    routed = route_push(ring, keys, np.ones((8, 4), np.float32), table.layout, distinct=True)
    mask, words = sparse_encode(np.ascontiguousarray(routed.grads).reshape(-1).view(np.uint32))
    assert not table.add_masked(routed.parts[0].vnodes, routed.parts[0].counts, routed.keys, mask, words)


def _pushes(h, ring, table, keys, values, seq, filtered=True):
    """``values`` pushed with op add as a client's numbered push (through the table's push
    filters where ``filtered``), one message a server."""
    routed = route_push(ring, keys, values, h.nodes[0].tables[table].layout, distinct=True)
    chain = chains(h.nodes[0].tables[table].spec.filters)["push"]
    for p in routed.parts:
        arrays = [routed.keys[p.start:p.stop], routed.grads[p.start:p.stop], p.vnodes, p.counts]
        fields, arrays = pack("push", chain, arrays, Context()) if filtered else ({}, arrays)
        header = {"op": "push", "table": table, "ring_version": ring.version, "id": seq, "push_op": "add",
                  "sender": 7, "seq": seq, "acked": -1, **fields}
        h.deliver(h.by_id(p.server), header, arrays)
        h.pump()


def test_a_server_adds_sparse_pushes_where_they_land_as_the_general_way_would(h):
    rng = np.random.default_rng(3)
    h.make(1)
    ring = Ring.create([1], 8)
    spec = TableSpec("counts", 100, optimizer="sgd", key_bits=10, filters="push=sparse")
    h.ring(ring, [spec, TableSpec("plain", 100, optimizer="sgd", key_bits=10)])
    node = h.by_id(1)
    taken = []
    add_masked = node.tables["counts"].add_masked
    node.tables["counts"].add_masked = lambda *a: taken.append(1) or add_masked(*a)
    for seq in range(5):
        keys = rng.choice(1 << 10, 200, replace=False).astype(np.uint64)
        values = _rows(rng, keys.size, 100, 0.05)
        _pushes(h, ring, "counts", keys, values, seq)
        _pushes(h, ring, "plain", keys, values, seq, filtered=False)
    assert len(taken) == 5 and all(header["op"] == "ok" for _, header in h.replies)
    _pushes(h, ring, "counts", keys, values, 4)  # a retry of the last push: applied once
    for vnode, t in node.tables["counts"].tables.items():
        np.testing.assert_array_equal(t.rows, node.tables["plain"].tables[vnode].rows)
    bad = values.copy()
    bad[3, 7] = np.nan
    h.replies.clear()
    _pushes(h, ring, "counts", keys, bad, 9)
    assert h.replies and all(header["op"] == "error" and "NaN" in header["error"] for _, header in h.replies)
    for vnode, t in node.tables["counts"].tables.items():  # nothing of the refused push was added
        np.testing.assert_array_equal(t.rows, node.tables["plain"].tables[vnode].rows)

