"""The request loops (``store/loops/slots.py``) against the generic kernels: the same
rows, bit for bit, for every built-in rule, row width and storage; key 0, duplicates and
a vnode that grows in the middle of a request included; and a dense table's pushes
(``dense_apply_request``) against the dense generic kernels, with a misplaced key."""

import numpy as np
import pytest

from paramserver.errors import ProtocolError
from paramserver.routing.partition import route_push
from paramserver.routing.ring import Ring
from paramserver.store.specialize import MAX_DIM, request_loops
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.push_ops import OP_ADD
from paramserver.tables.spec import TableSpec

RULES = {"sgd": {"name": "sgd", "lr": 0.05}, "adagrad": {"name": "adagrad", "lr": 0.05},
         "ftrl": {"name": "ftrl", "alpha": 0.1, "beta": 1.0, "l1": 0.5, "l2": 0.1},
         "adam": {"name": "adam", "lr": 0.01}, "ftrl_adagrad": {"name": "ftrl_adagrad"},
         "rmsprop": {"name": "rmsprop", "lr": 0.01}}
RING = Ring.create([1], 16)


def pair(spec: TableSpec) -> tuple[VnodeSet, VnodeSet]:
    fast, generic = (VnodeSet(spec, RING.n_vnodes, range(RING.n_vnodes)) for _ in range(2))
    assert fast._loops is not None, "a built-in rule on a narrow table gets request loops"
    generic._loops = None
    return fast, generic


def request(keys: np.ndarray, grads: np.ndarray, layout: int = 0) -> tuple[np.ndarray, ...]:
    r = route_push(RING, keys, grads, layout, distinct=True)
    out = (r.keys, r.grads, r.parts[0].vnodes, r.parts[0].counts)
    for a in out:
        a.flags.writeable = False  # as frames arrive
    return out


def batches(dim: int, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """Requests over a growing key set: new keys in every one (vnodes grow mid-request),
    key 0 and 2**64 - 1, and a request with a duplicate key."""
    rng = np.random.default_rng(seed)
    out = []
    for size in (1, 7, 300, 5000, 20000):
        keys = np.unique(rng.integers(0, 40_000, size).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        keys = np.concatenate([keys, np.array([0, 2**64 - 1], np.uint64)])
        out.append(request(keys, rng.standard_normal((keys.size, dim)).astype(np.float32)))
    dup = np.array([5, 9, 5], np.uint64)
    out.append(request(dup, rng.standard_normal((3, dim)).astype(np.float32)))
    return out


def same_tables(a: VnodeSet, b: VnodeSet) -> None:
    assert len(a) == len(b)
    for v in a.tables:
        ka, ra = a.tables[v].items()
        kb, rb = b.tables[v].items()
        np.testing.assert_array_equal(ka, kb)
        assert ra.tobytes() == rb.tobytes(), f"vnode {v}: rows differ"


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("dim", [1, 3, MAX_DIM])
def test_updates_and_reads_are_the_generic_kernels_bit_for_bit(rule: str, dim: int) -> None:
    init = "zeros" if rule.startswith("ftrl") else {"name": "normal", "std": 0.1}  # FTRL's weights come from z, n
    fast, generic = pair(TableSpec("t", dim, optimizer=RULES[rule], initializer=init, seed=3))
    for keys, grads, vnodes, counts in batches(dim):
        fast.apply(vnodes, counts, keys, grads)
        generic.apply(vnodes, counts, keys, grads)
        out_fast, out_generic = (np.full((keys.size, dim), np.nan, np.float32) for _ in range(2))
        fast.lookup(vnodes, counts, keys, out_fast)
        generic.lookup(vnodes, counts, keys, out_generic)
        assert out_fast.tobytes() == out_generic.tobytes()
    same_tables(fast, generic)


@pytest.mark.parametrize("storage", ["fp16", "bf16"])
def test_sixteen_bit_rows_take_the_same_loops(storage: str) -> None:
    fast, generic = pair(TableSpec("t", 4, optimizer=RULES["ftrl"], storage=storage))
    for keys, grads, vnodes, counts in batches(4, seed=1):
        fast.apply(vnodes, counts, keys, grads)
        generic.apply(vnodes, counts, keys, grads)
    same_tables(fast, generic)


def test_keys_never_pushed_read_as_their_initial_value() -> None:
    fast, generic = pair(TableSpec("t", 2, optimizer=RULES["sgd"], initializer={"name": "uniform", "low": -1,
                                                                                 "high": 1}, seed=7))
    keys, _, vnodes, counts = batches(2)[3]
    out_fast, out_generic = np.zeros((keys.size, 2), np.float32), np.zeros((keys.size, 2), np.float32)
    fast.lookup(vnodes, counts, keys, out_fast)
    generic.lookup(vnodes, counts, keys, out_generic)
    assert out_fast.tobytes() == out_generic.tobytes()
    assert np.unique(out_fast).size > keys.size  # each key its own draw, not one default
    assert len(fast) == 0  # a read inserts nothing


def test_other_push_operations_keep_the_generic_kernels() -> None:
    fast, generic = pair(TableSpec("t", 1, optimizer=RULES["sgd"]))
    keys, grads, vnodes, counts = batches(1)[2]
    fast.apply(vnodes, counts, keys, grads, OP_ADD)
    generic.apply(vnodes, counts, keys, grads, OP_ADD)
    same_tables(fast, generic)


def test_only_narrow_built_in_rows_get_loops() -> None:
    assert request_loops(TableSpec("t", MAX_DIM + 1).optimizer, MAX_DIM + 1) is None
    wide = VnodeSet(TableSpec("d", MAX_DIM + 1, key_bits=10), RING.n_vnodes, range(RING.n_vnodes))
    assert wide._loops is None


def dense_batches(dim: int, bits: int, layout: int, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """Requests over a dense table's keys (< 2**bits), new and seen ones, key 0 and the last."""
    rng = np.random.default_rng(seed)
    out = []
    for size in (1, 7, 300, 3000, 3000):
        keys = np.unique(np.concatenate([rng.integers(0, 1 << bits, size), [0, (1 << bits) - 1]]).astype(np.uint64))
        out.append(request(keys, rng.standard_normal((keys.size, dim)).astype(np.float32), layout))
    return out


def dense_pair(rule: str, dim: int, storage: str = "float32") -> tuple[VnodeSet, VnodeSet]:
    init = "zeros" if rule.startswith("ftrl") else {"name": "normal", "std": 0.1}
    return pair(TableSpec("t", dim, optimizer=RULES[rule], initializer=init, seed=3, key_bits=12, storage=storage))


# every rule at dim 1 (LR's row), and wider rows of two (the per-width loops are the hash
# tables' own, checked above at 1, 3 and 16): each case compiles a loop on a cold cache
@pytest.mark.parametrize(("rule", "dim"), [(rule, 1) for rule in sorted(RULES)] + [("adagrad", MAX_DIM),
                                                                                   ("ftrl", 4)])
def test_a_dense_tables_pushes_are_the_generic_kernels_bit_for_bit(rule: str, dim: int) -> None:
    fast, generic = dense_pair(rule, dim)
    spec = fast.spec
    for keys, grads, vnodes, counts in dense_batches(dim, 12, spec.layout):
        fast.apply(vnodes, counts, keys, grads)
        generic.apply(vnodes, counts, keys, grads)
    same_tables(fast, generic)
    assert len(fast) > 3000  # most of the 4 096 keys, stored


@pytest.mark.parametrize("storage", ["fp16", "bf16"])
def test_sixteen_bit_dense_rows_take_the_same_loops(storage: str) -> None:
    fast, generic = dense_pair("ftrl", 4, storage)
    for keys, grads, vnodes, counts in dense_batches(4, 12, fast.spec.layout, seed=1):
        fast.apply(vnodes, counts, keys, grads)
        generic.apply(vnodes, counts, keys, grads)
    same_tables(fast, generic)


def test_a_dense_push_with_a_key_outside_its_vnode_applies_nothing() -> None:
    spec = TableSpec("t", 1, optimizer=RULES["ftrl"], key_bits=12)
    fast, _ = pair(spec)
    keys, grads, vnodes, counts = dense_batches(1, 12, spec.layout)[2]
    bad = keys.copy()
    bad[-1] = np.uint64(1 << 12)  # past the key space: in no vnode of this table
    bad.flags.writeable = False
    with pytest.raises(ProtocolError, match="is not in its vnode of this dense table"):
        fast.apply(vnodes, counts, bad, grads)
    assert len(fast) == 0  # checked whole before any row moved


def test_a_key_and_its_row_share_one_slot() -> None:
    table = VnodeSet(TableSpec("t", 1, optimizer=RULES["ftrl"]), RING.n_vnodes, [0])
    vt = table.tables[0]
    assert vt.keys.base is vt.rows.base is vt.slots  # one buffer: [key | w z n] a slot
    assert vt.rows.strides[0] == vt.keys.strides[0] == 8 + 3 * 4
    assert vt.nbytes == vt.slots.nbytes == (vt.capacity + 1) * 20 + 4  # and 4 to shift the slots by


@pytest.mark.parametrize("rule", ["clipped_sgd", "my_adagrad"])  # without state, and with a state and its init
@pytest.mark.parametrize("bits", [0, 12])  # hash and dense
def test_a_user_rule_takes_request_loops_of_its_own(rule: str, bits: int) -> None:
    extra = {"start": 1.0} if rule == "my_adagrad" else {}
    spec = TableSpec("t", 3, optimizer={"name": f"tests.unit.plugins.myrules:{rule}", "lr": 0.1, **extra},
                     key_bits=bits)
    fast, generic = pair(spec)
    for keys, grads, vnodes, counts in (dense_batches(3, 12, spec.layout, seed=2) if bits else batches(3, seed=2)):
        fast.apply(vnodes, counts, keys, grads)
        generic.apply(vnodes, counts, keys, grads)
    same_tables(fast, generic)
