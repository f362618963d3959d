"""Steps on a real cluster (``client.steps``, ``--steps``): a batch trained where its rows are
applies what pulling it, computing its gradient and pushing it would; once a server joins
and a batch's keys span two servers, the same call trains it the classic way; ``paramserver
train`` on one server trains as steps the model of pulling each batch after the last push."""

from __future__ import annotations

import numpy as np
import pytest
from support import heavy_rows, train_report

from paramserver import ConfigError, LocalCluster
from paramserver.apps.ctr.depth import link_depth
from paramserver.tables.steps import logistic_step

pytestmark = pytest.mark.timeout(240)

FTRL = {"name": "ftrl", "alpha": 0.115, "beta": 0.5, "l1": 0.0, "l2": 0.0}


def _batch(rng, n=50, keys=80):
    lengths = rng.integers(1, 9, n)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    inverse = rng.integers(0, keys, int(indptr[-1]))
    vals = rng.choice(np.array([1.0, 0.5], np.float32), int(indptr[-1]))
    labels = (rng.random(n) < 0.3).astype(np.float32)
    return rng.choice(1 << 20, keys, replace=False).astype(np.uint64), inverse, indptr, vals, labels


def _classic(c, table, batch):
    """The batch pulled, its gradient computed here, pushed: what a step must equal."""
    uniq, inverse, indptr, vals, labels = batch
    rows = c.pull(table, uniq).result(timeout=60)
    grads, loss, preds = logistic_step(indptr, vals, labels, inverse, rows, True)
    c.push(table, uniq, grads, distinct=True).result(timeout=60)
    return preds.astype(np.float32), loss


def test_a_step_equals_pull_compute_push_on_one_server_and_after_a_server_joins():
    rng = np.random.default_rng(5)
    with LocalCluster(servers=1, log_level="WARNING") as cluster:
        c = cluster.client
        for name in ("stepped", "classic"):
            c.create_table(name, 1, optimizer=FTRL)

        def both(batch):
            preds, loss = c.steps.take("stepped", *batch).result(timeout=60)
            want_preds, want_loss = _classic(c, "classic", batch)
            np.testing.assert_array_equal(preds, want_preds)
            assert loss == pytest.approx(want_loss, rel=1e-12)
            keys = batch[0]
            np.testing.assert_array_equal(c.pull("stepped", keys).result(timeout=60),
                                          c.pull("classic", keys).result(timeout=60))

        for _ in range(2):
            both(_batch(rng))
        keys, inverse, *rest = _batch(rng)
        with pytest.raises(ConfigError, match="inverse must index the .* keys"):  # refused here, nothing sent
            c.steps.take("stepped", keys, inverse + keys.size, *rest)
        for _ in range(2):
            both(_batch(rng))  # and the steps after it go on as ever
        steps_before = c.stats.counts.get("step", 0)
        assert steps_before == 4 and "steps_classic" not in c.stats.counts
        cluster.add_server()  # the keys of a batch now span two servers: the same call, the classic way
        for _ in range(4):
            both(_batch(rng))
        assert c.stats.counts.get("step", 0) == steps_before  # no step went as one request
        assert c.stats.counts["steps_classic"] == 4
        everything = np.arange(1 << 20, dtype=np.uint64)
        assert np.abs(c.pull("stepped", everything).result(timeout=60)).sum() > 0


def test_steps_of_several_batches_equal_those_steps_in_turn_and_go_alone_where_they_cannot_go_together():
    rng = np.random.default_rng(8)
    with LocalCluster(servers=1, log_level="WARNING") as cluster:
        c = cluster.client
        for name in ("many", "one"):
            c.create_table(name, 1, optimizer=FTRL)
        pool = rng.choice(1 << 20, 300, replace=False).astype(np.uint64)  # the batches share keys

        def batches(k):
            return [(rng.choice(pool, 80, replace=False), *_batch(rng)[1:]) for _ in range(k)]

        def equal(group, table="many"):
            got = [f.result(timeout=60) for f in c.steps.take_many(table, group)]
            want = [c.steps.take("one", *b).result(timeout=60) for b in group]
            for (p, loss), (q, want_loss) in zip(got, want, strict=True):
                np.testing.assert_array_equal(p, q)
                assert loss == want_loss
            np.testing.assert_array_equal(c.pull(table, pool).result(timeout=60),
                                          c.pull("one", pool).result(timeout=60))

        for k in (3, 1, 5):
            equal(batches(k))
        assert c.stats.counts["step_groups"] == 2 and c.stats.counts["step"] == 2 * 9
        keys, inverse, *rest = batches(1)[0]
        with pytest.raises(ConfigError, match="inverse must index"):  # a bad batch: refused here, none sent
            c.steps.take_many("many", [batches(1)[0], (keys, inverse + keys.size, *rest)])
        cluster.add_server()  # the batches' keys now span two servers: each the classic way (all in flight at once)
        for f in c.steps.take_many("many", batches(3)):
            assert f.result(timeout=60)[0].shape == (50,)
        assert c.stats.counts["step_groups"] == 2 and c.stats.counts["steps_classic"] == 3
        c.create_table("copied", 1, optimizer=FTRL, replicas=2)
        for f in c.steps.take_many("copied", batches(3)):  # a table with copies: one step each, never a group
            assert f.result(timeout=60)[0].dtype == np.float32
        assert c.stats.counts["step_groups"] == 2


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return heavy_rows(tmp_path_factory.mktemp("steps"), 30_000, 3_000)


_train = train_report


def _link_depth(report):
    """The depth ``--pipeline link`` keeps for steps, given the floor the job's report says it
    measured (pings; a loaded machine's can pass 0.75 ms, and then it goes deeper)."""
    floor = report["round_trip_floor_ms"]
    assert 0 < floor < 50, floor  # one machine: pings, not a queue of steps, time it
    return link_depth(floor, stale=False)


def test_train_on_one_server_steps_the_model_of_each_batch_pulled_after_the_last_push(rows):
    stepped, sequential = _train(rows, "stepped"), _train(rows, "sequential", "--steps", "off", "--pipeline", "1")
    assert stepped["steps"] and not sequential["steps"]
    assert stepped["pipeline_depth"] == _link_depth(stepped) and sequential["pipeline_depth"] == 1
    assert stepped["logloss"] == sequential["logloss"]  # to the bit: the same rows read, the same kernel
    assert stepped["key_ops_per_example"] == sequential["key_ops_per_example"]
    assert stepped["examples"] == 30_000
    two = _train(rows, "two", "--servers", "2")  # a batch's keys on two servers: pulled and pushed
    assert not two["steps"] and two["pipeline_depth"] == link_depth(two["round_trip_floor_ms"], stale=True) >= 4
    assert two["logloss"] < 0.6


def test_a_factorization_machine_on_one_server_steps_too_and_trains_the_sequential_model(rows):
    stepped = _train(rows, "fm-stepped", "--model", "fm")
    sequential = _train(rows, "fm-sequential", "--model", "fm", "--steps", "off", "--pipeline", "1")
    assert stepped["steps"] and stepped["pipeline_depth"] == _link_depth(stepped) and not sequential["steps"]
    assert stepped["logloss"] == sequential["logloss"] < 0.6
