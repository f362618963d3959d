"""``--cluster tcp://HOST:PORT``: a job's driver and workers on a cluster that runs already.

The cluster here is a ``LocalCluster`` with no workers of its own, standing in for a scheduler and
servers started where they run; the jobs are the commands a user types, as subprocesses.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from paramserver.apps.ctr.synth import write_synth
from paramserver.cluster.local import LocalCluster
from paramserver.cluster.standing import StandingCluster
from paramserver.errors import ConfigError, ConnectError

TIMEOUT_S = 180


def _command(*args: str, timeout_s: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "paramserver", *args], capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "PARAMSERVER_LOG_LEVEL": "WARNING"})


@pytest.fixture(scope="module")
def standing():
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("standing")
    train, test = str(folder / "train.tsv"), str(folder / "test.tsv")
    write_synth(train, 20_000, seed=1, shape="heavy")
    write_synth(test, 2_000, seed=2, shape="heavy")
    return folder, train, test


def test_train_joins_a_running_cluster_and_leaves_it_running(standing, data):
    folder, train, test = data
    out = str(folder / "report.json")
    ran = _command("train", "--data", train, "--test", test, "--cluster", standing.address, "--workers", "2",
                   "--replicas", "2", "--quiet", "--metrics-out", out)
    assert ran.returncode == 0, ran.stderr
    with open(out) as f:
        report = json.load(f)
    assert report["examples"] == 20_000 and report["servers"] == 2 and report["workers"] == 2
    assert report["failed_workers"] == [] and np.isfinite(report["logloss"])
    # the cluster is still up, holds the model, and its servers are the two it had
    info = standing.client.admin.cluster_info()
    assert len(info["ring_servers"]) == 2 and info["workers"] == {}
    table = next(iter(standing.client.tables()))
    assert standing.client.tables()[table].replicas == 2
    held = sum(s["tables"][table]["primary_keys"] for s in standing.client.stats.server_stats())
    assert held > 10_000

    # a second job must not train on the first one's rows: refused, with the fix, and nothing changed
    again = _command("train", "--data", train, "--cluster", standing.address, "--quiet")
    assert again.returncode == 2
    assert f"table {table!r} exists on this cluster already" in again.stderr
    assert f"paramserver cluster drop-table {table} --scheduler" in again.stderr
    assert sum(s["tables"][table]["primary_keys"] for s in standing.client.stats.server_stats()) == held

    dropped = _command("cluster", "drop-table", table, "--scheduler", standing.address)
    assert dropped.returncode == 0 and f"table {table} dropped" in dropped.stdout, dropped.stderr
    missing = _command("cluster", "drop-table", table, "--scheduler", standing.address)
    assert missing.returncode == 2 and f"has no table {table!r}" in missing.stderr
    third = _command("train", "--data", train, "--test", test, "--cluster", standing.address, "--quiet",
                     "--metrics-out", out)
    assert third.returncode == 0, third.stderr
    with open(out) as f:
        assert json.load(f)["examples"] == 20_000
    standing.client.drop_table(table)


def test_a_scheduled_app_runs_on_a_running_cluster(standing, tmp_path):
    """The same flag on every command that trains: lda's word blocks over the running servers."""
    rng = np.random.default_rng(0)
    corpus = tmp_path / "docs.ldac"
    corpus.write_text("".join(f"{n} " + " ".join(f"{w}:{c}" for w, c in zip(
        rng.choice(60, n, replace=False), rng.integers(1, 4, n))) + "\n" for n in rng.integers(3, 12, 200)))
    ran = _command("lda", "--data", str(corpus), "--topics", "4", "--iterations", "5", "--workers", "2",
                   "--cluster", standing.address, "--quiet")
    assert ran.returncode == 0, ran.stderr
    assert standing.client.admin.cluster_info()["workers"] == {}
    for table in list(standing.client.tables()):
        standing.client.drop_table(table)


def test_no_cluster_at_the_address_is_said_with_the_fix():
    said = r"could not join the cluster at tcp://127.0.0.1:1: nothing listens .* is the scheduler running.*--cluster"
    with pytest.raises(ConnectError, match=said):
        with StandingCluster("tcp://127.0.0.1:1", workers=1, startup_timeout_s=1.0):
            pass


def test_a_running_cluster_gives_its_address_not_a_name():
    with pytest.raises(ConfigError, match="tcp://HOST:PORT"):
        StandingCluster("localhost:7000")
