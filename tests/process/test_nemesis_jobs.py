"""Issue 47's short campaign, its training workloads: a real ``paramserver train`` job, reading
files or a stream, joined to a cluster of real processes on emulated hosts, through a failover
and a kill; it must end with every row trained once and the fault-free run's model within what
its consistency allows.  (The counters' campaign is ``test_nemesis.py``; the long campaigns are
``paramserver nemesis --workload train|stream``.)"""

from __future__ import annotations

import os

import pytest

from paramserver.testing.nemesis.jobs import Training, TrainingData
from paramserver.testing.nemesis.plan import Fault, Plan
from paramserver.testing.nemesis.run import run

pytestmark = pytest.mark.timeout(300)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="emulated hosts need root (network namespaces)")


ROWS = 900_000  # long enough for both faults to fall while it trains (600 000 streamed rows ended before the kill once)


@pytest.fixture(scope="module")
def training_data(tmp_path_factory):
    """The rows and the fault-free runs, made once for both workloads (``TrainingData.streamed``)."""
    data = TrainingData.make(str(tmp_path_factory.mktemp("training")), ROWS, workers=1, servers=3)
    assert 0 < data.allowed < 1e-3  # the default against --pipeline 1: what a failover's resends may move
    return data


@needs_root
@pytest.mark.parametrize("workload", ["train", "stream"])
def test_a_training_job_through_a_failover_and_a_kill_ends_with_every_row_and_the_fault_free_model(workload,
                                                                                                    training_data):
    """Issue 47.3: a real ``paramserver train`` job, on files or as a stream, joined to the emulated
    cluster (``--cluster tcp://``); a server cut off past the heartbeat timeout (its vnodes fail over)
    and another killed and started again while it trains."""
    data = training_data.streamed() if workload == "stream" else training_data
    rows = data.rows
    plan = Plan(0, 3, (Fault(1.0, "isolate", (1,), 6.5), Fault(8.0, "kill", (2,), 2.0)), workload)
    out = run(plan, Training(data))
    s = out.summary()
    assert out.verdict.ok, f"{s['violations']} (logs: {out.folder}; events: {out.events})"
    assert s["acked"] == {"examples": rows} and abs(s["model"]["logloss"] - data.logloss) <= data.allowed
    assert any("server1 started again" in e for e in out.events), out.events  # the cut-off server was declared dead
    assert any("kill [2]" in e for e in out.events), out.events  # struck while the job trained
