"""Scheduled rounds checkpoint at round boundaries and resume (issue 15).

A whole job killed in a round (driver, servers and workers: the kill comes from inside
a worker at a chosen round, so no timing luck is involved) goes on from its newest
checkpoint with ``--resume`` and ends exactly where an uninterrupted job ends: the same
predictions (``mf``), the same topic-word counts (``lda``), to the bit.  ``lasso``
goes on from a checkpoint to the optimum.  A fresh job does not write among another
job's checkpoints, and a resume with other data or settings is refused, naming them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from paramserver.checkpoint import store as ckpt

pytestmark = pytest.mark.timeout(300)
HERE = os.path.dirname(os.path.abspath(__file__))


def crash_job(round_, owner, worker, client, *args):
    """Run ``worker``; on rank 0, ``owner.update`` kills the driver and itself at ``round_``
    (the servers and the other workers end with their parent)."""
    if client.rank == 0:
        update = owner.update

        def dying(self, r, mine):
            if r == round_:
                os.kill(os.getppid(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
            return update(self, r, mine)
        owner.update = dying
    return worker(client, *args)


_DRIVER = """
import functools, sys
sys.path.insert(0, {here!r})
import paramserver.apps.rounds.{module} as app
import test_round_checkpoints as t
app.{app}_worker = functools.partial(t.crash_job, {round}, app.{program}, app.{app}_worker)
from paramserver.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _cli(*args, check=True):
    run = subprocess.run([sys.executable, "-m", "paramserver", args[0], "--json", *args[1:]], capture_output=True,
                         text=True, timeout=250)
    if check:
        assert run.returncode == 0, run.stderr
    return run


def _crashed(app, program, round_, *args):
    """Run ``paramserver APP ARGS`` until rank 0 kills the job in ``round_``."""
    module = {"lda": "lda_program"}.get(app, app)  # where the app's worker and program are
    script = _DRIVER.format(here=HERE, module=module, app=app, program=program, round=round_)
    run = subprocess.run([sys.executable, "-c", script, app, *args], capture_output=True, text=True, timeout=250)
    assert run.returncode == -signal.SIGKILL, (run.returncode, run.stderr)


def _newest_round(folder):
    return ckpt.read_manifest(ckpt.latest_step(str(folder)))["rounds"]["round"]


def _ratings(path, seed=3, n_users=120, n_items=70, n=5000):
    rng = np.random.default_rng(seed)
    P, Q = rng.normal(0, 0.7, (n_users, 3)), rng.normal(0, 0.7, (n_items, 3))
    pair = np.unique(rng.integers(0, n_users, n) * n_items + rng.integers(0, n_items, n))
    u, i = pair // n_items, pair % n_items
    r = np.clip(np.rint(3 + (P[u] * Q[i]).sum(1) + rng.normal(0, 0.3, u.size)), 1, 5)
    path.write_text("".join(f"{a}\t{b}\t{c:g}\t0\n" for a, b, c in zip(u, i, r)))
    return path


def test_mf_killed_job_resumes_to_exactly_the_uninterrupted_model(tmp_path):
    data = _ratings(tmp_path / "u.data")
    common = ["--data", str(data), "--test", str(data), "--rank", "8", "--epochs", "6", "--workers", "2"]
    _cli("mf", *common, "--predictions-out", str(tmp_path / "whole.txt"))
    folder = tmp_path / "ck"
    # epochs of 2 rounds, a checkpoint each epoch: killed in round 5 (epoch 3), the newest is round 4
    _crashed("mf", "MFProgram", 5, *common, "--checkpoint-dir", str(folder), "--checkpoint-every", "1")
    assert _newest_round(folder) == 4
    run = _cli("mf", *common, "--checkpoint-dir", str(folder), "--resume", str(folder),
               "--predictions-out", str(tmp_path / "resumed.txt"))
    report = json.loads(run.stdout)
    assert report["resumed_at_epoch"] == 2 and report["rating_updates"] == 4 * report["train_ratings"]
    whole, resumed = (tmp_path / "whole.txt").read_text(), (tmp_path / "resumed.txt").read_text()
    assert len(whole.splitlines()) == len(data.read_text().splitlines())
    assert resumed == whole
    assert _newest_round(folder) == 12  # the last round is always checkpointed


def _docword(path, docs=200, vocabulary=400, seed=1):
    rng = np.random.default_rng(seed)
    lines = [f"{d + 1} {w + 1} {rng.integers(1, 4)}" for d in range(docs)
             for w in np.sort(rng.choice(vocabulary, 30, replace=False))]
    path.write_text(f"{docs}\n{vocabulary}\n{len(lines)}\n" + "\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("sampler", [["sparse"], ["mh"], ["hybrid"], ["hybrid", "--mh-share", "0.2"],
                                     ["sparse", "--optimize-alpha", "1"], ["hybrid", "--optimize-alpha", "2"]])
def test_lda_killed_job_resumes_to_exactly_the_uninterrupted_counts(tmp_path, sampler):
    """The MH sampler's document index is rebuilt from the topics saved: nothing of its own is saved.
    ``hybrid`` goes from MH to exact sweeps at round 14 (7 of 10 sweeps), after the resume, or
    (``--mh-share 0.2``) at round 4, before the checkpoint: the same counts either way.  A learnt α
    is saved with the topics, its step of the checkpoint's sweep taken first: the same α after."""
    data = _docword(tmp_path / "docword.txt")
    common = ["--data", str(data), "--topics", "8", "--iterations", "10", "--workers", "2", "--pieces", "2",
              "--sampler", *sampler]
    whole_report = json.loads(_cli("lda", *common, "--save", str(tmp_path / "whole")).stdout)
    folder = tmp_path / "ck"
    # iterations of 2 rounds, a checkpoint every 3: killed in round 9 (iteration 5), the newest is round 6
    _crashed("lda", "LDAProgram", 9, *common, "--checkpoint-dir", str(folder), "--checkpoint-every", "3")
    assert _newest_round(folder) == 6
    run = _cli("lda", *common, "--checkpoint-dir", str(folder), "--resume", str(folder), "--save",
               str(tmp_path / "resumed"))
    report = json.loads(run.stdout)
    assert report["resumed_at_iteration"] == 3 and report["counts_consistent"]
    assert report["blocks_in_pieces"] and whole_report["blocks_in_pieces"]  # resumed half way through a round's totals
    whole = np.load(tmp_path / "whole" / "topic_word.npy")
    resumed = np.load(tmp_path / "resumed" / "topic_word.npy")
    assert whole.sum() == report["tokens"] and np.array_equal(whole, resumed)
    assert report["alpha_learned"] == whole_report["alpha_learned"]
    assert (report["alpha_learned"] is None) == ("--optimize-alpha" not in sampler)
    assert report["alpha_learned"] is None or report["alpha_learned"] != 0.1  # it moved


def _regression(path, n=300, d=120, seed=5):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * (rng.random((n, d)) < 0.1)
    w = np.zeros(d)
    w[:8] = rng.normal(0, 2, 8)
    y = X @ w + rng.normal(0, 0.1, n)
    path.write_text("".join(f"{y[i]:.6g} " + " ".join(f"{j + 1}:{X[i, j]:.6g}" for j in np.flatnonzero(X[i]))
                            + "\n" for i in range(n)))
    return path, X.round(6), np.array([float(f"{v:.6g}") for v in y])


def test_lasso_goes_on_from_a_checkpoint_to_the_optimum(tmp_path):
    sklearn = pytest.importorskip("sklearn.linear_model")
    data, X, y = _regression(tmp_path / "reg.svm")
    folder = tmp_path / "ck"
    first = json.loads(_cli("lasso", "--data", str(data), "--lambda-ratio", "30", "--max-rounds", "2",
                            "--checkpoint-dir", str(folder)).stdout)
    assert first["rounds"] == 2 and _newest_round(folder) == 2
    run = _cli("lasso", "--data", str(data), "--lambda-ratio", "30", "--tol", "1e-9", "--checkpoint-dir",
               str(folder), "--resume", str(folder), "--save", str(tmp_path / "out"))
    report = json.loads(run.stdout)
    assert report["resumed_at_round"] == 2 and report["converged"]
    w = np.load(tmp_path / "out" / "coef.npy")
    lam = report["lambda"]
    ref = sklearn.Lasso(alpha=lam, fit_intercept=False, tol=1e-12, max_iter=100_000).fit(X, y).coef_

    def objective(v):
        return 0.5 * np.mean((y - X @ v) ** 2) + lam * np.abs(v).sum()
    assert objective(w) <= objective(ref) * (1 + 1e-6)


def test_checkpoint_folders_of_another_job_are_refused(tmp_path):
    data = _ratings(tmp_path / "u.data", n=1500)
    folder = tmp_path / "ck"
    common = ["--data", str(data), "--rank", "4", "--epochs", "2"]
    _cli("mf", *common, "--checkpoint-dir", str(folder))
    again = _cli("mf", *common, "--checkpoint-dir", str(folder), check=False)
    assert again.returncode == 2 and "already holds checkpoints" in again.stderr and "--resume" in again.stderr
    other = _cli("mf", *common, "--workers", "3", "--resume", str(folder), check=False)
    assert other.returncode == 2 and "workers: 2 in the checkpoint, 3 now" in other.stderr
    bad = _cli("mf", *common, "--checkpoint-dir", str(tmp_path / "new"), "--checkpoint-every", "0", check=False)
    assert bad.returncode == 2 and "--checkpoint-every must be a whole number >= 1, got 0" in bad.stderr
    missing = _cli("lda", "--data", str(data), "--resume", str(tmp_path / "nothing"), check=False)
    assert missing.returncode == 2 and "no checkpoint" in missing.stderr
    regression, _, _ = _regression(tmp_path / "reg.svm")
    lasso = _cli("lasso", "--data", str(regression), "--lambda-ratio", "2", "--resume", str(folder), check=False)
    assert lasso.returncode == 2 and "app: 'mf' in the checkpoint, 'lasso' now" in lasso.stderr
