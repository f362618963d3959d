"""Namespaces and quotas, in process: the share a server takes, and how many keys of a
push a table does not hold yet (hash and dense)."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver import ConfigError, TableSpec
from paramserver.routing.partition import route_push
from paramserver.routing.ring import Ring
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.namespaces import Quota, check_name, namespace_of, summarize


def test_names_and_quotas():
    assert namespace_of("job/w") == "job" and namespace_of("w") == "" and namespace_of("a/b/c") == "a"
    assert check_name("job-1.x") == "job-1.x"
    for bad in ("", "a/b", "..", "x" * 65, 3):
        with pytest.raises(ConfigError, match="namespace name"):
            check_name(bad)
    q = Quota(max_keys=1000)
    assert q.refusal(0.5, 400, 0, 100, 0) is None  # 500 = its share, exactly
    assert "past its share 500 of max_keys=1,000" in q.refusal(0.5, 400, 0, 101, 0)
    assert "max_bytes" in Quota(max_bytes=100).refusal(1.0, 0, 90, 1, 20)
    assert Quota.from_wire(q.to_wire()) == q and Quota.from_wire(None).unlimited
    with pytest.raises(ConfigError, match="max_bytes must be a whole number"):
        Quota(max_bytes=-1)


@pytest.mark.parametrize("key_bits", [0, 12])
def test_missing_counts_the_keys_a_push_would_add(key_bits):
    ring = Ring.create([1], 8)
    table = VnodeSet(TableSpec("t", dim=1, key_bits=key_bits), ring.n_vnodes, range(ring.n_vnodes))

    def routed(keys):
        r = route_push(ring, np.asarray(keys, np.uint64), np.ones((len(keys), 1), np.float32), key_bits, distinct=True)
        return r.parts[0].vnodes, r.parts[0].counts, r.keys, r.grads

    v, c, k, g = routed([1, 2, 3, 4])
    assert table.missing(v, c, k) == 4
    table.apply(v, c, k, g)
    v, c, k, _ = routed([3, 4, 5, 0])
    assert table.missing(v, c, k) == 2
    assert table.row_bytes == 8 + 4 * table.width


def test_summarize_groups_tables_by_namespace():
    stats = [{"tables": {"a/w": {"primary_keys": 3, "bytes": 100}, "v": {"primary_keys": 1, "bytes": 10}}},
             {"tables": {"a/w": {"primary_keys": 2, "bytes": 90}}}]
    out = summarize({"a/w": {}, "v": {}}, {"a": {"max_keys": 9, "max_bytes": None}, "q": {"max_keys": 1}}, stats)
    assert out["a"] == {"tables": ["a/w"], "max_keys": 9, "max_bytes": None, "keys": 5, "bytes": 190}
    assert out[""]["keys"] == 1 and out["q"]["tables"] == [] and out["q"]["max_keys"] == 1
