"""A push of the keys a worker pulled takes their grouping from the pull (``RouteMemo``)
instead of hashing and sorting them again, and goes out exactly as it would have."""

import numpy as np
import pytest

from paramserver.client import core
from paramserver.client.core import RouteMemo, route
from paramserver.routing.hashing import layout_code
from paramserver.routing.partition import positioned
from paramserver.routing.ring import Ring
from paramserver.wire.message import Op


def _pieces(pieces):
    return [(p.server, p.ring_version, p.keys.tolist(), p.extra.tolist(), p.vnodes.tolist(), p.counts.tolist())
            for p in pieces]


@pytest.fixture
def batch():
    rng = np.random.default_rng(7)
    keys = rng.choice(1 << 20, 3000, replace=False).astype(np.uint64)  # distinct, in first-seen order
    grads = rng.normal(size=(keys.size, 2)).astype(np.float32)
    return Ring.create([1, 2, 3], 16), keys, grads


def _no_second_routing(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("the push's keys were routed again")
    monkeypatch.setattr(core, "route_push", refused)


@pytest.mark.parametrize("ordered", [False, True])
def test_a_push_of_the_pulled_keys_takes_their_routing_and_goes_out_the_same(batch, monkeypatch, ordered):
    ring, keys, grads = batch
    layout = 0
    if ordered:  # a dense layout without blocks: each vnode's keys by their position
        layout = layout_code(24)
        assert positioned(layout)
    fresh = _pieces(route(ring, Op.PUSH, keys, grads, layout, distinct=True, ordered=ordered))
    memo = RouteMemo()
    route(ring, Op.PULL, keys, None, layout, ordered=ordered, memo=memo)
    _no_second_routing(monkeypatch)
    assert _pieces(route(ring, Op.PUSH, keys, grads, layout, distinct=True, ordered=ordered, memo=memo)) == fresh


def test_keys_changed_in_place_since_their_pull_are_routed_afresh(batch):
    ring, keys, grads = batch
    memo = RouteMemo()
    route(ring, Op.PULL, keys, None, 0, memo=memo)
    keys[::7] += np.uint64(1)  # the same array, other keys
    fresh = _pieces(route(ring, Op.PUSH, keys.copy(), grads, 0, distinct=True))
    assert _pieces(route(ring, Op.PUSH, keys, grads, 0, distinct=True, memo=memo)) == fresh


@pytest.mark.parametrize("case", ["another ring", "another layout", "not distinct", "a copy of the keys"])
def test_a_push_the_pull_routing_does_not_fit_is_routed_afresh(batch, monkeypatch, case):
    ring, keys, grads = batch
    memo = RouteMemo()
    route(ring, Op.PULL, keys, None, 0, memo=memo)
    calls = []
    real = core.route_push
    monkeypatch.setattr(core, "route_push", lambda *a, **k: calls.append(1) or real(*a, **k))
    use_ring = Ring.create([1, 2, 3], 16, version=2) if case == "another ring" else ring
    layout = layout_code(20) if case == "another layout" else 0
    pushed = keys.copy() if case == "a copy of the keys" else keys
    distinct = case != "not distinct"
    got = route(use_ring, Op.PUSH, pushed, grads, layout, distinct=distinct, memo=memo)
    assert calls == [1], "the pull's routing was taken"
    assert _pieces(got) == _pieces(route(use_ring, Op.PUSH, pushed, grads, layout, distinct=distinct))


def test_a_pull_too_large_to_keep_is_not_kept(batch):
    ring, keys, _ = batch
    memo = RouteMemo()
    memo.MAX_KEYS = 100
    route(ring, Op.PULL, keys, None, 0, memo=memo)
    assert memo.push_routing(ring, keys, np.zeros((keys.size, 1), np.float32), 0, False) is None
