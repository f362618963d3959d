"""Scheduled rounds survive a dead worker (issue 15): a worker SIGKILLed in a round of
``paramserver mf`` or ``paramserver lasso`` is found missing at the barrier, the
survivors regroup (take over its users, or its share of the coordinates), and the job
finishes with the quality it would have had.  The kill comes from inside the victim at
a chosen round, so no timing luck is involved."""

from __future__ import annotations

import os
import signal
import tempfile

import numpy as np
import pytest

from paramserver.cluster.local import LocalCluster

pytestmark = pytest.mark.timeout(240)
FAST_DEATH = {"log_level": "WARNING", "heartbeat_interval_s": 0.1, "heartbeat_timeout_s": 1.0}


def _dies_in_round(client, victim, round_, owner, worker, *args):
    """Run ``worker``; on rank ``victim``, ``owner.update`` kills the process at ``round_``."""
    if client.rank == victim:
        update = owner.update

        def dying(self, r, mine):
            if r == round_:
                os.kill(os.getpid(), signal.SIGKILL)
            return update(self, r, mine)
        owner.update = dying
    return worker(client, *args)


@pytest.mark.parametrize("dies_in", [7, 16])
def test_mf_carries_on_without_a_killed_worker(dies_in):
    """Killed in epoch 3 (round 7), before its user rows were first pushed (every 5 epochs):
    its users go on from their initial draw; in epoch 6 (round 16): from epoch 5's push."""
    from paramserver.apps.rounds.mf import ITEMS, USERS, MFConfig, MFProgram, mf_worker
    from paramserver.apps.rounds.mf_strata import layout, save_strata, strata

    rng = np.random.default_rng(4)
    n_u, n_i, W = 150, 90, 3
    P, Q = rng.normal(0, 0.8, (n_u, 3)), rng.normal(0, 0.8, (n_i, 3))
    pair = np.unique(rng.integers(0, n_u, 9000) * n_i + rng.integers(0, n_i, 9000))
    u, i = pair // n_i, pair % n_i
    r = np.clip(3 + (P[u] * Q[i]).sum(1) + rng.normal(0, 0.2, u.size), 1, 5).astype(np.float32)
    cfg = MFConfig(rank=8, epochs=30)
    lay = layout(np.bincount(u, minlength=n_u), np.bincount(i, minlength=n_i), W)
    mu = float(r.mean())
    with tempfile.TemporaryDirectory() as scratch, LocalCluster(servers=1, workers=W, **FAST_DEATH) as cluster:
        paths = save_strata(scratch, strata(u, i, r, lay, W, 0))
        client = cluster.client
        client.create_table(USERS, dim=9, key_bits=8)
        client.create_table(ITEMS, dim=9, key_bits=7)
        init = np.zeros((n_i, 9), np.float32)
        init[:, :8] = rng.normal(0, 0.05, (n_i, 8))
        client.push(ITEMS, np.arange(n_i, dtype=np.uint64), init, op="assign").result(timeout=30)
        results, lost = cluster.run_elastic(_dies_in_round, 1, dies_in, MFProgram, mf_worker, paths, cfg, mu,
                                            lay.user_start, lay.item_start)
        keys_u, rows_u = client.export_table(USERS)
        keys_i, rows_i = client.export_table(ITEMS)
    assert len(lost) == 1 and "died" in lost[0]  # rank 1: ranks go by registration, not by process name
    assert sorted(x["rank"] for x in results) == [0, 2] and all(x["regroups"] == 1 for x in results)
    assert sum(x["ratings"] for x in results) == r.size  # every user group is held by a survivor
    Pu = np.zeros((n_u, 9), np.float32)
    Pu[keys_u.astype(np.int64)] = rows_u
    Qi = np.zeros((n_i, 9), np.float32)
    Qi[keys_i.astype(np.int64)] = rows_i
    Pu, Qi = Pu[lay.user_key], Qi[lay.item_key]
    pred = mu + Pu[u, 8] + Qi[i, 8] + (Pu[u, :8] * Qi[i, :8]).sum(1)
    rmse = float(np.sqrt(np.mean((pred - r) ** 2)))
    assert rmse < 0.5 * float(r.std()), (rmse, r.std())  # every user was trained to the end, the victim's too


@pytest.mark.parametrize("consistency", ["bsp", "asp"])
def test_lasso_carries_on_without_a_killed_worker(tmp_path, consistency):
    """Rounds gated on the server (the job's own table, ``bsp``: the death is found a round
    later) and behind barriers (a table without the gate, as an older checkpoint's)."""
    sklearn = pytest.importorskip("sklearn.linear_model")
    from paramserver.apps.rounds.lasso import TABLE, LassoConfig, LassoProgram, join64, lasso_worker
    from paramserver.apps.rounds.lasso_math import objective
    from paramserver.apps.rounds.matrix import read_libsvm_matrix

    rng = np.random.default_rng(5)
    n, d = 300, 120
    X = rng.standard_normal((n, d)) * (rng.random((n, d)) < 0.1)
    w = np.zeros(d)
    w[::10] = rng.standard_normal(w[::10].size)
    y = X @ w + 0.05 * rng.standard_normal(n)
    path = tmp_path / "train.svm"
    path.write_text("".join(f"{float(y[k])!r} " + " ".join(f"{j + 1}:{float(X[k, j])!r}" for j in np.flatnonzero(X[k]))
                            + "\n" for k in range(n)))
    lam = np.abs(X.T @ y).max() / n / 20
    cfg = LassoConfig(lam=float(lam), tol=1e-5, per_round=16, sweeps=1)
    with LocalCluster(servers=1, workers=2, **FAST_DEATH) as cluster:
        cluster.client.create_table(TABLE, dim=2, key_bits=9, block_size=32, consistency=consistency)
        results, lost = cluster.run_elastic(_dies_in_round, 1, 3, LassoProgram, lasso_worker, str(path), d, cfg, 2)
        keys, values = cluster.client.export_table(TABLE)
    assert len(lost) == 1 and [x["rank"] for x in results] == [0] and results[0]["regroups"] == 1, lost
    assert results[0]["gated"] == (consistency == "bsp")
    assert results[0]["converged"], str({k: v for k, v in results[0].items() if k != "history"})
    coef = np.zeros(d)
    latest = keys < d
    coef[keys[latest].astype(np.int64)] = join64(values[latest])
    ref = sklearn.Lasso(alpha=lam, fit_intercept=False, tol=1e-12, max_iter=100_000).fit(X, y)
    m = read_libsvm_matrix(str(path), d)
    best = objective(m, ref.coef_, lam)
    assert objective(m, coef, lam) <= best * (1 + 1e-5)


def _waits_for_a_joiner(client, folder, round_, worker, *args):
    """Run ``worker``; on rank 0, ``MFProgram.update`` says (a file) that round ``round_``
    has come and waits until the test has added a worker (another file)."""
    import pathlib
    import time

    from paramserver.apps.rounds.mf import MFProgram

    if client.rank == 0 and not client.joined_midway:
        update = MFProgram.update

        def waiting(self, r, mine):
            if r == round_:
                pathlib.Path(folder, "round").write_text("")
                deadline = time.monotonic() + 60
                while not pathlib.Path(folder, "added").exists():
                    assert time.monotonic() < deadline, "the test did not add a worker"
                    time.sleep(0.01)
            return update(self, r, mine)
        MFProgram.update = waiting
    return worker(client, *args)


def test_a_worker_that_joins_midway_leaves_and_the_rounds_go_on_unchanged(tmp_path):
    """A worker added while MF's rounds run has no part (they were dealt at the start): it
    leaves the cluster, the rounds' barriers stop waiting for it, and the model is exactly
    that of a run nobody joined."""
    import pathlib
    import threading
    import time

    from paramserver.apps.rounds.mf import ITEMS, USERS, MFConfig, mf_worker
    from paramserver.apps.rounds.mf_strata import layout, save_strata, strata
    from paramserver.apps.rounds.program import took_part

    rng = np.random.default_rng(6)
    n_u, n_i, W = 60, 40, 2
    pair = np.unique(rng.integers(0, n_u, 2000) * n_i + rng.integers(0, n_i, 2000))
    u, i = pair // n_i, pair % n_i
    r = rng.integers(1, 6, u.size).astype(np.float32)
    cfg = MFConfig(rank=4, epochs=6)
    lay = layout(np.bincount(u, minlength=n_u), np.bincount(i, minlength=n_i), W)
    init = np.zeros((n_i, 5), np.float32)
    init[:, :4] = rng.normal(0, 0.05, (n_i, 4))

    def train(join):
        folder = tmp_path / ("joined" if join else "alone")
        folder.mkdir()
        with LocalCluster(servers=1, workers=W, **FAST_DEATH) as cluster:
            paths = save_strata(str(folder), strata(u, i, r, lay, W, 0))
            client = cluster.client
            client.create_table(USERS, dim=5, key_bits=6)
            client.create_table(ITEMS, dim=5, key_bits=6)
            client.push(ITEMS, np.arange(n_i, dtype=np.uint64), init, op="assign").result(timeout=30)

            def add_when_asked():
                deadline = time.monotonic() + 60
                while not (folder / "round").exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                cluster.add_worker()
                (folder / "added").write_text("")
            helper = threading.Thread(target=add_when_asked, daemon=True)
            if join:
                helper.start()
                results, lost = cluster.run_elastic(_waits_for_a_joiner, str(folder), 5, mf_worker, paths, cfg,
                                                    1.0, lay.user_start, lay.item_start)
                helper.join(timeout=60)
            else:
                results, lost = cluster.run_elastic(mf_worker, paths, cfg, 1.0, lay.user_start, lay.item_start)
            tables = [client.export_table(t) for t in (USERS, ITEMS)]
        assert pathlib.Path(folder, "added").exists() == join
        return results, lost, tables

    alone, _, model = train(False)
    joined, lost, model_joined = train(True)
    kept, left = took_part(joined)
    assert lost == [] and left == 1 and len(kept) == W and [x["rank"] for x in kept] == [0, 1]
    for (keys, rows), (keys_j, rows_j) in zip(model, model_joined):
        order, order_j = np.argsort(keys), np.argsort(keys_j)
        assert np.array_equal(keys[order], keys_j[order_j]) and np.array_equal(rows[order], rows_j[order_j])
