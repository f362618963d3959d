"""Client-side routing: grouping by server and vnode, duplicate merging."""

import numpy as np
import pytest

from paramserver import Ring
from paramserver.routing.hashing import layout_code
from paramserver.routing.partition import route_pull, route_push, scatter_answer, scatter_rows
from paramserver.routing.steps import every_value_one, route_steps


def _check_parts(ring, routed, bits=0):
    for part in routed.parts:
        keys = routed.keys[part.start:part.stop]
        assert (ring.owner_of_keys(keys, bits) == part.server).all()
        np.testing.assert_array_equal(np.repeat(part.vnodes, part.counts), ring.vnodes(keys, bits))
    assert sum(p.stop - p.start for p in routed.parts) == routed.keys.size
    assert len({p.server for p in routed.parts}) == len(routed.parts)


def test_pull_routing_keeps_every_key_and_restores_the_callers_order():
    ring = Ring.create([1, 2, 3], 16)
    rng = np.random.default_rng(0)
    keys = np.concatenate([rng.integers(0, 1000, 5000).astype(np.uint64),
                           np.array([0, 2**64 - 1], np.uint64)])
    routed = route_pull(ring, keys)
    _check_parts(ring, routed)
    np.testing.assert_array_equal(routed.keys, keys[routed.order])
    out = np.empty((keys.size, 1), np.float32)
    scatter_rows(routed.keys.astype(np.float32).reshape(-1, 1), routed.order, out)
    np.testing.assert_array_equal(out[:, 0], keys.astype(np.float32))


def test_push_routing_sums_duplicates():
    ring = Ring.create([1, 2], 64)
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 300, 10_000).astype(np.uint64)
    grads = rng.standard_normal((keys.size, 4)).astype(np.float32)
    routed = route_push(ring, keys, grads)
    _check_parts(ring, routed)
    assert routed.keys.size == np.unique(keys).size
    for k, g in zip(routed.keys[:50], routed.grads[:50]):
        np.testing.assert_allclose(g, grads[keys == k].sum(axis=0), rtol=1e-4, atol=1e-4)


def test_a_distinct_push_routes_like_a_merged_one():
    ring = Ring.create([1, 2, 3], 16)
    rng = np.random.default_rng(2)
    for bits in (0, 20):
        keys = rng.permutation(1 << 20)[:5000].astype(np.uint64)
        grads = rng.standard_normal((keys.size, 3)).astype(np.float32)
        merged, plain = route_push(ring, keys, grads, bits), route_push(ring, keys, grads, bits, distinct=True)
        _check_parts(ring, plain, bits)
        assert [(p.server, p.start, p.stop) for p in plain.parts] == [(p.server, p.start, p.stop) for p in merged.parts]
        for p, q in zip(plain.parts, merged.parts):
            np.testing.assert_array_equal(p.vnodes, q.vnodes)
            np.testing.assert_array_equal(p.counts, q.counts)
        np.testing.assert_array_equal(plain.keys, merged.keys)
        np.testing.assert_array_equal(plain.grads, merged.grads)


def test_empty_batch():
    ring = Ring.create([1], 8)
    assert route_pull(ring, np.zeros(0, np.uint64)).parts == []
    assert route_push(ring, np.zeros(0, np.uint64), np.zeros((0, 2), np.float32)).parts == []


def test_unique_inverse_matches_a_first_seen_reference_whatever_the_table_starts_at():
    from paramserver.routing.dedup import unique_inverse

    rng = np.random.default_rng(3)
    for keys in (np.zeros(0, np.uint64), np.array([7], np.uint64), np.array([2**64 - 1, 0, 2**64 - 1], np.uint64),
                 rng.integers(0, 50, 2000).astype(np.uint64),  # few distinct keys
                 rng.integers(0, 2**63, 5000).astype(np.uint64),  # all distinct: the table doubles many times
                 (rng.zipf(1.2, 20000) % 100_000).astype(np.uint64),
                 # keys below 2^32 - 1 pack a slot a word; the first that does not (here at 2^32 - 1 and
                 # 2^32, past 3 000 packed keys) sends the batch to the general table
                 np.concatenate([rng.integers(0, 2**24, 3000), [2**32 - 2, 2**32 - 1, 5, 2**32 - 1, 2**32, 7]])
                 .astype(np.uint64),
                 np.array([3, 2**32 - 1, 3, 2**32 - 2, 2**32 - 1], np.uint64)):  # 2^32 - 1 is not packed either
        first = {}
        for k in keys.tolist():
            first.setdefault(k, len(first))
        want_uniq = np.array(list(first), np.uint64)
        want_inverse = np.array([first[k] for k in keys.tolist()], np.int64)
        for expect in (0, 1, 3, keys.size, 10 * keys.size + 5):
            uniq, inverse = unique_inverse(keys, expect)
            np.testing.assert_array_equal(uniq, want_uniq)
            np.testing.assert_array_equal(inverse, want_inverse)


def test_a_big_batch_routes_on_two_threads_to_the_same_bits_and_leaves_none_running(monkeypatch):
    """At ``PARALLEL_KEYS`` and over, a batch is grouped (and a push's duplicates merged)
    on two threads: the keys, sums, order and parts are the one thread's, bit for bit, and
    no thread is left behind (a driver that routed a big push must still be able to fork)."""
    import threading

    from paramserver.routing import partition

    rng = np.random.default_rng(7)
    base = rng.integers(0, 2**64 - 1, 60_000, dtype=np.uint64)
    keys = np.concatenate([base, base[:20_000], rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64), base[::7]])
    grads = rng.standard_normal((keys.size, 3)).astype(np.float32)

    def routed(threshold: int, ring: Ring) -> tuple:
        monkeypatch.setattr(partition, "PARALLEL_KEYS", threshold)
        push, pull = route_push(ring, keys, grads), route_pull(ring, keys)
        return (push.keys.tobytes(), push.grads.tobytes(), pull.keys.tobytes(), pull.order.tobytes(),
                [(p.server, p.start, p.stop, p.vnodes.tolist(), p.counts.tolist()) for p in push.parts + pull.parts])

    for ring in (Ring.create([1]), Ring.create([1, 2, 3])):
        before = threading.active_count()
        one, two = routed(1 << 40, ring), routed(1 << 10, ring)
        assert threading.active_count() == before
        assert one == two
        assert len(np.frombuffer(two[0], np.uint64)) == np.unique(keys).size  # duplicates merged across the halves


def test_a_big_answer_is_scattered_on_two_threads_to_the_rows_one_thread_writes(monkeypatch):
    """A pull's answer of ``PARALLEL_KEYS`` rows or more is scattered by two threads, each
    writing one half of the destination: the rows one thread's ``scatter_rows`` writes, where
    the answer covers only part of the destination (one server's piece), where two answers
    name one row (the last one's wins, as in order), and nothing left running."""
    import threading

    from paramserver.routing import partition

    monkeypatch.setattr(partition, "PARALLEL_KEYS", 1 << 10)
    rng = np.random.default_rng(11)
    n = 5_000
    cases = [np.asarray(route_pull(Ring.create([1, 2]), rng.integers(0, 2**64 - 1, n, dtype=np.uint64)).order),
             rng.permutation(2 * n)[:n],  # a piece: half the destination's rows
             np.concatenate([rng.integers(0, n, n // 2), rng.integers(0, n, n // 2)]),  # rows named twice
             np.zeros(n, np.int64) + n - 1]  # every answer into the last row, which the upper half writes
    for index in cases:
        for dim in (1, 4):
            src = rng.standard_normal((index.size, dim)).astype(np.float32)
            rows = int(index.max()) + 1 + 3
            want, got = np.full((rows, dim), -7.0, np.float32), np.full((rows, dim), -7.0, np.float32)
            scatter_rows(src, index, want)
            before = threading.active_count()
            scatter_answer(src, index, got)
            assert threading.active_count() == before
            np.testing.assert_array_equal(got, want)


def _alone(ring, keys, inverse, layout, key_dtype, rank_dtype):
    """One batch routed as a step: ``route_steps`` of a single batch."""
    return route_steps(ring, [keys], [inverse], layout, np.dtype(key_dtype), np.dtype(rank_dtype))


def test_a_steps_routing_groups_its_keys_as_a_pulls_and_places_each_occurrence_among_them():
    ring = Ring.create([1, 2], 16)
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(1, 1 << 40, 3000).astype(np.uint64))
    rng.shuffle(keys)
    inverse = rng.integers(0, keys.size, 20_000)
    grouped, rank, vnodes, counts, ends = _alone(ring, keys, inverse, 0, np.uint64, np.uint16)
    pulled = route_pull(ring, keys)
    np.testing.assert_array_equal(grouped, pulled.keys)
    np.testing.assert_array_equal(vnodes, np.concatenate([p.vnodes for p in pulled.parts]))
    np.testing.assert_array_equal(counts, np.concatenate([p.counts for p in pulled.parts]))
    servers = [p.server for p in pulled.parts for _ in p.vnodes]  # each segment on its part's server
    assert ring.owners[vnodes].tolist() == servers and len(set(servers)) == 2 and ends.tolist() == [vnodes.size]
    assert rank.dtype == np.uint16
    np.testing.assert_array_equal(grouped[rank], keys[inverse])  # each occurrence names its own key
    small = keys & np.uint64(0xFFFFFFFF)
    narrow = _alone(ring, small, inverse, 0, np.uint32, np.int32)[0]
    np.testing.assert_array_equal(narrow, route_pull(ring, small).keys.astype(np.uint32))
    for bad in (np.array([0, keys.size]), np.array([-1, 0])):  # an occurrence of no key
        assert _alone(ring, keys, bad, 0, np.uint64, np.int32) == 0


@pytest.mark.parametrize("layout", [0, layout_code(20)])
def test_the_batches_of_a_step_of_several_are_each_routed_as_a_step_alone(layout):
    ring = Ring.create([1, 2], 16)
    rng = np.random.default_rng(4)
    batches = []
    for m, nnz in ((300, 2000), (1, 1), (0, 0), (900, 5000)):  # a batch of one key, one of none
        keys = rng.choice(1 << 20, m, replace=False).astype(np.uint64)
        batches.append((keys, rng.integers(0, max(m, 1), nnz) if m else np.zeros(0, np.int64)))
    key_ends = np.cumsum([k.size for k, _ in batches])
    occ_ends = np.cumsum([i.size for _, i in batches])
    grouped, rank, vnodes, counts, seg_ends = route_steps(ring, [k for k, _ in batches], [i for _, i in batches],
                                                          layout, np.dtype(np.uint32), np.dtype(np.uint16))
    assert grouped.dtype == np.uint32 and rank.dtype == np.uint16
    k0 = o0 = s0 = 0
    for (k, i), k1, o1, s1 in zip(batches, key_ends, occ_ends, seg_ends):
        alone, alone_rank, alone_vnodes, alone_counts, _ = _alone(ring, k, i, layout, np.uint64, np.int32)
        np.testing.assert_array_equal(grouped[k0:k1], alone)
        np.testing.assert_array_equal(grouped[k0:k1], route_pull(ring, k, layout).keys)
        np.testing.assert_array_equal(rank[o0:o1], alone_rank)
        np.testing.assert_array_equal(vnodes[s0:s1], alone_vnodes)
        np.testing.assert_array_equal(counts[s0:s1], alone_counts)
        k0, o0, s0 = k1, o1, s1
    bad = [i.copy() for _, i in batches]
    bad[1][0] = 1  # batch 1 has one key: index 1 names none
    assert route_steps(ring, [k for k, _ in batches], bad, layout, np.dtype(np.uint32), np.dtype(np.uint16)) == 1
    narrow = [(k.astype(np.uint32), i.astype(np.int32)) for k, i in batches]  # other types: read as the call's own
    again = route_steps(ring, [k for k, _ in narrow], [i for _, i in narrow], layout, np.dtype(np.uint32),
                        np.dtype(np.uint16))
    for got, want in zip(again, (grouped, rank, vnodes, counts, seg_ends), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_steps_keys_go_as_narrow_as_the_widest_batchs_allow():
    """``key_dtype`` None: 32 bits where every key of every batch is below 2^32, 64 where one is not
    (2^32 itself, in the last of three batches, the others empty or narrow)."""
    ring = Ring.create([1], 16)
    small = np.array([5, 2**32 - 1, 7], np.uint64)
    inverse = np.array([0, 1, 2, 2], np.int64)
    empty = (np.zeros(0, np.uint64), np.zeros(0, np.int64))
    for last, want in ((2**32 - 2, np.uint32), (2**32, np.uint64), (2**64 - 1, np.uint64)):
        keys = [small, empty[0], np.array([1, last], np.uint64)]
        grouped = route_steps(ring, keys, [inverse, empty[1], np.array([1, 0], np.int64)], 0, None,
                              np.dtype(np.uint16))[0]
        assert grouped.dtype == want, last
        assert sorted(grouped.astype(np.uint64).tolist()) == sorted([5, 2**32 - 1, 7, 1, last])


def test_every_value_one_looks_at_every_batch():
    ones = np.ones(1000, np.float32)
    assert every_value_one([ones, np.zeros(0, np.float32), ones[:3]])
    assert every_value_one([])
    for at in (0, 999):
        other = ones.copy()
        other[at] = 0.5
        assert not every_value_one([ones, other])
    assert not every_value_one([np.array([1.0, np.nan], np.float32)])
    assert not every_value_one([ones[::2], np.array([2.0])])  # strided and float64: read as float32 copies
