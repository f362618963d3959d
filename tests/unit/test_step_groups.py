"""A step of several batches (``wire/step_groups.py``) on real ServerNodes in this process:
it changes the rows, and answers the scores and losses, that its batches sent as steps one
after the other would, bit for bit; each batch is applied once under its own number; a
malformed group, or one to a table with copies, changes nothing and says why."""

from __future__ import annotations

import numpy as np
import pytest
from harness import Harness
from test_step_requests import FTRL, _batch, _rows, _step

from paramserver.routing.partition import route_pull
from paramserver.routing.ring import Ring
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import decode, encode
from paramserver.wire.step_arrays import index_type, read_step_arrays
from paramserver.wire.step_groups import group_arrays, split_group


def _routed(h: Harness, ring: Ring, table: str, batch) -> tuple[int, list[np.ndarray]]:
    """``batch`` as a step's seven arrays (at their widest) and its server."""
    uniq, inverse, indptr, vals, labels = batch
    routed = route_pull(ring, uniq, h.nodes[0].tables[table].layout)
    (part,) = routed.parts
    rank = np.empty(uniq.size, np.int32)
    rank[routed.order] = np.arange(uniq.size, dtype=np.int32)
    return part.server, [routed.keys, part.vnodes, part.counts, rank[inverse], indptr, vals, labels]


def _joined(batches: list[list[np.ndarray]]) -> list[np.ndarray]:
    """What a client sends for ``batches`` (each a step's seven arrays): their arrays end to
    end, each batch's places as narrow as the widest batch allows, and their sizes."""
    index = index_type(max(b[0].shape[0] for b in batches))
    joined = [np.concatenate([b[i].astype(index) if i == 3 else b[i] for b in batches]) for i in range(7)]
    sizes = np.array([[b[0].shape[0], b[1].shape[0], b[6].shape[0]] for b in batches], np.int64).reshape(-1)
    return group_arrays(*joined, sizes)


def _group(h: Harness, ring: Ring, table: str, batches, seq: int, arrays=None, **fields) -> None:
    routed = [_routed(h, ring, table, b) for b in batches]
    header = {"op": "step", "table": table, "ring_version": ring.version, "id": 1, "model": "lr",
              "sender": 5, "seq": seq, "acked": seq - 1, "steps": len(batches), **fields}
    h.deliver(h.by_id(routed[0][0]), header, arrays if arrays is not None else _joined([a for _, a in routed]))


@pytest.mark.parametrize("ones", [False, True])
def test_a_step_of_several_batches_is_those_steps_in_turn_bit_for_bit(two, ones):
    (h, ring), (ref, ref_ring) = two
    batches = []
    for seed in range(5):  # keys from one pool: each batch reads what the ones before it left
        uniq, inverse, indptr, vals, labels = _batch(seed, n=10 + 7 * seed, keys=40)
        pool = np.random.default_rng(100 + seed).choice(120, 40, replace=False) + 1
        batches.append((pool.astype(np.uint64), inverse, indptr, np.ones_like(vals) if ones else vals, labels))
    for k, batch in enumerate(batches):
        _step(ref, ref_ring, "w", batch, narrow=True, sender=5, seq=k + 1, acked=k)
    _group(h, ring, "w", batches, seq=1)
    (answer,) = h.answers
    assert answer.header["op"] == "ok" and answer.header["losses"] == [a.header["loss"] for a in ref.answers]
    np.testing.assert_array_equal(answer.arrays[0], np.concatenate([a.arrays[0] for a in ref.answers]))
    keys = np.unique(np.concatenate([b[0] for b in batches]))
    np.testing.assert_array_equal(_rows(h, 1, "w", keys), _rows(ref, 1, "w", keys))
    assert np.abs(_rows(h, 1, "w", keys)).sum() > 0
    assert h.nodes[0].tables["w"].version == ref.nodes[0].tables["w"].version == len(batches)


def test_each_batch_of_a_group_is_applied_once_under_its_own_number(two):
    (h, ring), (ref, ref_ring) = two
    batches = [_batch(seed) for seed in range(3)]
    _step(h, ring, "w", batches[0], sender=5, seq=1, acked=0)  # the first batch got through alone
    _group(h, ring, "w", batches, seq=1)  # then the group numbered from it: the first is skipped
    for k, batch in enumerate(batches):
        _step(ref, ref_ring, "w", batch, sender=5, seq=k + 1, acked=k)
    keys = np.unique(np.concatenate([b[0] for b in batches]))
    np.testing.assert_array_equal(_rows(h, 1, "w", keys), _rows(ref, 1, "w", keys))
    before = _rows(h, 1, "w", keys)
    _group(h, ring, "w", batches, seq=1)  # a retry of the whole group: nothing applied again
    np.testing.assert_array_equal(_rows(h, 1, "w", keys), before)
    assert h.replies[-1][1]["op"] == "ok"


def _sizes_off(arrays):
    out = list(arrays)
    out[7] = out[7].copy()
    out[7][0] += 1
    return out


@pytest.mark.parametrize("change, said", [
    (_sizes_off, "must add up to its arrays'"),
    (lambda a: [*a[:7], a[7][:-1].copy()], "takes sizes <i8[6]"),
    (lambda a: a[:7], "takes 8 arrays"),
    (lambda a: [*a[:6], a[6][:-1].copy(), a[7]], "must add up"),
])
def test_a_malformed_step_of_several_batches_changes_nothing_and_says_what(two, change, said):
    (h, ring), _ = two
    batches = [_batch(1), _batch(2)]
    arrays = _joined([_routed(h, ring, "w", b)[1] for b in batches])
    _group(h, ring, "w", batches, seq=1, arrays=change(arrays))
    (_, answer), = h.replies
    assert answer["op"] == "error" and said in answer["error"]
    assert not _rows(h, 1, "w", np.concatenate([b[0] for b in batches])).any()


def test_a_batch_that_is_malformed_refuses_its_whole_group_before_any_is_applied(two):
    (h, ring), _ = two
    good, bad = _batch(1), _batch(2)
    bad = (bad[0], bad[1], bad[2], np.full_like(bad[3], np.nan), bad[4])
    _group(h, ring, "w", [good, bad], seq=1)
    (_, answer), = h.replies
    assert answer["op"] == "error" and "NaN or inf" in answer["error"]
    assert not _rows(h, 1, "w", good[0]).any()


def _last_segment(arrays, vnode):
    out = list(arrays)
    out[1] = out[1].copy()
    out[1][-1] = vnode
    return out


@pytest.mark.parametrize("vnode, said", [(10_000, "vnodes must be in"), (-1, "vnodes must be in")])
def test_a_later_batchs_segments_are_checked_before_any_batch_is_applied(two, vnode, said):
    """The batches share one header, checked once; each batch's own segments still are, the
    last batch's as the first's."""
    (h, ring), _ = two
    batches = [_batch(1), _batch(2)]
    arrays = _joined([_routed(h, ring, "w", b)[1] for b in batches])
    _group(h, ring, "w", batches, seq=1, arrays=_last_segment(arrays, vnode))
    (_, answer), = h.replies
    assert answer["op"] == "error" and said in answer["error"]
    assert not _rows(h, 1, "w", np.concatenate([b[0] for b in batches])).any()


def _changed(arrays, i, change):
    out = list(arrays)
    out[i] = out[i].copy()
    change(out[i])
    return out


def _twice(vnodes):  # the last batch's last segment names its first segment's vnode again
    vnodes[-1] = vnodes[-2]


def _falling(indptr):  # the last batch's last example ends before it starts
    indptr[-2] = indptr[-1] + 1


def _outside(inverse):  # the last occurrence names a key past the last batch's keys
    inverse[-1] = np.iinfo(inverse.dtype).max


@pytest.mark.parametrize("i, change, said", [
    (1, _twice, "a vnode more than once"),
    (2, lambda counts: counts.__setitem__(-1, counts[-1] + 1), "do not cover the"),
    (3, _outside, "names a key outside"),
    (4, _falling, "the offsets must start at 0, never fall"),
    (5, lambda vals: vals.__setitem__(-1, np.nan), "NaN or inf"),
])
def test_what_is_wrong_with_a_later_batch_is_said_as_for_a_batch_alone(two, i, change, said):
    """Each batch of a group is checked before any is applied: where a later one is at
    fault, the group is refused, nothing applied, with what that batch's own checks say."""
    (h, ring), _ = two
    batches = [_batch(1), _batch(2), _batch(3)]
    arrays = _joined([_routed(h, ring, "w", b)[1] for b in batches])
    if i == 4:  # offsets that fall go as offsets (a sender's rows' lengths cannot fall)
        arrays[4] = np.concatenate([b[2] for b in batches]).astype(np.int32)
    assert _routed(h, ring, "w", batches[2])[1][1].shape[0] >= 2  # the last batch names two vnodes or more
    _group(h, ring, "w", batches, seq=1, arrays=_changed(arrays, i, change))
    (_, answer), = h.replies
    assert answer["op"] == "error" and said in answer["error"], answer
    assert not _rows(h, 1, "w", np.concatenate([b[0] for b in batches])).any()


@pytest.mark.parametrize("steps", [0, 2.0, True, 10_000])
def test_a_step_naming_a_bad_number_of_batches_is_refused(two, steps):
    (h, ring), _ = two
    _group(h, ring, "w", [_batch(1), _batch(2)], seq=1, steps=steps)
    assert h.replies[-1][1]["op"] == "error" and "names 1 to" in h.replies[-1][1]["error"]


def test_a_step_of_several_batches_to_a_table_with_copies_is_refused_and_changes_nothing():
    h = Harness()
    try:
        h.make(1, 2)
        ring = Ring.create([1, 2], 4)
        h.ring(ring, [TableSpec("w", 1, optimizer=FTRL, replicas=2)])
        keys = np.arange(1, 100_000, dtype=np.uint64)
        mine = keys[ring.owners[ring.vnodes(keys)] == 1]
        batches = [(mine[60 * i:60 * (i + 1)], *_batch(i)[1:]) for i in range(2)]
        _group(h, ring, "w", batches, seq=1)
        h.pump()
        (_, answer), = h.replies
        assert answer["op"] == "error" and "without copies" in answer["error"]
        assert not _rows(h, 1, "w", mine[:120]).any() and not _rows(h, 2, "w", mine[:120]).any()
    finally:
        h.close()


def test_group_arrays_go_as_narrow_as_the_widest_batch_allows_and_split_back_exactly():
    small = [np.array([3, 9], np.uint64), np.array([0], np.int32), np.array([2], np.int64),
             np.array([0, 1, 1], np.uint16), np.array([0, 2, 3], np.int32), np.ones(3, np.float32),
             np.array([0, 1], np.float32)]
    big_keys = np.arange(1, 70_001, dtype=np.uint64) | np.uint64(1 << 32)  # past 32 bits, past 2^16 keys
    big = [big_keys, np.array([1], np.int32), np.array([70_000], np.int64), np.array([69_999, 0], np.int32),
           np.array([0, 2], np.int32), np.array([0.5, 1], np.float32), np.array([1], np.float32)]
    arrays = _joined([small, big])
    assert [a.dtype.str for a in arrays] == ["<u8", "<i4", "<i4", "<i4", "|u1", "<f4", "|u1", "<i8"]
    assert arrays[4].tolist() == [2, 1, 2]  # the rows' lengths: each batch's offsets from 0 once read
    parts = split_group(read_step_arrays(decode([bytes(f) for f in encode({"op": "step"}, arrays)]), 2), 2)
    for got, want in zip(parts, [small, big]):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    only_ones = _joined([small, small])
    assert only_ones[5].size == 0 and only_ones[3].dtype.str == "<u2"  # every value 1: none go
