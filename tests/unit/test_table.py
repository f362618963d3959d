"""The per-vnode hash table against a Python dict."""

import numpy as np
import pytest

from paramserver.store import memory
from paramserver.store.loops import hash as hash_loops
from paramserver.store.table import GROWTH, MAX_LOAD, MIN_CAPACITY, SMALL_SLOTS, SMALL_STEPS, VnodeTable
from paramserver.tables.optim import FTRL, SGD, AdaGrad, Zeros

EDGE = np.array([0, 1, 2**63, 2**64 - 1, 2**64 - 2], np.uint64)


def test_random_inserts_and_lookups_match_a_dict():
    rng = np.random.default_rng(1)
    table = VnodeTable(2, SGD(lr=1.0), Zeros(), seed=0)
    ref: dict[int, np.ndarray] = {}
    for _ in range(30):
        keys = np.unique(np.concatenate([rng.integers(0, 5000, 300).astype(np.uint64), EDGE]))
        grads = rng.standard_normal((keys.size, 2)).astype(np.float32)
        table.apply(keys, grads)
        for k, g in zip(keys.tolist(), grads):
            ref[k] = ref.get(k, np.zeros(2, np.float32)) - g
    assert len(table) == len(ref)
    probe = np.array(sorted(ref) + [10**12, 7_777_777], np.uint64)
    out = np.empty((probe.size, 2), np.float32)
    table.lookup(probe, out)
    expected = np.array([ref[k] for k in sorted(ref)] + [[0, 0], [0, 0]], np.float32)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_growth_keeps_every_entry_and_the_load_bound():
    table = VnodeTable(1, SGD(lr=1.0), Zeros(), seed=0)
    keys = np.random.default_rng(2).permutation(200_000).astype(np.uint64)  # includes key 0
    for chunk in np.array_split(keys, 40):
        table.apply(chunk, np.full((chunk.size, 1), -1.0, np.float32))
        assert len(table) <= table.capacity * MAX_LOAD
    assert len(table) == keys.size
    out = np.empty((keys.size, 1), np.float32)
    table.lookup(keys, out)
    assert (out == 1.0).all()


def test_edge_keys_are_ordinary_keys():
    table = VnodeTable(1, SGD(lr=1.0), Zeros(), seed=0)
    grads = -np.arange(1, EDGE.size + 1, dtype=np.float32).reshape(-1, 1)
    table.apply(EDGE, grads)
    out = np.empty((EDGE.size, 1), np.float32)
    table.lookup(EDGE, out)
    np.testing.assert_array_equal(out[:, 0], np.arange(1, EDGE.size + 1))
    keys, rows = table.items()
    assert sorted(keys.tolist()) == sorted(EDGE.tolist())


def test_items_and_load_round_trip_value_and_state():
    rng = np.random.default_rng(3)
    src = VnodeTable(1, FTRL(), Zeros(), seed=0)
    keys = np.concatenate([rng.integers(1, 2**64 - 1, 5000, dtype=np.uint64), EDGE])
    src.apply(keys, rng.standard_normal((keys.size, 1)).astype(np.float32))
    dst = VnodeTable(1, FTRL(), Zeros(), seed=0)
    dst.load(*src.items())
    k1, r1 = src.items()
    k2, r2 = dst.items()
    o1, o2 = np.argsort(k1), np.argsort(k2)
    np.testing.assert_array_equal(k1[o1], k2[o2])
    np.testing.assert_array_equal(r1[o1], r2[o2])  # bitwise, state included


def test_memory_per_key_for_dim1_ftrl_stays_under_32_bytes():
    table = VnodeTable(1, FTRL(), Zeros(), seed=0)
    rng = np.random.default_rng(4)
    worst = 0.0
    for _ in range(50):
        keys = rng.integers(1, 2**64 - 1, 4000, dtype=np.uint64)
        table.apply(keys, np.ones((keys.size, 1), np.float32))
        worst = max(worst, table.nbytes / len(table))
    assert worst <= 32.0, worst


def test_a_vnode_grows_on_one_ladder_three_steps_at_a_time_while_small():
    """Every capacity a vnode takes is a step of the ×1.25 ladder from ``MIN_CAPACITY``, or
    one raised to fill its last huge page (``memory.huge_capacity``); under ``SMALL_SLOTS`` a
    growth climbs three of its steps, past it one: so a vnode past it ends at the capacity
    that one step at a time gives, and the bytes a key are as they were."""
    ladder = [MIN_CAPACITY]
    while ladder[-1] < 10**6:
        ladder.append(int(ladder[-1] * GROWTH) + 1)
    table = VnodeTable(1, FTRL(), Zeros(), seed=0)
    filled = {memory.huge_capacity(c, table.width, table.dtype): c for c in ladder}
    seen = [table.capacity]
    for key in range(1, 200_001):  # a key at a time: every growth is one the table chose
        table.apply(np.array([key], np.uint64), np.ones((1, 1), np.float32))
        if table.capacity != seen[-1]:
            seen.append(table.capacity)
    steps = [ladder.index(filled[c]) for c in seen]  # KeyError: off the ladder
    for before, after, cap in zip(steps, steps[1:], seen, strict=False):
        assert after - before == (SMALL_STEPS if cap < SMALL_SLOTS else 1), (cap, seen)
    assert any(c != filled[c] for c in seen), "a step past 2 MiB fills its last huge page"
    one_at_a_time = next(f for f, c in filled.items() if 200_000 <= int(f * MAX_LOAD))
    assert seen[-1] == one_at_a_time and len(seen) < len(ladder[:ladder.index(filled[one_at_a_time]) + 1])


def test_a_vnode_on_huge_pages_starts_on_one_and_fills_its_last_where_that_is_cheap():
    """From 2 MiB a vnode's slots start on a huge page's boundary (one mapped where it fell held
    a huge page less), and its capacity is raised to fill its last huge page only where that
    adds at most ``HUGE_SLACK`` of its bytes: else the tail stays on 4 KiB pages, as before."""
    width, dtype, huge = 3, np.dtype(np.float32), memory.HUGE_BYTES
    for capacity in (1000, 100_000, 150_000, 170_000, 188_278, 400_000, 1_000_000):
        nbytes = memory.slots_bytes(capacity, width, dtype)
        got = memory.huge_capacity(capacity, width, dtype)
        raised = memory.slots_bytes(got, width, dtype)
        assert got >= capacity and raised <= huge * -(-nbytes // huge), capacity
        if nbytes < huge or (-nbytes % huge) > nbytes * memory.HUGE_SLACK:
            assert got == capacity, capacity
        else:
            assert raised > huge * (nbytes // huge) and huge * -(-nbytes // huge) - raised < 20, capacity
        slots = memory.new_slots(got, width, dtype)
        assert slots.nbytes == raised and (nbytes < huge or slots.ctypes.data % huge == 0), capacity
    table = VnodeTable(1, FTRL(), Zeros(), seed=0, capacity=188_278)  # a vnode of 10^7 keys over 64
    assert table.capacity > 188_278 and 2 * huge - 20 < table.slots.nbytes <= 2 * huge
    assert table.slots.ctypes.data % huge == 0


@pytest.mark.parametrize(("optimizer", "dim", "storage"), [(FTRL(), 1, "float32"), (AdaGrad(), 5, "float32"),
                                                           (FTRL(), 2, "bf16")])
def test_a_rows_own_rehash_moves_every_key_as_the_generic_one(optimizer, dim, storage):
    """A table's growth moves its keys with the rehash compiled for its row's width
    (``specialize.RequestLoops.rehash``): the same slots and rows, to the bit, as the generic one."""
    own, generic = (VnodeTable(dim, optimizer, Zeros(), 7, storage=storage) for _ in range(2))
    assert own._rehash is not hash_loops.rehash
    generic._rehash = hash_loops.rehash
    rng = np.random.default_rng(3)
    for _ in range(6):  # each push past the load bound: several growths
        keys = rng.integers(1, 1 << 40, 3000).astype(np.uint64)
        grads = rng.standard_normal((3000, dim)).astype(np.float32)
        for t in (own, generic):
            t.apply(keys, grads)
    assert own.capacity == generic.capacity > 10_000
    np.testing.assert_array_equal(own.keys, generic.keys)
    np.testing.assert_array_equal(own.rows, generic.rows)
