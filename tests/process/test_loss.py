"""A server that dies holding vnodes no backup has: the job says so, loudly, and fails
(or, with allow_loss, finishes and reports the loss); with replicas the report shows the
failover.  Issue 12, bugs 1 and 11."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from support import wait_for

from paramserver import DataLossError
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.synth import write_synth
from paramserver.apps.ctr.train import TrainConfig, run_training
from paramserver.errors import ClosedError

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


def _count_forever(client, stop_file):
    """Push +1 to a few keys until ``stop_file`` exists (the disturbance happens meanwhile)."""
    import os

    import numpy as np

    keys = np.arange(64, dtype=np.uint64)
    deadline = time.monotonic() + 120
    while not os.path.exists(stop_file) and time.monotonic() < deadline:
        client.push("w", keys, -np.ones((64, 1), np.float32)).result(timeout=60)
    client.push("w", keys, -np.ones((64, 1), np.float32)).result(timeout=60)  # after the loss was told
    return client.rank


def test_a_client_raises_on_its_next_call_after_a_server_died_with_data():
    """Issue 28.2: outside ``train``, a server's death at replicas 1 was silent: pushes were
    acknowledged while the keys restarted from zero.  The next call raises, once."""
    from paramserver import LocalCluster

    with LocalCluster(servers=2, workers=0, **FAST_DETECTION, log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("w", dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=1)
        client.push("w", np.arange(1000, dtype=np.uint64), -np.ones((1000, 1), np.float32)).result(timeout=30)
        cluster.kill("server-1")
        wait_for(lambda: client.stats.losses, 30, "the client to hear of the loss")
        with pytest.raises(DataLossError, match=r"server\(s\) \d+ died holding \d+ vnode\(s\) of table\(s\) w .*"
                                                r"replicas=2 .*allow_loss=True"):
            client.pull("w", np.arange(10, dtype=np.uint64))
        client.pull("w", np.arange(10, dtype=np.uint64)).result(timeout=30)  # said once; the client goes on
        (loss,) = client.stats.losses
        assert loss["tables"] == ["w"] and loss["vnodes"] > 0


def test_a_command_on_the_cluster_fails_with_one_line_or_reports_with_allow_loss(tmp_path):
    """What ``lasso``, ``mf`` and ``lda`` do (``client/losses.py``): workers raise on their
    next call, the command ends with one line naming the fix; with ``--allow-loss`` it
    finishes and reports the loss."""
    from paramserver import LocalCluster
    from paramserver.client.losses import surfacing_losses, tolerating_loss

    for allow in (False, True):
        stop = str(tmp_path / f"stop-{allow}")
        with LocalCluster(servers=2, workers=1, **FAST_DETECTION, log_level="WARNING") as cluster:
            cluster.client.create_table("w", dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=1)

            def kill_then_stop(cluster=cluster, stop=stop):
                probe = np.zeros(1, np.uint64)
                wait_for(lambda: cluster.client.pull("w", probe).result(timeout=30)[0, 0] > 0, 60,
                         "the worker's pushes to run")
                cluster.kill("server-1")
                try:
                    wait_for(lambda: cluster.client.stats.losses, 30, "the loss to be told")
                except ClosedError:  # the worker raised it first and the cluster stopped: nothing left to stop
                    return
                open(stop, "w").close()

            helper = threading.Thread(target=kill_then_stop, daemon=True)
            helper.start()
            worker = tolerating_loss(_count_forever) if allow else _count_forever
            if allow:
                with surfacing_losses(cluster, True) as losses:
                    assert cluster.run_elastic(worker, stop)[0] == [0]
                assert losses.report()["data_loss"][0]["tables"] == ["w"]
            else:
                with pytest.raises(DataLossError, match=r"died holding .* --replicas 2 .* --allow-loss"):
                    with surfacing_losses(cluster, False):
                        cluster.run_elastic(worker, stop)
        helper.join(60)
        assert not helper.is_alive()
