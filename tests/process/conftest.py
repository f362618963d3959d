import pytest

from paramserver import LocalCluster


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(servers=2, workers=3, heartbeat_interval_s=0.2, heartbeat_timeout_s=3.0,
                      log_level="WARNING") as c:
        yield c
    assert all(p.popen.poll() is not None for p in c.procs.values()), "a process outlived the cluster"
