"""A server that dies holding vnodes no backup has: the job says so, loudly, and fails
(or, with allow_loss, finishes and reports the loss); with replicas the report shows the
failover.  Issue 12, bugs 1 and 11."""

from __future__ import annotations

import threading
import time

import pytest
from support import wait_for

from paramserver import DataLossError
from paramserver.apps.models import Model
from paramserver.apps.synth import write_synth
from paramserver.apps.train import TrainConfig, run_training

pytestmark = pytest.mark.timeout(180)
FAST_DETECTION = {"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 1.5}


def _killer(victim: str, after_examples: int):
    """A ``setup`` for run_training: SIGKILL ``victim`` once the job trained that many examples."""
    def setup(cluster):
        def kill():
            wait_for(lambda: cluster.client.job.status().get("live", {}).get("examples", 0) >= after_examples,
                     120, f"{after_examples} examples")
            cluster.kill(victim)
        threading.Thread(target=kill, daemon=True).start()
    return setup


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("loss") / "train.tsv")
    write_synth(path, 20_000, seed=5)
    return path


def test_an_unreplicated_server_killed_mid_job_fails_it_loudly_and_promptly(data):
    cfg = TrainConfig(Model("lr"), epochs=200)  # ~4e6 examples: far longer than the kill takes to notice
    t0 = time.monotonic()
    with pytest.raises(DataLossError, match=r"server\(s\) \d+ died holding \d+ vnode\(s\) of table\(s\) model/lr "
                                            r"with no backup .* --replicas 2 .* --allow-loss"):
        run_training(cfg, [data], [], servers=2, workers=1, setup=_killer("server-1", 50_000),
                     cluster_options=FAST_DETECTION)
    assert time.monotonic() - t0 < 60  # not the rest of the job, and no hang


def test_allow_loss_finishes_and_reports_what_was_lost(data):
    cfg = TrainConfig(Model("lr"), epochs=40)
    report = run_training(cfg, [data], [data], servers=2, workers=1, setup=_killer("server-1", 50_000),
                          cluster_options=FAST_DETECTION, allow_loss=True)
    assert report["examples"] == 40 * 20_000
    (loss,) = report["data_loss"]
    assert loss["tables"] == ["model/lr"] and loss["vnodes"] > 0
    assert len(report["failovers"]) == 1 and report["logloss"] == report["logloss"]  # scored, not NaN


def test_with_replicas_a_failover_is_reported_and_nothing_is_lost(data):
    cfg = TrainConfig(Model("lr"), epochs=40, replicas=2)
    report = run_training(cfg, [data], [data], servers=3, workers=1, setup=_killer("server-1", 50_000),
                          cluster_options=FAST_DETECTION)
    assert report["examples"] == 40 * 20_000
    assert len(report["failovers"]) == 1 and report["data_loss"] == []
    assert report["stalled_s"] > 0
