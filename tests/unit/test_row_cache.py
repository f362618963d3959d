"""The worker's row cache without I/O (``client/row_cache.py``, ``store/rowcache.py``):
what it reads, within which bound, what it gathers and pushes, and its spec."""

import numpy as np
import pytest

from paramserver.client.row_cache import RowCache, RowCacheSpec, merge_caches
from paramserver.errors import ConfigError
from paramserver.store.loops.cache import EMPTY
from paramserver.store.rowcache import RowStore

SERVER = 7  # a server's node id


def _pull(cache, keys, server_rows, version, ring=1):
    """One pull through ``cache``: what it read, then the server's answer for the misses at ``version``."""
    out = np.full((keys.size, cache.store.dim), np.nan, np.float32)
    read = cache.read(keys, out, ring)
    miss = np.flatnonzero(read.slots < 0)
    cache.answered(read, SERVER, version, keys[miss], server_rows[miss])
    out[miss] = server_rows[miss]
    return out, read


def _one(sends, width=1):
    """A sum-mode cache's sends as one (keys, rows, distinct): its one ``update``, or nothing."""
    assert len(sends) <= 1 and all(op == "update" for op, *_ in sends)
    return sends[0][1:] if sends else (np.zeros(0, np.uint64), np.zeros((0, width), np.float32), True)


def test_spec_parses_presets_numbers_and_off_and_names_the_fix():
    assert RowCacheSpec.parse("s=8,rows=1e3") == RowCacheSpec(8, 1000)
    assert RowCacheSpec.parse("hot") == RowCacheSpec(8, 262144)
    assert not RowCacheSpec.parse("off") and not RowCacheSpec.parse(None) and not RowCacheSpec.parse("s=0")
    for bad, said in (("s=-1", "s must be in"), ("rows=2", "rows must be in"), ("x=3", "is not s=N"),
                      ("s=1.5", "whole number"), ("s", "is not s=N"), ("s=2,s=3", "given twice")):
        with pytest.raises(ConfigError, match=said):
            RowCacheSpec.parse(bad)


def test_a_row_is_read_from_the_cache_while_at_most_s_versions_behind_then_asked_again():
    cache = RowCache(RowCacheSpec(s=2, rows=64), dim=1, width=1)
    keys = np.array([5, 9], np.uint64)
    rows = np.array([[1.0], [2.0]], np.float32)
    out, read = _pull(cache, keys, rows, version=10)  # a free way takes a key at once
    assert read.hits == 0 and out.tolist() == [[1.0], [2.0]]
    out, read = _pull(cache, keys, rows * 0, version=10)
    assert read.hits == 2 and out.tolist() == [[1.0], [2.0]], "held rows are read, not the server's"
    for version, hit in ((11, 2), (12, 2)):  # another worker's pushes, seen in the answers
        cache.versions.answered(0, version, cache.pushes)
        _, read = _pull(cache, keys, rows, version)
        assert read.hits == hit
    cache.versions.answered(0, 13, cache.pushes)
    _, read = _pull(cache, keys, rows * 3, version=13)
    assert read.hits == 0, "3 versions behind with s=2: asked again"


def test_a_hit_the_answers_show_too_old_is_pulled_again_and_the_lags_are_counted():
    cache = RowCache(RowCacheSpec(s=2, rows=64), dim=1, width=1)
    keys = np.array([5], np.uint64)
    for _ in range(2):
        _pull(cache, keys, np.ones((1, 1), np.float32), version=4)
    out = np.empty((1, 1), np.float32)
    read = cache.read(keys, out, 1)
    assert read.hits == 1
    assert cache.servers(read) == [SERVER]
    cache.answered(read, SERVER, 9, keys[:0], np.zeros((0, 1), np.float32))  # the empty piece's version
    assert cache.stale(read, keys).tolist() == [0] and cache.stats()["stale"] == 1
    read = cache.read(keys, out, 1)
    cache.answered(read, SERVER, 5, keys[:0], np.zeros((0, 1), np.float32))
    assert read.hits == 0 or cache.stale(read, keys).size == 0


def test_a_server_that_did_not_answer_makes_its_hits_too_old():
    cache = RowCache(RowCacheSpec(s=5, rows=64), dim=1, width=1)
    keys = np.array([1, 2], np.uint64)
    for _ in range(2):
        _pull(cache, keys, np.ones((2, 1), np.float32), version=0)
    read = cache.read(keys, np.empty((2, 1), np.float32), 1)
    assert read.hits == 2 and cache.stale(read, keys).tolist() == [0, 1]


def test_gradients_are_summed_and_pushed_every_s_uses_and_the_rest_at_take():
    s = 3
    cache = RowCache(RowCacheSpec(s=s, rows=64), dim=1, width=1)
    keys = np.array([4, 8], np.uint64)
    for _ in range(2):
        _pull(cache, keys, np.zeros((2, 1), np.float32), version=0)
    sent = []
    for step in range(s):
        out_keys, grads, distinct = _one(cache.write(keys, np.full((2, 1), step + 1.0, np.float32), None))
        sent.append((sorted(out_keys.tolist()), grads.ravel().tolist()))
        assert distinct
    assert sent[:2] == [([], []), ([], [])]
    assert sent[2] == ([4, 8], [6.0, 6.0]), "1 + 2 + 3, once, after s uses"
    _one(cache.write(keys[:1], np.full((1, 1), 0.5, np.float32), None))
    keys_out, sums, _ = _one(cache.take())
    assert keys_out.tolist() == [4] and sums.ravel().tolist() == [0.5] and cache.stats()["sums_held"] == 0


def test_a_key_not_held_is_pushed_as_it_is_and_a_new_ring_owes_every_sum():
    cache = RowCache(RowCacheSpec(s=4, rows=64), dim=1, width=1)
    held = np.array([3], np.uint64)
    for _ in range(2):
        _pull(cache, held, np.zeros((1, 1), np.float32), version=0)
    out_keys, grads, _ = _one(cache.write(np.array([3, 99], np.uint64), np.array([[1.0], [2.0]], np.float32), None))
    assert out_keys.tolist() == [99] and grads.ravel().tolist() == [2.0]
    cache.read(held, np.empty((1, 1), np.float32), ring_version=2)  # the ring moved: all forgotten
    out_keys, grads, distinct = _one(cache.write(np.array([50], np.uint64), np.array([[7.0]], np.float32), None))
    assert sorted(out_keys.tolist()) == [3, 50] and not distinct or sorted(out_keys.tolist()) == [3, 50]
    assert dict(zip(out_keys.tolist(), grads.ravel().tolist())) == {50: 7.0, 3: 1.0}


def test_a_sum_goes_out_once_s_versions_old_though_its_key_is_not_pushed_again():
    s = 2
    cache = RowCache(RowCacheSpec(s=s, rows=64), dim=1, width=1)
    for _ in range(2):
        _pull(cache, np.array([1, 2], np.uint64), np.zeros((2, 1), np.float32), version=0)
    _one(cache.write(np.array([1], np.uint64), np.ones((1, 1), np.float32), None))  # held: 1 use of 2
    out = []
    for i in range(3):  # other keys, not held: each push goes out and moves the versions
        keys_out, _, _ = _one(cache.write(np.array([1000 + i], np.uint64), np.ones((1, 1), np.float32), None))
        out += keys_out.tolist()
    assert 1 not in out[:2]
    assert 1 in out, "key 1's sum went out by age"


def test_the_store_admits_a_key_read_more_often_than_the_one_it_replaces():
    store = RowStore(4, 1, 1)  # one set of 4 ways
    est = np.zeros(1, np.int64)
    out = np.empty((8, 1), np.float32)
    hot = np.arange(4, dtype=np.uint64)
    for _ in range(3):
        store.read(hot, out[:4], est, 5)
    store.fill(hot, np.ones((4, 1), np.float32), 0, 0)
    cold = np.array([100], np.uint64)
    store.read(cold, out[:1], est, 5)
    store.fill(cold, np.ones((1, 1), np.float32), 0, 0)
    assert sorted(store.keys.tolist()) == [0, 1, 2, 3], "a key read once does not replace keys read thrice"
    for _ in range(6):
        store.read(cold, out[:1], est, 5)
    store.fill(cold, np.ones((1, 1), np.float32), 0, 0)
    assert 100 in store.keys.tolist()


def test_the_empty_key_is_never_cached():
    store = RowStore(8, 1, 1)
    k = np.array([int(EMPTY)], np.uint64)
    out = np.zeros((1, 1), np.float32)
    for _ in range(3):
        store.read(k, out, np.zeros(1, np.int64), 5)
    store.fill(k, np.ones((1, 1), np.float32), 0, 0)
    slots, _, _, hits, _ = store.read(k, out, np.zeros(1, np.int64), 5)
    assert hits == 0 and slots[0] == -1


def test_merge_sums_workers_and_recomputes_the_percentiles():
    a = {"hits": 3, "misses": 1, "stale": 0, "sums_pushed": 2, "grads_gathered": 4, "sums_held": 0, "s": 4,
         "rows": 64, "lag_histogram": [3, 0, 0] + [0] * 61}
    b = {**a, "hits": 1, "lag_histogram": [0, 0, 1] + [0] * 61}
    merged = merge_caches([a, b])
    assert merged["hits"] == 4 and merged["hit_rate"] == 4 / 6 and merged["lag_p50"] == 0 and merged["lag_p99"] == 2


def test_metrics_show_reads_by_result_sums_held_and_the_lag_histogram():
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from paramserver.observe.metrics import cache_families, to_prometheus, total

    cache = RowCache(RowCacheSpec(s=4, rows=64), dim=1, width=1)
    keys = np.array([1, 2, 3], np.uint64)
    _pull(cache, keys, np.zeros((3, 1), np.float32), version=0)
    read = cache.read(keys, np.empty((3, 1), np.float32), 1)
    cache.answered(read, SERVER, 1, keys[:0], np.zeros((0, 1), np.float32))
    assert cache.stale(read, keys).size == 0
    _one(cache.write(keys, np.ones((3, 1), np.float32), read.slots))
    families = cache_families({"w": cache.stats()}, {"pull": 3, "push": 0})
    assert total(families, "paramserver_row_cache_reads_total", table="w", result="hit") == 3
    assert total(families, "paramserver_row_cache_reads_total", table="w", result="miss") == 3
    assert total(families, "paramserver_row_cache_sums_held", table="w") == 3
    assert total(families, "paramserver_row_cache_lag_versions_bucket", table="w", le="0.0") == 0
    assert total(families, "paramserver_row_cache_lag_versions_bucket", table="w", le="1.0") == 3
    assert total(families, "paramserver_client_keys_total", op="pull") == 3

    class Source:
        def collect(self):
            return to_prometheus(families)

    registry = CollectorRegistry()
    registry.register(Source())
    assert b'paramserver_row_cache_reads_total{result="hit",table="w"} 3.0' in generate_latest(registry)


def test_a_cache_bigger_than_the_memory_left_is_refused_naming_the_rows_that_fit(monkeypatch):
    from paramserver.store import rowcache

    monkeypatch.setattr(rowcache, "available_memory", lambda: 64 << 20)  # 64 MiB left
    with pytest.raises(ConfigError, match=r"rows=4,194,304 needs 264 MiB and this machine has 64 MiB available; "
                                          r"give fewer rows .*rows=262,144 takes 16 MiB"):
        RowCache(RowCacheSpec(s=8, rows=1 << 22), 1, 1)
    assert RowCache(RowCacheSpec(s=8, rows=1 << 18), 1, 1).store.capacity == 1 << 18
    monkeypatch.setattr(rowcache, "available_memory", lambda: 0)  # unknown: not refused
    assert RowCache(RowCacheSpec(s=8, rows=1 << 22), 1, 1).store.capacity == 1 << 22


def test_the_caches_of_a_local_clusters_workers_are_refused_together_where_each_alone_would_fit(monkeypatch):
    """Each worker checks its own cache against the memory left, before the others fill theirs
    (numpy's zeros take no pages until written): two workers of a local cluster each passed
    with half of the memory.  The driver checks them together before any node starts."""
    from paramserver.client.cached_calls import check_caches_fit
    from paramserver.store import rowcache
    from paramserver.tables.spec import TableSpec

    monkeypatch.setattr(rowcache, "available_memory", lambda: 64 << 20)  # 64 MiB left
    spec = TableSpec("w", 1, optimizer="ftrl")
    check_caches_fit(spec, "s=8,rows=262144", 1)  # 16-odd MiB: fits alone ...
    RowCache(RowCacheSpec(s=8, rows=1 << 18), 1, 3, (1, spec.optimizer.kind, np.zeros(4)))
    with pytest.raises(ConfigError, match=r"rows=262,144 on each of the 4 workers on this machine needs \d+ MiB in "
                                          r"all and this machine has 64 MiB available; give fewer rows .*rows=65,536 "
                                          r"takes \d+ MiB in all"):
        check_caches_fit(spec, "s=8,rows=262144", 4)  # ... not four times
    check_caches_fit(spec, "off", 4)  # no cache: nothing to check
    monkeypatch.setattr(rowcache, "available_memory", lambda: 0)  # unknown: not refused
    check_caches_fit(spec, "s=8,rows=262144", 4)
