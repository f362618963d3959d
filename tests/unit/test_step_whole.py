"""A step taken whole, in one compiled call (``server/steps._whole``,
``store/loops/step_groups.py``): a step of several batches changes the rows, and answers
the scores and losses, that its batches taken one by one (rows read, gradient, push) would,
bit for bit, through the growth of its vnodes and for a factorization machine; a step of one
batch too; a batch whose gradient is not finite stops it after the batches before it, each
of them recorded applied once, as batch by batch."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from harness import STEP_FTRL, Harness
from test_step_groups import _group
from test_step_requests import _rows, _step

import paramserver.server.steps as server_steps
from paramserver.routing.ring import Ring
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.spec import TableSpec


@pytest.fixture
def pair():
    """``pair(dim, optimizer)``: two harnesses, one server each, the same table ``t`` of ``dim``
    columns (FTRL by default; where the steps go, and the reference); closed at the end."""
    made = []

    def make(dim: int, optimizer: object = STEP_FTRL):
        out = []
        for _ in range(2):
            h = Harness()
            made.append(h)
            h.make(1)
            ring = Ring.create([1], 8)
            h.ring(ring, [TableSpec("t", dim, optimizer=optimizer)])
            out.append((h, ring))
        return out

    yield make
    for h in made:
        h.close()


@contextmanager
def _batch_by_batch(monkeypatch):
    """Within: a server takes every step batch by batch (rows read, gradient, push), the reference."""
    with monkeypatch.context() as m:
        m.setattr(server_steps, "_whole", lambda *a, **k: None)
        yield


def _batches(count: int, keys: int, pool: int, seed: int = 0, vals: float | None = None):
    """``count`` batches, each over ``keys`` distinct keys drawn from ``pool``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = keys // 2
        lengths = rng.integers(1, 9, n)
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        inverse = rng.integers(0, keys, int(indptr[-1])).astype(np.int64)
        values = rng.choice(np.array([1.0, 0.5, 2.0], np.float32), int(indptr[-1])) if vals is None \
            else np.full(int(indptr[-1]), vals, np.float32)
        labels = (rng.random(n) < 0.3).astype(np.float32)
        uniq = (rng.choice(pool, keys, replace=False) + 1).astype(np.uint64)
        out.append((uniq, inverse, indptr, values, labels))
    return out


@pytest.fixture
def whole_calls(monkeypatch):
    """Whether each group on table ``t`` went through ``VnodeSet.steps`` whole (not one by one)."""
    calls = []
    real = VnodeSet.steps

    def counted(self, *args, **kwargs):
        done = real(self, *args, **kwargs)
        if self.spec.name == "t":  # (not a new table's warm-up, ``store/exercise.loops``)
            calls.append(done is not None)
        return done

    monkeypatch.setattr(VnodeSet, "steps", counted)
    return calls


USER_RULE = {"name": "tests.unit.plugins.myrules:my_adagrad", "lr": 0.1, "start": 1.0}


@pytest.mark.parametrize(("model", "dim", "optimizer"), [("lr", 1, STEP_FTRL), ("fm", 5, STEP_FTRL),
                                                         ("fm", 3, {"name": "adagrad", "lr": 0.05}),
                                                         ("lr", 1, USER_RULE)])
def test_a_group_taken_whole_is_its_batches_in_turn_through_the_growth_of_its_vnodes(whole_calls, monkeypatch, pair,
                                                                                        model, dim, optimizer):
    """Each batch's keys read once and updated where the read found them (``apply_found``),
    the keys not stored claimed as a push claims them: the same rows and slots, any rule."""
    (h, ring), (ref, ref_ring) = pair(dim, optimizer)
    batches = _batches(6, keys=700, pool=3000)  # ~2 600 keys over 8 vnodes: each grows within the group
    with _batch_by_batch(monkeypatch):  # the reference: each batch a step, taken as a pull, kernel and push
        for k, batch in enumerate(batches):
            _step(ref, ref_ring, "t", batch, narrow=True, sender=5, seq=k + 1, acked=k, model=model)
    _group(h, ring, "t", batches, seq=1, model=model)
    assert whole_calls == [True]
    (answer,) = h.answers
    assert answer.header["op"] == "ok", answer.header
    assert answer.header["losses"] == [a.header["loss"] for a in ref.answers]
    np.testing.assert_array_equal(answer.arrays[0], np.concatenate([a.arrays[0] for a in ref.answers]))
    keys = np.unique(np.concatenate([b[0] for b in batches]))
    ours, theirs = h.nodes[0].tables["t"], ref.nodes[0].tables["t"]
    assert len(ours) == len(theirs) == keys.size
    for v, vt in theirs.tables.items():  # every row, value and state, to the bit
        # and every key in the slot a push claims (a missing key's claim starts where its read's probe ended)
        np.testing.assert_array_equal(ours.tables[v].keys, vt.keys)
        want_keys, want_rows = vt.items()
        got_keys, got_rows = ours.tables[v].items()
        order, got_order = np.argsort(want_keys), np.argsort(got_keys)
        np.testing.assert_array_equal(got_keys[got_order], want_keys[order])
        np.testing.assert_array_equal(got_rows[got_order], want_rows[order])
    assert ours.version == theirs.version == len(batches)


def test_a_batch_whose_gradient_is_not_finite_stops_the_group_after_the_ones_before_it(whole_calls, monkeypatch, pair):
    (h, ring), (ref, ref_ring) = pair(1)
    batches = _batches(3, keys=40, pool=200, seed=1)
    uniq = batches[1][0]  # batch 1: one example naming one key four times, at a value near float32's
    batches[1] = (uniq, np.zeros(4, np.int64), np.array([0, 4], np.int64),  # largest: its gradient is inf
                  np.full(4, 3e38, np.float32), np.ones(1, np.float32))
    _group(h, ring, "t", batches, seq=1)
    assert whole_calls == [True]
    with _batch_by_batch(monkeypatch):  # the reference: the same group batch by batch
        _group(ref, ref_ring, "t", batches, seq=1)
    (ours,), (theirs,) = h.answers, ref.answers
    assert ours.header["op"] == theirs.header["op"] == "error"
    assert ours.header["error"] == theirs.header["error"]
    assert "grads contain NaN or inf" in ours.header["error"]
    keys = np.unique(np.concatenate([b[0] for b in batches]))
    np.testing.assert_array_equal(_rows(h, 1, "t", keys), _rows(ref, 1, "t", keys))
    assert np.abs(_rows(h, 1, "t", batches[0][0])).sum() > 0  # batch 0 went in
    assert not np.abs(_rows(h, 1, "t", np.setdiff1d(batches[2][0], batches[0][0]))).any()  # batch 2 did not
    before = _rows(h, 1, "t", keys)
    _step(h, ring, "t", batches[0], narrow=True, sender=5, seq=1, acked=0)  # batch 0 again: on record once
    np.testing.assert_array_equal(_rows(h, 1, "t", keys), before)
    assert h.nodes[0].tables["t"].version == ref.nodes[0].tables["t"].version == 1


def test_a_step_of_one_batch_is_taken_whole_as_its_pull_kernel_and_push_would(whole_calls, monkeypatch, pair):
    (h, ring), (ref, ref_ring) = pair(1)
    batches = _batches(3, keys=500, pool=1500, seed=2)
    with _batch_by_batch(monkeypatch):
        for k, batch in enumerate(batches):
            _step(ref, ref_ring, "t", batch, narrow=True, sender=5, seq=k + 1, acked=k)
    for k, batch in enumerate(batches):
        _step(h, ring, "t", batch, narrow=True, sender=5, seq=k + 1, acked=k)
    assert whole_calls == [True, True, True]
    assert [a.header for a in h.answers] == [a.header for a in ref.answers]
    for ours, theirs in zip(h.answers, ref.answers, strict=True):
        np.testing.assert_array_equal(ours.arrays[0], theirs.arrays[0])
    keys = np.unique(np.concatenate([b[0] for b in batches]))
    np.testing.assert_array_equal(_rows(h, 1, "t", keys), _rows(ref, 1, "t", keys))
    assert np.abs(_rows(h, 1, "t", keys)).sum() > 0
