"""Rows packed by their producer (``filters/packed.py``): a ``PackedRows`` stands for the dense
rows it was made from, reordered and cut by rows as the client routes a push, and put on the
wire by ``sparse`` as the bytes the dense rows would have become; LDA's changes made so
(``packed_changes``) are ``block_changes``' to the bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from paramserver.apps.rounds.lda_sampler import block_changes, packed_changes
from paramserver.client.core import Op, route
from paramserver.filters.base import Context
from paramserver.filters.chain import chains, pack
from paramserver.filters.packed import PackedRows
from paramserver.routing.ring import Ring
from paramserver.tables.spec import TableSpec


def _rows(rng: np.random.Generator, n: int, dim: int, density: float = 0.2) -> np.ndarray:
    rows = np.where(rng.random((n, dim)) < density, rng.normal(size=(n, dim)), 0).astype(np.float32)
    rows[rng.random((n, dim)) < 0.01] = -0.0  # a value too (its bits are not all zero)
    return rows


def _same(packed: PackedRows, rows: np.ndarray) -> None:
    assert packed.shape == rows.shape and packed.fits()
    np.testing.assert_array_equal(packed.dense().view(np.uint32), rows.view(np.uint32))


@pytest.mark.parametrize("dim", [1, 3, 8, 13, 64, 1000])
def test_packed_rows_reorder_and_cut_as_the_dense_rows_would(dim):
    rng = np.random.default_rng(dim)
    for n in (1, 2, 9, 40):
        rows = _rows(rng, n, dim)
        packed = PackedRows.from_dense(rows)
        _same(packed, rows)
        order = rng.permutation(n)
        _same(packed.take(order), rows[order])
        _same(packed.take(order[: n // 2]), rows[order[: n // 2]])
        assert packed.take(np.arange(n)) is packed  # in order already: no copy
        for lo in range(n):
            for hi in range(lo, n + 1):
                part = packed[lo:hi]
                _same(part, rows[lo:hi])
                # a run of rows is what sparse makes of those rows alone, byte for byte
                alone = PackedRows.from_dense(rows[lo:hi])
                np.testing.assert_array_equal(part.mask, alone.mask)
                np.testing.assert_array_equal(part.words, alone.words)


def test_arrays_that_do_not_say_what_they_pack_are_found_out():
    rows = _rows(np.random.default_rng(1), 6, 13)
    good = PackedRows.from_dense(rows)
    plain = dataclasses.replace(good, known=False)
    assert plain.fits()
    wrong = [dataclasses.replace(plain, words=plain.words[:-1]),  # a word fewer than the mask marks
             dataclasses.replace(plain, mask=plain.mask[:-1]),  # a mask shorter than the rows
             dataclasses.replace(plain, starts=plain.starts[::-1].copy()),  # rows' words where they are not
             dataclasses.replace(plain, words=plain.words.view(np.float32)),  # words not as bits
             dataclasses.replace(plain, n=7)]
    assert not any(p.fits() for p in wrong)
    nan = rows.copy()
    nan[2, 5] = np.nan
    assert good.finite() and not PackedRows.from_dense(nan).finite()


@pytest.mark.parametrize("dim", [5, 1000])
def test_a_push_of_packed_rows_goes_on_the_wire_as_the_dense_push_would(dim):
    """Routed over two servers' vnodes and packed by the chain, piece by piece: the same
    keys, header and bytes as the dense rows routed and packed the same way."""
    rng = np.random.default_rng(dim)
    ring = Ring.create([1, 2], 16)
    keys = rng.choice(1 << 12, 300, replace=False).astype(np.uint64)
    rows = _rows(rng, keys.size, dim, 0.05)
    chain = chains(TableSpec("t", 1, filters="push=sparse").filters)["push"]
    dense = route(ring, Op.PUSH, keys, rows, 12, distinct=True)
    packed = route(ring, Op.PUSH, keys, PackedRows.from_dense(rows), 12, distinct=True)
    assert len(dense) == len(packed) == 2
    for a, b in zip(dense, packed, strict=True):
        np.testing.assert_array_equal(a.keys, b.keys)
        fields_a, arrays_a = pack("push", chain, [a.keys, a.extra, a.vnodes, a.counts], Context())
        fields_b, arrays_b = pack("push", chain, [b.keys, b.extra, b.vnodes, b.counts], Context())
        assert fields_a == fields_b and fields_a["filters"][0][0] == "sparse"
        assert [x.tobytes() for x in arrays_a] == [x.tobytes() for x in arrays_b]


def test_rows_denser_than_packing_pays_for_go_as_they_are():
    rows = _rows(np.random.default_rng(2), 50, 40, density=0.9)
    chain = chains(TableSpec("t", 1, filters="push=sparse").filters)["push"]
    keys = np.arange(50, dtype=np.uint64)
    empty = np.zeros(0, np.int64)
    fields, arrays = pack("push", chain, [keys, PackedRows.from_dense(rows), empty, empty], Context())
    assert fields == {} and np.array_equal(arrays[1], rows)


@pytest.mark.parametrize("K", [1, 5, 8, 50, 1000, 1003])
def test_a_blocks_changes_packed_are_its_changes(K):
    rng = np.random.default_rng(K)
    pulled = np.where(rng.random((300, K)) < 0.1, rng.integers(1, 1 << 20, (300, K)), 0).astype(np.int32)
    counts = pulled.copy()
    for i in np.sort(rng.choice(300, 40, replace=False)):  # -1 at one topic, +2 at one
        counts[i, rng.integers(K)] -= 1
        counts[i, rng.integers(K)] += 2
    counts[7] = pulled[7]  # changed and changed back: not a change
    changed, delta = block_changes(counts, pulled)
    got, packed = packed_changes(counts, pulled)
    np.testing.assert_array_equal(got, changed)
    assert packed.known and dataclasses.replace(packed, known=False).fits()
    _same(packed, delta)
    alone = PackedRows.from_dense(delta)  # and packed as sparse packs those rows, bit for bit
    np.testing.assert_array_equal(packed.mask, alone.mask)
    np.testing.assert_array_equal(packed.words, alone.words)
    # a block's rows slice (a piece of it, as LDA samples it) is not contiguous with its neighbours
    block = np.zeros((400, K), np.int32)
    block[50:350] = counts
    got, packed = packed_changes(block[50:350], pulled)
    np.testing.assert_array_equal(got, changed)
    _same(packed, delta)
