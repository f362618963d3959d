"""``Op.STEP`` on real ServerNodes in this process (the harness of the replication tests):
a step applies what a pull, the worker's kernel and a push of the same batch would, once
whatever the retries; its copies get the same rows; a malformed or unsuited step changes
nothing and says why."""

from __future__ import annotations

import re

import numpy as np
import pytest
from harness import STEP_FTRL, Harness

from paramserver.errors import ProtocolError
from paramserver.routing.partition import route_pull
from paramserver.routing.ring import Ring
from paramserver.tables.spec import TableSpec
from paramserver.tables.steps import logistic_step
from paramserver.wire.message import decode, encode
from paramserver.wire.step_arrays import read_step_arrays, step_arrays
from paramserver.wire.step_groups import group_arrays, split_group

FTRL = STEP_FTRL  # the fixture two's tables' rule (conftest.py)


def _batch(seed: int, n: int = 40, keys: int = 60):
    """A CSR batch over ``keys`` distinct keys: (distinct keys, inverse, indptr, vals, labels)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 8, n)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    inverse = rng.integers(0, keys, int(indptr[-1])).astype(np.int64)
    vals = rng.choice(np.array([1.0, 0.5, 2.0], np.float32), int(indptr[-1]))
    labels = (rng.random(n) < 0.3).astype(np.float32)
    uniq = (rng.permutation(10_000)[:keys] + 1).astype(np.uint64)
    return uniq, inverse, indptr, vals, labels


def _step(h: Harness, ring: Ring, table: str, batch, narrow: bool = False, **fields) -> None:
    """Deliver ``batch`` as one step to the server of its keys (one server must hold them all),
    every array at its widest; ``narrow``: each as narrow as it goes (``step_arrays``, as a client sends)."""
    uniq, inverse, indptr, vals, labels = batch
    routed = route_pull(ring, uniq, h.nodes[0].tables[table].layout)
    (part,) = routed.parts
    rank = np.empty(uniq.size, np.int32)
    rank[routed.order] = np.arange(uniq.size, dtype=np.int32)
    header = {"op": "step", "table": table, "ring_version": ring.version, "id": 1, "model": "lr", **fields}
    inside = inverse < uniq.size  # (an index past the keys goes as it is: a malformed step)
    wire = np.where(inside, rank[np.where(inside, inverse, 0)], inverse).astype(np.int32)
    arrays = [routed.keys, part.vnodes, part.counts, wire, indptr, vals, labels]
    h.deliver(h.by_id(part.server), header, step_arrays(*arrays) if narrow else arrays)


def _rows(h: Harness, server: int, table: str, keys: np.ndarray) -> np.ndarray:
    return np.array([h.value(h.by_id(server), table, k) or 0.0 for k in keys], np.float32)


def test_a_step_applies_what_pull_kernel_and_push_would_and_answers_the_scores(two):
    (h, ring), (ref, ref_ring) = two
    for seed in range(4):  # each batch on the rows the ones before left
        batch = _batch(seed)
        uniq, inverse, indptr, vals, labels = batch
        rows = _rows(ref, 1, "w", uniq).reshape(-1, 1)
        grads, loss, preds = logistic_step(indptr, vals, labels, inverse, rows, True)
        ref.push(ref_ring, "w", uniq, grads, sender=5, seq=seed + 1, acked=seed)
        h.replies.clear()
        _step(h, ring, "w", batch, sender=5, seq=seed + 1, acked=seed)
        (_, answer), = h.replies
        assert answer["op"] == "ok" and answer["loss"] == pytest.approx(loss, rel=1e-12)
        np.testing.assert_array_equal(_rows(h, 1, "w", uniq), _rows(ref, 1, "w", uniq))
    assert np.abs(_rows(h, 1, "w", uniq)).sum() > 0  # it learnt something


@pytest.mark.parametrize("ones", [True, False])
def test_a_step_sent_narrow_changes_the_same_rows_as_sent_wide(two, ones):
    (h, ring), (ref, ref_ring) = two
    for seed in range(3):
        uniq, inverse, indptr, vals, labels = _batch(seed)
        batch = (uniq, inverse, indptr, np.ones_like(vals) if ones else vals, labels)  # ones: a CTR row's features
        _step(ref, ref_ring, "w", batch, sender=5, seq=seed + 1, acked=seed)
        _step(h, ring, "w", batch, narrow=True, sender=5, seq=seed + 1, acked=seed)
        assert h.replies[-1][1] == {**ref.replies[-1][1]}
        np.testing.assert_array_equal(_rows(h, 1, "w", uniq), _rows(ref, 1, "w", uniq))
    assert np.abs(_rows(h, 1, "w", uniq)).sum() > 0


def test_a_factorization_machines_step_applies_what_its_pull_kernel_and_push_would():
    from paramserver.tables.steps import fm_step

    spec = TableSpec("fm", 5, optimizer={"name": "adagrad", "lr": 0.1},
                     initializer={"name": "normal", "std": 0.01, "zero_columns": 1})
    hs = [Harness(), Harness()]
    try:
        rings = []
        for h in hs:
            h.make(1)
            rings.append(Ring.create([1], 8))
            h.ring(rings[-1], [spec])
        (h, ref) = hs
        for seed in range(3):
            batch = _batch(seed)
            uniq, inverse, indptr, vals, labels = batch
            rows = np.array([[float(x) for x in _row(ref, "fm", k)] for k in uniq], np.float32)
            grads, loss, _ = fm_step(indptr, vals, labels, inverse, rows, True, 0.01)
            ref.push(rings[1], "fm", uniq, grads, sender=5, seq=seed + 1, acked=seed)
            _step(h, rings[0], "fm", batch, model="fm", l2=0.01, sender=5, seq=seed + 1, acked=seed)
            assert h.replies[-1][1]["loss"] == pytest.approx(loss, rel=1e-12)
            for k in uniq:
                np.testing.assert_array_equal(_row(h, "fm", k), _row(ref, "fm", k))
        _step(h, rings[0], "fm", _batch(9), model="fm", l2=-1.0, sender=5, seq=9, acked=3)
        assert "l2 must be a finite number >= 0" in h.replies[-1][1]["error"]
    finally:
        for one in hs:
            one.close()


def _row(h: Harness, table: str, key) -> np.ndarray:
    node = h.by_id(1)
    t = node.tables[table]
    out = np.empty((1, t.spec.dim), np.float32)
    v = node.ring.vnodes(np.array([key], np.uint64), t.layout)
    t.lookup(v.astype(np.int32), np.array([1], np.int64), np.array([key], np.uint64), out)
    return out[0]


def test_a_step_resent_with_its_seq_is_applied_once(two):
    (h, ring), _ = two
    batch = _batch(7)
    _step(h, ring, "w", batch, sender=5, seq=1, acked=0)
    once = _rows(h, 1, "w", batch[0])
    h.replies.clear()
    _step(h, ring, "w", batch, sender=5, seq=1, acked=0)  # a retry: answered, not applied again
    assert [r["op"] for _, r in h.replies] == ["ok"]
    np.testing.assert_array_equal(_rows(h, 1, "w", batch[0]), once)
    _step(h, ring, "w", batch, sender=5, seq=2, acked=1)  # the next step is
    assert not np.array_equal(_rows(h, 1, "w", batch[0]), once)


def test_a_step_reaches_the_copies_and_its_answer_waits_for_them():
    h = Harness()
    try:
        h.make(1, 2)
        ring = Ring.create([1, 2], 4)
        h.ring(ring, [TableSpec("w", 1, optimizer=FTRL, replicas=2)])
        uniq, inverse, indptr, vals, labels = _batch(3)
        keys = np.arange(1, 100_000, dtype=np.uint64)
        uniq = keys[ring.owners[ring.vnodes(keys)] == 1][:uniq.size]  # every key on server 1
        _step(h, ring, "w", (uniq, inverse, indptr, vals, labels), sender=5, seq=1, acked=0)
        assert not h.replies  # the copy has not answered yet
        h.pump()
        (server, answer), = h.replies
        assert server == 1 and answer["op"] == "ok" and "loss" in answer
        np.testing.assert_array_equal(_rows(h, 2, "w", uniq), _rows(h, 1, "w", uniq))
        assert np.abs(_rows(h, 2, "w", uniq)).sum() > 0
    finally:
        h.close()


@pytest.mark.parametrize("change, said", [
    (lambda b: (b[0], b[1] + 1000, *b[2:]), "outside the request's"),
    (lambda b: (b[0], b[1], b[2][::-1].copy(), *b[3:]), "offsets"),
    (lambda b: (*b[:3], np.full_like(b[3], np.nan), b[4]), "NaN or inf"),
    (lambda b: (*b[:4], b[4][:-1].copy()), "offsets"),
])
def test_a_malformed_step_changes_nothing_and_says_what(two, change, said):
    (h, ring), _ = two
    batch = change(_batch(1))
    _step(h, ring, "w", batch, sender=5, seq=1, acked=0)
    (_, answer), = h.replies
    assert answer["op"] == "error" and said in answer["error"]
    assert not _rows(h, 1, "w", batch[0]).any()


def _sent(arrays: list[np.ndarray], steps: int | None = None) -> list[np.ndarray]:
    """``arrays`` through the wire: encoded, decoded and read back at their canonical types
    (``steps``: a step of that many batches)."""
    return read_step_arrays(decode([bytes(f) for f in encode({"op": "step"}, arrays)]), steps)


def test_a_steps_arrays_go_as_narrow_as_their_values_allow_and_no_narrower():
    keys, vnodes, counts = np.array([3, (1 << 24) - 1], np.uint64), np.array([0], np.int32), np.array([2], np.int64)
    inverse, indptr = np.array([0, 1, 1], np.int32), np.array([0, 2, 3], np.int64)
    ones, halves = np.ones(3, np.float32), np.array([1, 0.5, 1], np.float32)
    narrow = step_arrays(keys, vnodes, counts, inverse, indptr, ones, np.array([0, 1], np.float32))
    assert [a.dtype.str for a in narrow] == ["|u1", "<i4", "<i4", "<u2", "|u1", "<f4", "|u1"]
    assert narrow[0].shape == (2, 3) and narrow[4].tolist() == [2, 1]  # three bytes a key; the rows' lengths
    assert narrow[5].size == 0  # every value 1: none go
    wider = step_arrays(keys + np.uint64(1), vnodes, counts, inverse, np.array([0, 2, 259], np.int64), ones,
                        np.array([0, 1], np.float32))  # a key at 2^24; a row of 257 occurrences
    assert [wider[0].dtype.str, wider[4].dtype.str] == ["<u4", "<i4"]
    wide = step_arrays(keys | np.uint64(1 << 32), vnodes, counts, inverse, indptr, halves,
                       np.array([0, 0.25], np.float32))  # a key past 32 bits, a value not 1, a soft label
    assert [a.dtype.str for a in wide] == ["<u8", "<i4", "<i4", "<u2", "|u1", "<f4", "<f4"]
    np.testing.assert_array_equal(wide[5], halves)
    assert wide[0][0] == (1 << 32) | 3 and wide[6][1] == np.float32(0.25)
    for sent, key_list, offsets in [(narrow, keys, indptr), (wider, keys + np.uint64(1), [0, 2, 259]),
                                    (wide, keys | np.uint64(1 << 32), indptr)]:
        back = _sent(sent)  # read back as the canonical types, to the bit
        assert [a.dtype.str for a in back] == ["<u8", "<i4", "<i8", "<u2", "<i8", "<f4", "<f4"]
        assert back[0].tolist() == key_list.tolist() and back[4].tolist() == list(offsets)
        assert back[2].tolist() == [2] and not any(a.flags.writeable for a in back)


def test_a_groups_rows_go_as_their_lengths_and_come_back_as_each_batchs_offsets_from_zero():
    """Three batches end to end, the middle one without examples: the lengths carry no batch's
    start, and the receiver puts each back from ``sizes``."""
    offsets = [np.array([0, 2, 2, 5]), np.array([0]), np.array([0, 1, 3])]
    indptr = np.concatenate(offsets).astype(np.int64)
    sizes = np.array([4, 1, 3, 0, 0, 0, 2, 1, 2], np.int64)
    keys = np.array([3, 9, 11, 12, 5, 7], np.uint64)
    arrays = group_arrays(keys, np.array([0, 1], np.int32), np.array([4, 2], np.int64),
                          np.array([0, 1, 1, 2, 3, 0, 1, 0], np.uint16), indptr, np.ones(8, np.float32),
                          np.array([0, 1, 1, 0, 1], np.float32), sizes)
    assert arrays[4].dtype.str == "|u1" and arrays[4].tolist() == [2, 0, 3, 1, 2]
    back = _sent(arrays, 3)
    np.testing.assert_array_equal(back[4], indptr)
    assert [p[4].tolist() for p in split_group(back, 3)] == [o.tolist() for o in offsets]


@pytest.mark.parametrize("at, form, said", [
    (0, np.zeros((2, 4), np.uint8), "keys must be 1-d <u8 or <u4 or |u1[n, 3] (three bytes a key), got 2-d |u1[2, 4]"),
    (4, np.array([2, 1, 9], np.uint8), "a step of 2 batches: its sizes name 5 examples, its rows' lengths 3"),
    (7, np.array([2, 1], np.int64), "a step of 2 batches takes sizes <i8[6]: each batch's keys, vnode segments"),
])
def test_a_step_whose_narrow_form_does_not_add_up_is_refused_by_name(at, form, said):
    """Refused before any loop reads them (``sizes`` past the lengths there are would have the
    offsets written past their array)."""
    keys, sizes = np.array([3, 9], np.uint64), np.array([1, 1, 3, 1, 1, 2], np.int64)
    arrays = group_arrays(keys, np.array([0, 1], np.int32), np.array([1, 1], np.int64), np.zeros(5, np.uint16),
                          np.array([0, 1, 2, 2, 0, 1, 1], np.int64), np.ones(5, np.float32),
                          np.zeros(5, np.float32), sizes)
    arrays[at] = form
    with pytest.raises(ProtocolError, match=re.escape(said)):
        _sent(arrays, 2)


def test_a_groups_sizes_whose_sum_wraps_around_to_its_rows_are_refused():
    """Four batches of 2^62 examples each sum to 0 in 64 bits: as many as an empty step's rows."""
    sizes = np.array([0, 0, 1 << 62] * 4, np.int64)
    arrays = [np.zeros((0, 3), np.uint8), np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.uint16),
              np.zeros(0, np.uint8), np.zeros(0, np.float32), np.zeros(0, np.uint8), sizes]
    with pytest.raises(ProtocolError, match=re.escape("a step of 4 batches: its sizes name 0 examples")):
        _sent(arrays, 4)


@pytest.mark.parametrize("at, bad", [(0, np.int64), (4, np.uint16), (6, np.float64), (1, np.int64)])
def test_a_step_whose_array_goes_as_a_type_it_may_not_is_refused_by_name(two, at, bad):
    (h, ring), _ = two
    uniq, inverse, indptr, vals, labels = _batch(1)
    routed = route_pull(ring, uniq, h.nodes[0].tables["w"].layout)
    (part,) = routed.parts
    arrays = [routed.keys, part.vnodes, part.counts, inverse.astype(np.int32), indptr, vals, labels]
    arrays[at] = arrays[at].astype(bad)
    h.deliver(h.by_id(part.server), {"op": "step", "table": "w", "ring_version": ring.version, "id": 1,
                                     "model": "lr", "sender": 5, "seq": 1, "acked": 0}, arrays)
    (_, answer), = h.replies
    name = ["keys", "vnodes", "counts", "inverse", "indptr", "vals", "labels"][at]
    assert answer["op"] == "error" and f"step: {name} must be 1-d" in answer["error"]
    assert not _rows(h, 1, "w", uniq).any()


@pytest.mark.parametrize("spec, said", [
    (TableSpec("w", 1, optimizer=FTRL, consistency="ssp:2"), "gated by clocks"),
    (TableSpec("w", 4, optimizer=FTRL), "rows of 1 float"),
])
def test_a_step_on_a_table_it_does_not_suit_is_refused_by_name(spec, said):
    h = Harness()
    try:
        h.make(1)
        ring = Ring.create([1], 8)
        h.ring(ring, [spec])
        _step(h, ring, "w", _batch(2), sender=5, seq=1, acked=0)
        (_, answer), = h.replies
        assert answer["op"] == "error" and said in answer["error"] and "pull and push instead" in answer["error"]
        _step(h, ring, "w", _batch(2), sender=5, seq=2, acked=1, model="svm")
        assert "model must be one of ['fm', 'lr']" in h.replies[-1][1]["error"]
    finally:
        h.close()


def test_a_step_the_primary_applied_and_forwarded_is_skipped_by_the_promoted_backup_as_a_push():
    """The primary applied a step and forwarded its gradient, then died unanswered: the client
    pushes the batch under the step's seq to the new primary, which had the forward: once."""
    h = Harness()
    try:
        h.make(1, 2)
        ring = Ring.create([1, 2], 4)
        spec = TableSpec("w", 1, optimizer=FTRL, replicas=2)
        h.ring(ring, [spec])
        uniq, inverse, indptr, vals, labels = _batch(4)
        keys = np.arange(1, 100_000, dtype=np.uint64)
        uniq = keys[ring.owners[ring.vnodes(keys)] == 1][:uniq.size]
        _step(h, ring, "w", (uniq, inverse, indptr, vals, labels), sender=5, seq=1, acked=0)
        h.pump()  # the backup applies the forward; the answer is lost with its server
        once = _rows(h, 2, "w", uniq)
        assert np.abs(once).sum() > 0
        survivor = h.by_id(2)
        survivor.control_plane.server_lost(1)
        new = Ring(ring.without_server(1).refilled().chains, ring.version + 1)
        h.ring(new, [spec], [survivor])
        h.replies.clear()
        grads = np.ones((uniq.size, 1), np.float32)  # whatever the client computed: skipped
        h.push(new, "w", uniq, grads, sender=5, seq=1, acked=0)
        h.pump([survivor])
        assert [r["op"] for _, r in h.replies] == ["ok"]
        np.testing.assert_array_equal(_rows(h, 2, "w", uniq), once)
    finally:
        h.close()
