"""A cluster across real network namespaces (issue 12, bug 3): the scheduler and a server in
one, a server and the worker in another, joined by a veth pair, every node bound on
0.0.0.0.  Each server must advertise the address its peers can reach (not 0.0.0.0), and a9a
trains across the link.  The test makes and removes its namespaces; it is skipped where
``ip netns`` is not permitted (it needs root, as CI has)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import shared

pytestmark = pytest.mark.timeout(240)


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    if shutil.which("ip") is None:
        pytest.skip("no ip command (iproute2) here")
    tag = f"ps{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"
    net = f"10.{20 + os.getpid() % 200}.{(os.getpid() // 200) % 250}"
    made = []
    try:
        for ns in (a, b):
            done = _ip("netns", "add", ns)
            if done.returncode:
                pytest.skip(f"ip netns is not permitted here: {done.stderr.strip()}")
            made.append(ns)
        steps = [("link", "add", f"{tag}va", "type", "veth", "peer", "name", f"{tag}vb"),
                 ("link", "set", f"{tag}va", "netns", a), ("link", "set", f"{tag}vb", "netns", b),
                 ("-n", a, "addr", "add", f"{net}.1/24", "dev", f"{tag}va"),
                 ("-n", b, "addr", "add", f"{net}.2/24", "dev", f"{tag}vb"),
                 ("-n", a, "link", "set", f"{tag}va", "up"), ("-n", b, "link", "set", f"{tag}vb", "up"),
                 ("-n", a, "link", "set", "lo", "up"), ("-n", b, "link", "set", "lo", "up")]
        for step in steps:
            done = _ip(*step)
            if done.returncode:
                pytest.skip(f"cannot build the test network (ip {' '.join(step)}): {done.stderr.strip()}")
        yield a, b, f"{net}.1", f"{net}.2"
    finally:
        for ns in made:
            _ip("netns", "del", ns)  # its end of the veth goes with it


def test_a9a_trains_across_two_network_namespaces(two_hosts, tmp_path):
    a, b, host_a, host_b = two_hosts
    train, test = shared("libsvm/a9a.libsvm.gz"), shared("libsvm/a9a.t.libsvm.gz")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path]),
           "PARAMSERVER_LOG_LEVEL": "WARNING", "PARAMSERVER_HEARTBEAT_INTERVAL_S": "0.2",
           "A9A_TRAIN": train, "A9A_TEST": test}
    procs = []

    def start(ns, *args, **kw):
        p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "paramserver", *args], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        procs.append(p)
        return p

    port = 7000 + os.getpid() % 1000
    scheduler = f"tcp://{host_a}:{port}"
    try:
        start(a, "scheduler", "--host", "0.0.0.0", "--port", str(port), "--servers", "2", "--workers", "1")
        start(a, "server", "--host", "0.0.0.0", "--scheduler", scheduler)
        start(b, "server", "--host", "0.0.0.0", "--scheduler", scheduler)
        worker = start(b, "worker", "--fn", "jobs:train_a9a", "--scheduler", scheduler)
        out, err = worker.communicate(timeout=180)
        assert worker.returncode == 0, err[-3000:]
        fields = dict(item.split("=", 1) for item in out.strip().splitlines()[-1].split())
        assert fields["examples"] == "32561"
        assert float(fields["logloss"]) <= 0.330
        advertised = sorted(fields["servers"].split(","))
        assert all(":" in s and "0.0.0.0" not in s for s in advertised), advertised
        assert {s.rsplit(":", 1)[0] for s in advertised} == {f"tcp://{host_a}", f"tcp://{host_b}"}, advertised
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
