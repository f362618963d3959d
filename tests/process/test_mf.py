"""``paramserver mf`` end to end (issue 15): two and three workers rotating item blocks
give exactly the factors of one serial SGD over the same strata in the same order (no
update lost or applied twice, no two workers on one block); the model predicts held-out
ratings better than the biases alone; bad flags are refused before any work."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from paramserver.apps.rounds.mf import _sgd
from paramserver.apps.rounds.mf_strata import layout, save_strata, strata

pytestmark = pytest.mark.timeout(240)


def _cli(*args, check=True):
    run = subprocess.run([sys.executable, "-m", "paramserver", "mf", "--json", *args], capture_output=True, text=True,
                         timeout=200)
    if check:
        assert run.returncode == 0, run.stderr
    return run


def _ratings(tmp_path, n_users=80, n_items=50, n=3000, seed=3, named=False):
    rng = np.random.default_rng(seed)
    P, Q = rng.normal(0, 0.7, (n_users, 3)), rng.normal(0, 0.7, (n_items, 3))
    pair = np.unique(rng.integers(0, n_users, n) * n_items + rng.integers(0, n_items, n))
    rng.shuffle(pair)
    u, i = pair // n_items, pair % n_items
    r = np.clip(np.rint(3 + (P[u] * Q[i]).sum(1) + rng.normal(0, 0.3, u.size)), 1, 5)
    ids_u, ids_i = u * 7 + 100, i * 3 + 5  # sparse ids, as MovieLens has
    cut = u.size // 5
    train, test = tmp_path / "train.csv", tmp_path / "test.tsv"
    u_, i_ = ("user-", "item-") if named else ("", "")  # ids as names (Amazon's files), or numbers
    train.write_text("userId,movieId,rating,timestamp\n" + "".join(
        f"{u_}{a},{i_}{b},{c:g},0\n" for a, b, c in zip(ids_u[cut:], ids_i[cut:], r[cut:])))
    test.write_text("".join(f"{u_}{a}\t{i_}{b}\t{c:g}\t0\n" for a, b, c in zip(ids_u[:cut], ids_i[:cut], r[:cut])))
    return (ids_u[cut:], ids_i[cut:], r[cut:].astype(np.float32)), (ids_u[:cut], ids_i[:cut], r[:cut]), train, test


def _serial(train, workers, rank, epochs, tmp_path, std=0.05, seed=0, lr=0.007, reg=0.06, reg_bias=0.01):
    """The same strata, in the same order, one after another in this process."""
    users, items, r = train
    user_ids, u = np.unique(users, return_inverse=True)
    item_ids, i = np.unique(items, return_inverse=True)
    mu = float(r.astype(np.float64).mean())
    lay = layout(np.bincount(u), np.bincount(i), workers)
    tmp_path.mkdir()
    paths = save_strata(str(tmp_path), strata(u, i, r, lay, workers, seed))
    Q = np.zeros((item_ids.size, rank + 1), np.float32)
    Q[:, :rank] = np.random.default_rng([seed, 1 << 20]).normal(0.0, std, (item_ids.size, rank))
    Ps, files = [], []
    for q in range(workers):
        n_q = int(lay.user_start[q + 1] - lay.user_start[q])
        P = np.zeros((n_q, rank + 1), np.float32)
        P[:, :rank] = np.random.default_rng([seed, q]).normal(0.0, std, (n_q, rank))
        Ps.append(P)
        files.append(dict(np.load(paths[q])))
    for round_ in range(epochs * workers):
        for q in range(workers):
            b = (q + round_) % workers
            z, lo, hi = files[q], files[q]["start"][b], files[q]["start"][b + 1]
            block = Q[lay.item_start[b]:lay.item_start[b + 1]]
            _sgd(z["users"][lo:hi], z["items"][lo:hi], z["ratings"][lo:hi], Ps[q], block, mu, lr, reg, reg_bias)
    return np.concatenate(Ps)[lay.user_key], Q[lay.item_key], user_ids, item_ids


@pytest.mark.parametrize("workers", [2, 3])
def test_block_rotation_is_exactly_serial_sgd_over_the_strata(tmp_path, workers):
    train, _, train_path, test_path = _ratings(tmp_path)
    out = tmp_path / "model"
    _cli("--data", str(train_path), "--test", str(test_path), "--rank", "6", "--epochs", "4", "--workers",
         str(workers), "--save", str(out))
    got = np.load(out / "mf.npz")
    P, Q, user_ids, item_ids = _serial(train, workers, 6, 4, tmp_path / "replay")
    np.testing.assert_array_equal(got["user_ids"], user_ids)
    np.testing.assert_array_equal(got["item_ids"], item_ids)
    np.testing.assert_allclose(got["user_factors"], P[:, :6], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["item_factors"], Q[:, :6], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["user_bias"], P[:, 6], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["item_bias"], Q[:, 6], rtol=1e-5, atol=1e-6)
    assert np.abs(got["item_factors"]).max() > 0.05  # trained, not left at zero


@pytest.mark.parametrize("named", [False, True])
def test_predicts_held_out_ratings_better_than_the_biases_alone(tmp_path, named):
    train, test, train_path, test_path = _ratings(tmp_path, n_users=200, n_items=120, n=14000, named=named)
    pred_path, metrics, out = tmp_path / "pred.txt", tmp_path / "m.json", tmp_path / "model"
    run = _cli("--data", str(train_path), "--test", str(test_path), "--predictions-out", str(pred_path),
               "--metrics-out", str(metrics), "--save", str(out))
    saved = np.load(out / "mf.npz")
    want = sorted(f"user-{x}" for x in set(train[0].tolist())) if named else sorted(set(train[0].tolist()))
    assert sorted(saved["user_ids"].tolist()) == want and len(saved["user_factors"]) == len(want)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report == json.loads(metrics.read_text())
    assert report["test_unseen_share"] < 0.1 and "never seen in training" not in run.stderr
    if named:  # a test file of numbers against names: every pair unseen, said on stderr (it said nothing)
        (tmp_path / "numbers").mkdir()
        numbers = _ratings(tmp_path / "numbers", n=200)[3]
        other = _cli("--data", str(train_path), "--test", str(numbers), "--epochs", "1")
        assert "100.0% of the test ratings have a user or item never seen in training" in other.stderr, other.stderr
    pred = np.loadtxt(pred_path)
    truth = test[2]
    assert pred.shape == truth.shape and pred.min() >= 1 and pred.max() <= 5
    rmse = float(np.sqrt(np.mean((pred - truth) ** 2)))
    assert rmse == pytest.approx(report["test_rmse"], rel=1e-5)
    # the best one can do with biases only: least squares for μ + b_u + b_i on the training ratings
    users, items, r = train
    _, u = np.unique(np.r_[users, test[0]], return_inverse=True)
    _, i = np.unique(np.r_[items, test[1]], return_inverse=True)
    n = users.size
    A = np.zeros((u.size, u.max() + i.max() + 3))
    A[np.arange(u.size), u] = 1
    A[np.arange(u.size), u.max() + 1 + i] = 1
    A[:, -1] = 1
    coef = np.linalg.lstsq(np.r_[A[:n], 0.5 * np.eye(A.shape[1])[:-1]], np.r_[r, np.zeros(A.shape[1] - 1)],
                           rcond=None)[0]
    biases = float(np.sqrt(np.mean((np.clip(A[n:] @ coef, 1, 5) - truth) ** 2)))
    assert rmse < 0.9 * biases, (rmse, biases)
    assert report["rating_updates"] == 40 * n and report["rating_updates_per_s"] > 0


@pytest.mark.parametrize("args,message", [
    (["--rank", "0"], "--rank must be"),
    (["--epochs", "0"], "--epochs must be"),
    (["--lr", "2"], "--lr must be"),
    (["--predictions-out", "PRED"], "--predictions-out needs --test"),
    (["--save", "FILE"], "is a file"),
    (["--seed", "-1"], "--seed must be a whole number in [0, 2^63), got -1"),  # was numpy's bare ValueError
    (["--workers", "500"], "items, and each worker holds a part of the users"),  # ran on, a round a worker
])
def test_bad_flags_are_refused_before_any_work(tmp_path, args, message):
    _, _, train_path, _ = _ratings(tmp_path, n=200)
    (tmp_path / "file").write_text("x")
    args = [a.replace("PRED", str(tmp_path / "p.txt")).replace("FILE", str(tmp_path / "file")) for a in args]
    run = _cli("--data", str(train_path), *args, check=False)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr


def test_a_malformed_line_is_named(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("1\t2\t3\n1\t3\tfive\n")
    run = _cli("--data", str(path), check=False)
    assert run.returncode == 2 and f"{path}:2:" in run.stderr and "rating" in run.stderr


def test_mf_is_watched_as_train_is(tmp_path):
    """``mf`` takes train's watch flags and ends with the same kind of report (issue 33.7):
    --log-dir keeps the nodes' logs, --dashboard prints its URL, the report is a table (and
    --json one line); --quiet shows no live line."""
    _, _, train_path, test_path = _ratings(tmp_path, n_users=60, n_items=40, n=3000)
    logs = tmp_path / "logs"
    run = subprocess.run([sys.executable, "-m", "paramserver", "mf", "--data", str(train_path), "--test",
                          str(test_path), "--epochs", "2", "--log-dir", str(logs), "--dashboard", "--quiet"],
                         capture_output=True, text=True, timeout=200)
    assert run.returncode == 0, run.stderr
    assert "paramserver mf" in run.stdout and "test rmse" in run.stdout and "{" not in run.stdout
    assert "dashboard http://127.0.0.1:" in run.stdout + run.stderr
    assert {p.name for p in logs.iterdir()} >= {"scheduler.log", "server-0.log", "worker-0.log"}
