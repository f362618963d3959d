"""The key lifecycle: its spec, the admission sketch and policies, eviction on a vnode set,
and copies that agree (real ServerNodes in this process, message by message)."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.errors import ConfigError
from paramserver.lifecycle import AdmissionPolicy, Lifecycle
from paramserver.lifecycle.policies import AfterN, Probabilistic, load_policy
from paramserver.lifecycle.sketch import Sightings
from paramserver.routing.partition import route_push
from paramserver.routing.ring import Ring
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.spec import TableSpec


def test_spec_text_map_and_wire_round_trip():
    lc = Lifecycle.parse("admit=after:2;ttl=1e6;cap_bytes=64M;victim=lfu;half_life=5e5;min_score=0.5")
    assert (lc.admit, lc.ttl, lc.cap_bytes, lc.victim, lc.half_life) == ("after:2", 1e6, 64 << 20, "lfu", 5e5)
    assert Lifecycle.parse(lc.to_wire()) == lc
    assert Lifecycle.parse("track").track and not Lifecycle.parse(None)
    spec = TableSpec("w", optimizer="ftrl", lifecycle="admit=prob:0.5;cap_keys=1000")
    assert TableSpec.from_wire(spec.to_wire()) == spec
    assert "lifecycle" not in TableSpec("w").to_wire()


@pytest.mark.parametrize("text, words", [
    ("ttl=-1", "ttl must be a finite number >= 0"),
    ("cap_keys=1.5", "cap_keys must be an int"),
    ("victim=random", "victim must be one of"),
    ("min_score=0.5", "needs half_life"),
    ("cap_keys=10;victim=lfu", "victim=lfu needs half_life"),
    ("admit=after:0", "integer N in [1, 255]"),
    ("admit=prob:1.5", "P in (0, 1]"),
    ("admit=nosuch.module:Policy", "module 'nosuch.module' does not import here"),
    ("admit=builtins:dict", "not a subclass of AdmissionPolicy"),
    ("ttl", "name=value"),
    ("ttl=abc", "is not a number"),
    ("size=3", "unknown setting"),
])
def test_bad_specs_are_refused_with_the_rule(text, words):
    with pytest.raises(ConfigError, match=None) as info:
        Lifecycle.parse(text)
    assert words in str(info.value)


def test_a_lifecycle_needs_a_hash_table_and_unaggregated_pushes():
    with pytest.raises(ConfigError, match="needs a hash table"):
        TableSpec("w", key_bits=10, lifecycle="ttl=5")
    with pytest.raises(ConfigError, match="aggregate=True"):
        TableSpec("w", consistency="bsp", aggregate=True, lifecycle="track")


def test_the_sketch_admits_at_the_nth_sighting_and_falsely_at_its_stated_rate():
    s = Sightings(2)
    keys = np.arange(1, 200_001, dtype=np.uint64)
    first, second = [], []
    for i in range(0, keys.size, 1000):
        first.append(s.see(keys[i:i + 1000]))
        second.append(s.see(keys[i:i + 500]))  # half of them again, at once
    assert np.concatenate(second).all()  # a count-min sketch never undercounts
    rate = np.concatenate(first).mean()
    assert s.nbytes <= 2 * keys.size  # at most 2 bytes a key
    assert rate < 0.04, rate  # the docstring's 2.8 % (measured on 10**6 keys)
    s3 = Sightings(3)
    assert not s3.see(keys[:10]).any() and not s3.see(keys[:10]).any() and s3.see(keys[:10]).all()


def test_the_sketch_grows_with_large_calls_and_stays_under_two_bytes_a_key():
    """A push of tens of thousands of new keys once filled a 4 KiB sketch in one call, and
    every key after that read as seen (94 % admitted)."""
    s = Sightings(2)
    keys = np.arange(1, 400_001, dtype=np.uint64)
    rate = np.concatenate([s.see(keys[i:i + 40_000]) for i in range(0, keys.size, 40_000)]).mean()
    assert rate < 0.04 and s.nbytes <= 2 * keys.size, (rate, s.nbytes)


def test_the_sketch_stays_bounded_and_halves_at_its_limit():
    s = Sightings(2, max_bytes=1 << 14)
    for i in range(50):
        s.see(np.arange(i * 10_000 + 1, (i + 1) * 10_000 + 1, dtype=np.uint64))
    assert s.nbytes <= 1 << 14 and s.resets > 0


def test_probabilistic_admission_follows_p():
    p = Probabilistic(0.25)
    admitted = np.mean([p.admit(np.arange(1, 10_001, dtype=np.uint64), 0.0).mean() for _ in range(5)])
    assert 0.23 < admitted < 0.27
    assert isinstance(load_policy("after:n=3,max_mb=1"), AfterN) and load_policy("after:3").n == 3


class EveryOther(AdmissionPolicy):
    """A user's policy: even keys only."""

    def admit(self, keys, time):
        return keys % 2 == 0


def _push(table: VnodeSet, ring: Ring, keys, time=None, grads=None):
    grads = np.ones((keys.size, table.spec.dim), np.float32) if grads is None else grads
    routed = route_push(ring, keys, grads, table.layout)
    k, g = routed.keys, routed.grads
    vnodes = np.concatenate([p.vnodes for p in routed.parts])
    counts = np.concatenate([p.counts for p in routed.parts])
    k, g, vnodes, counts = table.life.admit(k, g, vnodes, counts)
    table.apply(vnodes, counts, k, g)
    table.life.touched(vnodes, counts, k, time)


def _table(lifecycle, n_vnodes=8) -> tuple[VnodeSet, Ring, np.ndarray]:
    ring = Ring.create([1], n_vnodes)
    table = VnodeSet(TableSpec("t", optimizer="adagrad", lifecycle=lifecycle), ring.n_vnodes, range(ring.n_vnodes))
    return table, ring, np.ones(ring.n_vnodes, bool)


def _keys(table: VnodeSet) -> np.ndarray:
    return np.sort(np.concatenate([vt.items()[0] for vt in table.tables.values()]))


def test_a_user_policy_admits_what_it_says():
    table, ring, _ = _table(f"admit={__name__}:EveryOther")
    _push(table, ring, np.arange(1, 101, dtype=np.uint64))
    assert (_keys(table) == np.arange(2, 101, 2)).all()
    assert table.life.stats.refused == 50


def test_ttl_evicts_the_unseen_and_frees_their_memory():
    table, ring, primary = _table("ttl=2")
    _push(table, ring, np.arange(1, 20_001, dtype=np.uint64), time=0)
    full = table.nbytes
    for day in range(1, 4):
        _push(table, ring, np.arange(1, 101, dtype=np.uint64), time=day)
        if table.life.due(primary):
            table.life.sweep(primary)
    assert (_keys(table) == np.arange(1, 101)).all()
    assert table.nbytes < full / 20
    assert table.life.stats.evicted == 19_900


def test_a_key_cap_holds_and_keeps_the_most_recent():
    table, ring, primary = _table("cap_keys=800")
    for t in range(20):
        _push(table, ring, np.arange(t * 500 + 1, (t + 1) * 500 + 1, dtype=np.uint64), time=t)
        if table.life.due(primary):
            table.life.sweep(primary)
        assert len(table) <= 800 + 500
    assert len(table) <= 800
    assert _keys(table).min() > 19 * 500 - 800  # the oldest went first


def test_a_byte_cap_bounds_the_arrays():
    table, ring, primary = _table("cap_bytes=64K")
    for t in range(30):
        _push(table, ring, np.arange(t * 1000 + 1, (t + 1) * 1000 + 1, dtype=np.uint64), time=t)
        if table.life.due(primary):
            table.life.sweep(primary)
    assert table.nbytes <= (64 << 10) * 1.05


def test_decayed_score_evicts_the_rarely_seen():
    table, ring, primary = _table("half_life=1;min_score=0.3")
    often, once = np.arange(1, 11, dtype=np.uint64), np.arange(100, 200, dtype=np.uint64)
    _push(table, ring, once, time=0)
    for t in range(4):
        _push(table, ring, often, time=t)
    table.life.sweep(primary)
    assert (_keys(table) == often).all()


def test_delta_has_the_changed_keys_and_tombstones():
    table, ring, primary = _table("ttl=5")
    _push(table, ring, np.arange(1, 1001, dtype=np.uint64), time=0)
    _push(table, ring, np.arange(1, 991, dtype=np.uint64), time=3)
    keys, values, deleted, whole = table.life.delta(primary, 0)
    assert keys.size == 1000 and values.shape == (1000, 1) and whole
    since = table.life.epoch
    _push(table, ring, np.arange(1, 11, dtype=np.uint64), time=6)
    table.life.sweep(primary)  # keys 991..1000, unseen since 0: evicted
    keys, _, deleted, whole = table.life.delta(primary, since)
    assert (np.sort(keys) == np.arange(1, 11)).all() and (np.sort(deleted) == np.arange(991, 1001)).all() and whole
    keys, _, deleted, _ = table.life.delta(primary, table.life.epoch)
    assert keys.size == 0 and deleted.size == 0


def test_a_delta_larger_than_the_table_asks_for_a_base():
    table, ring, primary = _table("ttl=5")
    _push(table, ring, np.arange(1, 101, dtype=np.uint64), time=0)
    table.life.delta(primary, 0)  # a base: the epoch moves on
    since = table.life.epoch
    _push(table, ring, np.arange(1, 11, dtype=np.uint64), time=10)
    table.life.sweep(primary)  # 90 of 100 keys evicted: the delta outweighs the 10 kept
    assert table.life.delta(primary, since)[3] is False

def _held(node, table="t") -> set[int]:
    return {int(k) for vt in node.tables[table].tables.values() for k in vt.items()[0]}


def test_backups_store_what_the_primary_admitted_and_evict_what_it_evicted(h):
    h.make(1, 2)
    spec = TableSpec("t", optimizer="adagrad", replicas=2, lifecycle="admit=after:2;ttl=1")
    ring = Ring.create([1, 2], 4)
    h.ring(ring, [spec])
    once, twice = np.arange(1, 301, dtype=np.uint64), np.arange(1000, 1300, dtype=np.uint64)
    grads = lambda k: np.ones((k.size, 1), np.float32)  # noqa: E731
    seq = iter(range(1, 100))
    for keys in (once, twice, twice):
        s = next(seq)
        h.push(ring, "t", keys, grads(keys), sender=9, seq=s, acked=s - 1, time=0)
        h.pump()
    one, two = h.by_id(1), h.by_id(2)
    assert _held(one) == _held(two) == {int(k) for k in twice} | (_held(one) & {int(k) for k in once})
    assert len(_held(one) & {int(k) for k in once}) < 30  # false admissions only
    # time moves on: the primary of each vnode sweeps and tells the other copy
    before = _held(one)
    fresh = np.arange(5000, 5100, dtype=np.uint64)
    for _ in range(2):
        s = next(seq)
        h.push(ring, "t", fresh, grads(fresh), sender=9, seq=s, acked=s - 1, time=5)
        h.pump()
    assert _held(one) == _held(two) == {int(k) for k in fresh}
    assert [n.tables["t"].life.stats.evicted for n in (one, two)] == [len(before)] * 2


def test_an_eviction_forwarded_to_a_table_without_a_lifecycle_is_refused(h):
    h.make(1, 2)
    spec = TableSpec("t", replicas=2)
    ring = Ring.create([1, 2], 4)
    h.ring(ring, [spec])
    keys = np.array([7], np.uint64)
    v = int(ring.vnodes(keys)[0])
    backup = h.by_id(int(ring.chains[v, 1]))
    header = {"op": "replicate", "table": "t", "ring_version": ring.version, "id": 5, "evict": True}
    h.deliver(backup, header, [keys, np.array([v], np.int32), np.array([1], np.int64)])
    assert any(r.get("op") == "error" and "no lifecycle" in r.get("error", "") for _, r in h.replies)


def test_score_admission_counts_shows_and_clicks():
    table, ring, _ = _table("admit=score:threshold=1,show=0.1,click=1")
    assert table.spec.push_width == 3 and table.life.counted
    keys = np.arange(1, 5, dtype=np.uint64)
    # key 1: a click (1.0) at once; key 2: 5 shows (0.5); key 3: 10 shows (1.0); key 4: nothing
    stats = np.array([[1, 1], [5, 0], [10, 0], [0, 0]], np.float32)
    grads = np.hstack([np.ones((4, 1), np.float32), stats])
    routed = route_push(ring, keys, grads, table.layout)
    vnodes = np.concatenate([p.vnodes for p in routed.parts])
    counts = np.concatenate([p.counts for p in routed.parts])
    k, g, v, c = table.life.admit(routed.keys, routed.grads, vnodes, counts)
    assert g.shape[1] == 1 and sorted(k.tolist()) == [1, 3]
    _ = v, c


def test_stats_are_for_tables_that_count_them_and_value_codecs_are_refused_there():
    from paramserver.client.life_calls import with_stats

    plain = TableSpec("p")
    with pytest.raises(ConfigError, match="stats"):
        with_stats(plain, np.ones((2, 1), np.float32), np.ones((2, 2)))
    scored = TableSpec("s", lifecycle="admit=score:10")
    assert with_stats(scored, np.ones((2, 1), np.float32), None).tolist() == [[1, 1, 0], [1, 1, 0]]
    with pytest.raises(ConfigError, match="shape"):
        with_stats(scored, np.ones((2, 1), np.float32), np.ones((3, 2)))
    with pytest.raises(ConfigError, match="value codecs"):
        TableSpec("s", lifecycle="admit=score:10", filters="push=int8")
    with pytest.raises(ConfigError, match=r"\[1, 255\]"):
        Lifecycle.parse("admit=score:threshold=100")


@pytest.mark.parametrize("storage", ["fp16", "bf16"])
def test_eviction_and_deltas_on_compact_rows(storage):
    ring = Ring.create([1], 8)
    spec = TableSpec("t", optimizer="adagrad", lifecycle="ttl=2", storage=storage)
    table, primary = VnodeSet(spec, ring.n_vnodes, range(ring.n_vnodes)), np.ones(ring.n_vnodes, bool)
    _push(table, ring, np.arange(1, 2001, dtype=np.uint64), time=0)
    before = {int(k): v for k, v in zip(*table.life.delta(primary, 0)[:2], strict=True)}
    since = table.life.epoch
    _push(table, ring, np.arange(1, 11, dtype=np.uint64), time=5)
    table.life.sweep(primary)
    assert (_keys(table) == np.arange(1, 11)).all()
    keys, values, deleted, _ = table.life.delta(primary, since)
    assert sorted(keys.tolist()) == list(range(1, 11)) and deleted.size == 1990
    kept = {int(k): v for k, v in zip(*_keys_values(table), strict=True)}
    assert all(kept[k][0] != before[k][0] for k in range(1, 11))  # updated, and read back in float32


def _keys_values(table):
    parts = [vt.items() for vt in table.tables.values()]
    return np.concatenate([k for k, _ in parts]), np.concatenate([r[:, :1] for _, r in parts])
