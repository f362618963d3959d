"""Namespaces (issue 14): jobs share one server group, each with its own tables and
quota; a quota refuses a push whole and loses nothing; dropping a namespace drops its
tables only."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver import ConfigError, LocalCluster, QuotaError

pytestmark = pytest.mark.timeout(180)


def test_namespaces_quotas_and_dropping_one_job(capsys):
    from paramserver.cli.cluster import _status

    rng = np.random.default_rng(5)
    first = rng.choice(2**50, 300, replace=False).astype(np.uint64)
    more = rng.choice(2**50, 5000, replace=False).astype(np.uint64) + np.uint64(2**51)
    with LocalCluster(servers=2, workers=0, log_level="ERROR") as cluster:
        c = cluster.client
        c.admin.create_namespace("a", max_keys=1000)
        c.create_table("a/w", dim=2, optimizer={"name": "sgd", "lr": 1.0})
        c.create_table("b/w", dim=2, optimizer={"name": "sgd", "lr": 1.0})
        ones = np.ones((first.size, 2), np.float32)
        c.push("a/w", first, ones).result(timeout=60)
        with pytest.raises(QuotaError, match="namespace 'a'.*max_keys=1,000.*nothing of this push was applied"):
            c.push("a/w", np.concatenate([first, more]), np.ones((first.size + more.size, 2), np.float32)).result(
                timeout=60)
        np.testing.assert_array_equal(c.pull("a/w", first).result(timeout=60), -ones)  # nothing lost, nothing added
        c.push("a/w", first, ones).result(timeout=60)  # keys it holds: updated at any quota
        np.testing.assert_array_equal(c.pull("a/w", first).result(timeout=60), -2 * ones)
        c.push("b/w", more, np.ones((more.size, 2), np.float32)).result(timeout=60)  # no quota there
        ns = c.admin.namespaces()
        assert ns["a"]["tables"] == ["a/w"] and ns["a"]["keys"] == first.size and ns["a"]["max_keys"] == 1000
        assert ns["b"]["keys"] == more.size and ns["b"]["max_keys"] is None and ns["a"]["bytes"] > 0
        _status(c)
        shown = capsys.readouterr().out
        assert "namespace a: 1 table(s), 300 keys" in shown and "max_keys 1,000" in shown

        c.admin.create_namespace("a", max_bytes=10**9)  # changed: bytes only now, so the keys go in
        c.push("a/w", more[:2000], np.ones((2000, 2), np.float32)).result(timeout=60)
        assert c.admin.drop_namespace("a") == ["a/w"]
        assert set(c.tables()) == {"b/w"}
        np.testing.assert_array_equal(c.pull("b/w", more[:10]).result(timeout=60), -np.ones((10, 2)))
        with pytest.raises(ConfigError, match="namespace name"):
            c.admin.create_namespace("no/slash")
        with pytest.raises(ConfigError, match="max_keys must be a whole number"):
            c.admin.create_namespace("x", max_keys=0)
