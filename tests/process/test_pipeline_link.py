"""``--pipeline link``, the default (issue 47.5): a worker keeps two batches in flight on one
machine, the same model as ``--pipeline 2`` to the bit, and more where the pings it times the
link with before its first batch are long, here a 5 ms round trip through the nemesis proxy
(``ProxyHosts``: no root)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from support import heavy_rows, train_report

from paramserver.apps.ctr.depth import LINK_BASE, LINK_MS, STEP_DEPTH, link_depth
from paramserver.testing.nemesis.proxied import ProxyHosts

pytestmark = pytest.mark.timeout(240)

PS = [sys.executable, "-m", "paramserver"]


_train = train_report


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return heavy_rows(tmp_path_factory.mktemp("link"), 40_000, 4_000)


def test_on_one_machine_link_is_four_in_flight_and_the_same_model(rows):
    """Batches pulled and pushed (``--steps off``; steps, the default on one server, keep 64
    in flight: tests/process/test_steps_cluster.py)."""
    link, four = _train(rows, "link", "--steps", "off"), _train(rows, "four", "--pipeline", "4", "--steps", "off")
    assert link["pipeline_depth"] == LINK_BASE and link["round_trip_floor_ms"] < LINK_MS
    assert link["logloss"] == four["logloss"] and four["round_trip_floor_ms"] is None


def _listening(host, port):
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def test_over_a_long_round_trip_a_worker_keeps_a_batch_more_in_flight_for_each_ms(rows):
    with ProxyHosts(2, prefix="pl") as hosts:
        with socket.socket() as probe:
            probe.bind((hosts.private(0), 0))
            port = probe.getsockname()[1]
        address = f"tcp://{hosts.address(0)}:{port}"
        nodes = [subprocess.Popen([*hosts.exec(0), *PS, "scheduler", *hosts.listen(0, port), "--servers", "1"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        try:
            deadline = time.monotonic() + 60
            while not _listening(hosts.private(0), port):
                assert time.monotonic() < deadline and nodes[0].poll() is None, "the scheduler did not start"
                time.sleep(0.05)
            nodes.append(subprocess.Popen([*hosts.exec(0), *PS, "server", *hosts.listen(0), "--scheduler", address],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            hosts.delay(1, 2.5, 0.0)  # the client host's every chunk held 2.5 ms each way: 5 ms round trips
            far = _train(rows, "far", "--cluster", address, prefix=hosts.exec(1))
            subprocess.run([*hosts.exec(1), *PS, "cluster", "drop-table", "model/lr", "--scheduler", address],
                           check=True, capture_output=True, timeout=60)  # a job makes its tables new
            pulled = _train(rows, "far-pulled", "--cluster", address, "--steps", "off", prefix=hosts.exec(1))
        finally:
            for node in nodes:
                node.kill()
                node.wait(timeout=10)
    assert far["round_trip_floor_ms"] >= 4.0  # 5 ms, less what the relay wakes early (~0.3 ms a hold)
    assert far["steps"]  # one server: each batch a step, STEP_DEPTH in flight whatever the link
    assert far["pipeline_depth"] == link_depth(far["round_trip_floor_ms"], stale=False) == STEP_DEPTH
    assert far["examples"] == 40_000 and far["logloss"] < 0.6
    # pulled and pushed: 2 and one more a whole ms (at least LINK_BASE), the last batches settling
    assert pulled["round_trip_floor_ms"] >= 4.0 and not pulled["steps"]
    assert pulled["pipeline_depth"] == link_depth(pulled["round_trip_floor_ms"], stale=True) >= 6
    assert pulled["examples"] == 40_000 and pulled["logloss"] < 0.6
