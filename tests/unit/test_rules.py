"""Update rules as plug-ins (issue 14): a user's rule by name, against numpy; the push
operations; the built-ins as rules of the same kind."""

from __future__ import annotations

import math

import numpy as np
import pytest

import paramserver
from paramserver import ConfigError, TableSpec
from paramserver.routing.ring import Ring
from paramserver.store.table import VnodeTable
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.optim import RMSProp, Zeros
from paramserver.tables.push_ops import OP_ADD, OP_ASSIGN, OP_MAX, OP_MIN

RULES = "tests.unit.plugins.myrules"


def _set(spec: TableSpec) -> tuple[VnodeSet, Ring]:
    ring = Ring.create([1], 8)
    return VnodeSet(spec, ring.n_vnodes, range(ring.n_vnodes)), ring


def _push(table: VnodeSet, ring: Ring, keys, grads, op: int = 0) -> None:
    from paramserver.routing.partition import route_push

    routed = route_push(ring, np.asarray(keys, np.uint64), np.asarray(grads, np.float32), table.bits, distinct=True)
    part = routed.parts[0]
    table.apply(part.vnodes, part.counts, routed.keys, routed.grads, op)


def _pull(table: VnodeSet, ring: Ring, keys) -> np.ndarray:
    from paramserver.routing.partition import route_pull

    keys = np.asarray(keys, np.uint64)
    routed = route_pull(ring, keys, table.bits)
    out = np.empty((keys.size, table.spec.dim), np.float32)
    part = routed.parts[0]
    table.lookup(part.vnodes, part.counts, routed.keys, out)
    back = np.empty_like(out)
    back[routed.order] = out
    return back


@pytest.mark.parametrize("key_bits", [0, 12])
def test_a_user_rule_by_name_matches_numpy_exactly(key_bits):
    spec = TableSpec("w", dim=3, optimizer={"name": f"{RULES}:clipped_sgd", "lr": 0.5}, key_bits=key_bits)
    assert spec.optimizer.to_wire() == {"name": f"{RULES}:clipped_sgd", "lr": 0.5, "clip": 1.0}
    assert TableSpec.from_wire(spec.to_wire()) == spec
    table, ring = _set(spec)
    rng = np.random.default_rng(1)
    keys = np.unique(rng.integers(0, 4000, 200)).astype(np.uint64)
    want = np.zeros((keys.size, 3), np.float32)
    for _ in range(4):
        g = (rng.standard_normal((keys.size, 3)) * 2).astype(np.float32)
        _push(table, ring, keys, g)
        want -= np.float32(0.5) * np.clip(g, np.float32(-1), np.float32(1))
    np.testing.assert_array_equal(_pull(table, ring, keys), want)


def test_a_rule_with_state_and_init():
    spec = TableSpec("w", dim=2, optimizer={"name": f"{RULES}:my_adagrad", "lr": 0.1, "start": 1.0})
    assert spec.width == 4
    table = VnodeTable(2, spec.optimizer, Zeros(), 0)
    keys = np.array([5, 9], np.uint64)
    acc, w = np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32)
    for g in (np.array([[1, 2], [3, 4]], np.float32), np.array([[-1, 0.5], [2, -2]], np.float32)):
        table.apply(keys, g)
        acc += g * g
        w -= np.float32(0.1) * g / np.sqrt(acc)
    out = np.empty((2, 2), np.float32)
    table.lookup(keys, out)
    np.testing.assert_allclose(out, w, rtol=1e-6)
    _, rows = table.items()
    np.testing.assert_allclose(np.sort(rows[:, 2:], axis=0), np.sort(acc, axis=0))


@pytest.mark.parametrize("name,match", [
    ("nosuchmodule_xyz:rule", "module 'nosuchmodule_xyz' does not import .*PYTHONPATH"),
    (f"{RULES}:missing", "has no 'missing' .*it has: .*clipped_sgd"),
    (f"{RULES}:plain_function", "decorate plain_function with @paramserver.rule"),
    (f"{RULES}:not_numba", "does not compile for dim=1"),
])
def test_a_rule_that_cannot_be_used_is_refused_with_the_fix(name, match):
    with pytest.raises(ConfigError, match=match):
        _set(TableSpec("w", optimizer=name))


def test_a_rule_needs_its_parameters():
    with pytest.raises(ConfigError, match=r"needs \['lr', 'start'\]"):
        TableSpec("w", optimizer=f"{RULES}:my_adagrad")
    with pytest.raises(ConfigError, match="got unknown"):
        TableSpec("w", optimizer={"name": f"{RULES}:clipped_sgd", "momentum": 0.9})


def test_rmsprop_matches_numpy():
    table = VnodeTable(3, RMSProp(lr=0.01, rho=0.9, eps=1e-8), Zeros(), 0)
    keys = np.arange(1, 11, dtype=np.uint64)
    rng = np.random.default_rng(2)
    w, s = np.zeros((10, 3)), np.zeros((10, 3))
    for _ in range(5):
        g = rng.standard_normal((10, 3)).astype(np.float32)
        table.apply(keys, g)
        s = 0.9 * s + 0.1 * g.astype(np.float64) ** 2
        w -= 0.01 * g / (np.sqrt(s) + 1e-8)
    out = np.empty((10, 3), np.float32)
    table.lookup(keys, out)
    np.testing.assert_allclose(out, w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("key_bits", [0, 12])
def test_push_operations_set_the_values_and_leave_the_state(key_bits):
    spec = TableSpec("c", dim=2, optimizer="adagrad", key_bits=key_bits)
    table, ring = _set(spec)
    keys = np.array([1, 2, 3], np.uint64)
    _push(table, ring, keys, [[1, 1], [2, 2], [3, 3]], OP_ADD)
    _push(table, ring, keys, [[1, 1], [2, 2], [3, 3]], OP_ADD)
    np.testing.assert_array_equal(_pull(table, ring, keys), [[2, 2], [4, 4], [6, 6]])
    _push(table, ring, keys, [[5, 0], [3, 9], [-1, 6]], OP_MAX)
    np.testing.assert_array_equal(_pull(table, ring, keys), [[5, 2], [4, 9], [6, 6]])
    _push(table, ring, keys, [[0, 7], [3, 3], [8, -8]], OP_MIN)
    np.testing.assert_array_equal(_pull(table, ring, keys), [[0, 2], [3, 3], [6, -8]])
    _push(table, ring, keys[:2], [[0.5, 0.5], [7, 7]], OP_ASSIGN)
    np.testing.assert_array_equal(_pull(table, ring, keys), [[0.5, 0.5], [7, 7], [6, -8]])
    state = np.concatenate([vt.items()[1][:, 2:4] if not key_bits else vt.rows[:, 2:4] for vt in table.tables.values()])
    assert not state.any()  # adagrad's accumulators: untouched by add, max, min and assign
    _push(table, ring, keys[:1], [[1, 0]])  # and the rule still applies
    assert _pull(table, ring, keys[:1])[0, 0] < 0.5


def test_the_builtins_are_rules_of_the_same_kind():
    from paramserver.tables import update_rules

    value, state, grad = np.ones(3, np.float32), np.zeros(3, np.float32), np.full(3, 2, np.float32)
    update_rules.adagrad_rule.py_func(value, state, grad, np.array([0.5, 0.0], np.float64))
    np.testing.assert_allclose(value, 1 - 0.5 * 2 / 2)
    np.testing.assert_allclose(state, 4)
    assert isinstance(paramserver.rule(params=("lr",))(lambda v, s, g, hp: None), paramserver.Rule)
    assert math.isclose(RMSProp().lr, 0.001)


def test_ftrl_takes_its_reciprocal_alpha_and_one_vector_square_root():
    """FTRL's arithmetic multiplies by ``1 / alpha`` (kept after the fields in ``params()``)
    and takes its two square roots in one vector instruction: the rule's answer is the
    textbook one, from a row whose state is a float64 reference, to float32's rounding."""
    from numba import njit

    from paramserver._runtime.intrinsics import sqrt_pair
    from paramserver.tables import optim, update_rules

    @njit
    def pairs(a, b):
        out = np.empty((a.shape[0], 2))
        for i in range(a.shape[0]):
            out[i, 0], out[i, 1] = sqrt_pair(a[i], b[i])
        return out

    rng = np.random.default_rng(7)
    a, b = rng.random(1000) * 10.0 ** rng.integers(-30, 30, 1000), rng.random(1000)
    got = pairs(a, b)
    np.testing.assert_array_equal(got[:, 0], np.sqrt(a))  # IEEE square roots: the same bits
    np.testing.assert_array_equal(got[:, 1], np.sqrt(b))

    spec = optim.FTRL(alpha=0.065, beta=0.5, l1=0.01, l2=0.2)
    hp = spec.params()
    assert hp.shape == (5,) and hp[optim.FTRL_INV_ALPHA] == 1 / 0.065
    assert optim.FtrlAdagrad(alpha=0.16).params()[optim.FTRL_ADAGRAD_INV_ALPHA] == 1 / 0.16
    value, state = np.zeros(1, np.float32), np.zeros(2, np.float32)
    w, z, n = 0.0, 0.0, 0.0
    for g in rng.standard_normal(200) * 0.3:
        update_rules.ftrl_rule(value, state, np.array([g], np.float32), hp)
        g = float(np.float32(g))
        sigma = (math.sqrt(n + g * g) - math.sqrt(n)) / spec.alpha
        z, n = z + g - sigma * w, n + g * g
        shrunk = z - math.copysign(spec.l1, z)
        w = 0.0 if abs(z) <= spec.l1 else -shrunk / ((spec.beta + math.sqrt(n)) / spec.alpha + spec.l2)
        assert math.isclose(value[0], w, rel_tol=1e-5, abs_tol=1e-7), (value[0], w)
        assert math.isclose(state[0], z, rel_tol=1e-5, abs_tol=1e-6) and math.isclose(state[1], n, rel_tol=1e-5)
        w, z, n = float(value[0]), float(state[0]), float(state[1])  # the stored row, as the rule reads it next


def test_server_function_results_merge_as_declared():
    from paramserver.tables import functions as f

    keys = np.arange(1, 9, dtype=np.uint64)
    vals = np.arange(16, dtype=np.float32).reshape(8, 2) - 7
    halves = [(keys[:5], vals[:5]), (keys[5:], vals[5:])]  # two servers' rows
    sums = [f.run(f.column_sums, k, v, {}) for k, v in halves]
    np.testing.assert_array_equal(f.merge("sum", sums, {}), vals.sum(axis=0))
    tops = [f.run(f.top_k, k, v, {"k": 3, "signed": True}) for k, v in halves]
    k3, s3 = f.merge("topk", tops, {"k": 3})
    np.testing.assert_array_equal(k3, [8, 7, 6])
    np.testing.assert_array_equal(s3, vals[[7, 6, 5], 0])
    dots = [f.run(f.dot, k, v, {"vector": [1, 1]}) for k, v in halves]
    dk, dv = f.merge("concat", dots, {})
    np.testing.assert_array_equal(dk, keys)
    np.testing.assert_array_equal(dv, vals.sum(axis=1))
    with pytest.raises(ConfigError, match="vector must have 2 numbers"):
        f.run(f.dot, keys, vals, {"vector": [1, 2, 3]})
    with pytest.raises(ConfigError, match="args\\['k'\\], an int >= 1"):
        f.run(f.top_k, keys, vals, {"k": 0})
    bad = f.server_function(merge="concat")(lambda k, v, a: v)
    with pytest.raises(ConfigError, match="must return \\(keys, rows\\)"):
        f.run(bad, keys, vals, {})
    with pytest.raises(ConfigError, match="merge must be one of"):
        f.server_function(merge="mean")


def test_a_user_rules_kernels_are_cached_on_disk_and_keyed_by_what_they_are_compiled_from(tmp_path, monkeypatch):
    """Issue 33.5: a user rule recompiled for seconds at every cluster start.  Its kernels
    are cached beside an anchor file named by a digest of the rule's source, dim and the
    kernels' sources: a second process (here: the memo cleared) loads them from disk, and
    another dim or an edited rule gets another anchor, never a stale kernel."""
    import importlib
    import shutil
    import sys

    from paramserver.store import kernels

    spec = TableSpec("w", dim=3, optimizer={"name": f"{RULES}:clipped_sgd", "lr": 0.5})
    kernels.kernels_for(spec.optimizer, 3)  # compiled and cached (in a full run: cached by the tests above)
    monkeypatch.setattr(kernels, "_custom", {})
    again = kernels.kernels_for(spec.optimizer, 3)
    assert sum(again.apply.stats.cache_hits.values()) == 1 and not again.apply.stats.cache_misses

    monkeypatch.setenv("PARAMSERVER_CACHE_DIR", str(tmp_path / "cache"))
    anchor = kernels._anchor(spec.optimizer, 3)
    assert anchor is not None and anchor.startswith(str(tmp_path / "cache" / "rules"))
    assert kernels._anchor(spec.optimizer, 3) == anchor and kernels._anchor(spec.optimizer, 4) != anchor
    # the same rule name from an edited source file: another anchor
    pkg = tmp_path / "src"
    pkg.mkdir()
    shutil.copy(importlib.import_module(RULES).__file__, pkg / "edited_rules.py")
    monkeypatch.syspath_prepend(str(pkg))
    edited = TableSpec("w", dim=3, optimizer="edited_rules:clipped_sgd").optimizer
    before = kernels._anchor(edited, 3)
    with open(pkg / "edited_rules.py", "a") as f:
        f.write("\n# an edit\n")
    assert kernels._anchor(edited, 3) != before
    sys.modules.pop("edited_rules", None)


def test_a_rule_whose_cache_folder_cannot_be_written_still_compiles(tmp_path, monkeypatch):
    from paramserver.store import kernels

    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("PARAMSERVER_CACHE_DIR", str(blocked))
    spec = TableSpec("w", dim=3, optimizer={"name": f"{RULES}:clipped_sgd", "lr": 0.5})
    assert kernels._anchor(spec.optimizer, 3) is None
