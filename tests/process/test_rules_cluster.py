"""Update rules and push operations on a real cluster (issue 14): a user's rule imported
by name from PYTHONPATH by every server, checked exactly against numpy; add, assign and
max with duplicate keys; an add applied exactly once through a SIGKILLed server."""

from __future__ import annotations

import textwrap
import threading

import numpy as np
import pytest
from support import user_module, wait_for

from paramserver import ConfigError, LocalCluster

pytestmark = pytest.mark.timeout(240)

RULE = textwrap.dedent('''
    import numpy as np
    import paramserver

    @paramserver.server_function(merge="concat")
    def above(keys, values, args):
        mine = values[:, 0] > args["threshold"]
        return keys[mine], values[mine]

    @paramserver.rule(state_width=lambda dim: dim, params={"lr": 0.25, "decay": 0.5})
    def momentum_sgd(value, state, grad, hp):
        for j in range(value.shape[0]):
            state[j] = hp[1] * state[j] + grad[j]
            value[j] -= hp[0] * state[j]
''')


@pytest.fixture
def rules_module(tmp_path, monkeypatch):
    yield from user_module(tmp_path, monkeypatch, "ps_user_rules", RULE)


def test_a_users_rule_and_the_push_ops_on_two_servers(rules_module):
    rng = np.random.default_rng(7)
    keys = rng.choice(2**40, 300, replace=False).astype(np.uint64)
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster:
        c = cluster.client
        c.create_table("m", dim=4, optimizer={"name": f"{rules_module}:momentum_sgd", "lr": 0.125})
        value, state = np.zeros((keys.size, 4), np.float32), np.zeros((keys.size, 4), np.float32)
        for _ in range(5):
            g = rng.standard_normal((keys.size, 4)).astype(np.float32)
            c.push("m", keys, g).result(timeout=60)
            state = np.float32(0.5) * state + g
            value -= np.float32(0.125) * state
        np.testing.assert_array_equal(c.pull("m", keys).result(timeout=60), value)

        c.create_table("ops", dim=2, optimizer="adagrad")
        dup = rng.choice(keys[:40], 400)  # every key many times over
        vals = rng.standard_normal((dup.size, 2)).astype(np.float32)
        index = {int(k): i for i, k in enumerate(keys[:40])}
        rows = np.array([index[int(k)] for k in dup])
        want = np.zeros((40, 2), np.float32)
        c.push("ops", dup, vals, op="add").result(timeout=60)
        np.add.at(want, rows, vals)
        np.testing.assert_allclose(c.pull("ops", keys[:40]).result(timeout=60), want, rtol=1e-6, atol=1e-6)
        c.push("ops", dup, vals, op="max").result(timeout=60)
        np.maximum.at(want, rows, vals)
        np.testing.assert_array_equal(c.pull("ops", keys[:40]).result(timeout=60), want)
        c.push("ops", dup, vals, op="assign").result(timeout=60)
        want[rows] = vals  # numpy's fancy assignment: the last duplicate wins
        np.testing.assert_array_equal(c.pull("ops", keys[:40]).result(timeout=60), want)
        with pytest.raises(ConfigError, match="op must be one of"):
            c.push("ops", dup, vals, op="multiply")
        with pytest.raises(Exception, match="module 'nope_not_here' does not import"):
            c.create_table("bad", optimizer="nope_not_here:rule")


def test_an_add_is_applied_exactly_once_through_a_killed_server():
    keys = np.arange(2000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # over every vnode
    rounds = 40
    with LocalCluster(servers=3, workers=0, heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0,
                      log_level="ERROR") as cluster:
        c = cluster.client
        c.create_table("n", dim=1, optimizer="sgd", replicas=2)
        done = threading.Event()

        def pushes():
            for _ in range(rounds):
                c.push("n", keys, np.ones(keys.size, np.float32), op="add").result(timeout=120)
            done.set()

        t = threading.Thread(target=pushes)
        t.start()
        wait_for(lambda: done.is_set() or c.pull("n", keys[:1]).result(timeout=60)[0, 0] >= rounds // 3,
                 what="a third of the adds")
        assert not done.is_set(), "the adds finished before the kill"
        cluster.kill("server-1")
        t.join(timeout=180)
        assert done.is_set()
        np.testing.assert_array_equal(c.pull("n", keys).result(timeout=60), np.full((keys.size, 1), rounds))


def test_server_side_functions_merge_across_servers(rules_module):
    from paramserver.tables import functions
    from paramserver.tables.functions import sample

    rng = np.random.default_rng(3)
    keys = rng.choice(2**40, 500, replace=False).astype(np.uint64)
    vals = rng.standard_normal((keys.size, 3)).astype(np.float32)
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster:
        c = cluster.client
        c.create_table("t", dim=3, optimizer="sgd")
        c.push("t", keys, vals, op="assign").result(timeout=60)
        fns = "paramserver.tables.functions"
        v = np.array([1.0, -2.0, 0.5])
        got_k, got = c.call("t", f"{fns}:dot", keys=keys[:100], args={"vector": v}).result(timeout=60)
        order = {int(k): i for i, k in enumerate(keys)}
        idx = np.array([order[int(k)] for k in got_k])
        assert sorted(got_k.tolist()) == sorted(keys[:100].tolist())
        np.testing.assert_allclose(got, vals[idx].astype(np.float64) @ v, rtol=1e-5)
        np.testing.assert_allclose(c.call("t", f"{fns}:sum_of_squares").result(timeout=60),
                                   (vals.astype(np.float64) ** 2).sum(), rtol=1e-9)
        np.testing.assert_allclose(c.call("t", f"{fns}:column_sums").result(timeout=60), vals.sum(axis=0), rtol=1e-5)
        assert c.call("t", f"{fns}:count").result(timeout=60) == [keys.size]
        top_k, top = c.call("t", f"{fns}:top_k", args={"k": 7, "column": 1}).result(timeout=60)
        want = np.argsort(-np.abs(vals[:, 1]), kind="stable")[:7]
        assert set(top_k.tolist()) == set(keys[want].tolist())
        np.testing.assert_allclose(top, np.abs(vals[want, 1]))
        s_k, _ = c.call("t", f"{fns}:sample", args={"k": 20, "seed": 4}).result(timeout=60)
        assert len(set(s_k.tolist())) == 20 and set(s_k.tolist()) <= set(keys.tolist())
        # the same sample however the keys are spread: as one process gets over all of them
        one_k, _ = functions.merge("topk", [functions.run(sample, keys, vals, {"k": 20, "seed": 4})], {"k": 20})
        assert set(s_k.tolist()) == set(one_k.tolist())
        a_k, a_v = c.call("t", f"{rules_module}:above", args={"threshold": np.float32(1.0)}).result(timeout=60)
        assert sorted(a_k.tolist()) == sorted(keys[vals[:, 0] > 1.0].tolist())
        with pytest.raises(Exception, match="has no 'nothing'"):
            c.call("t", f"{fns}:nothing").result(timeout=60)
