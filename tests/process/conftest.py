import pathlib

import pytest

from paramserver import LocalCluster

HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(items):
    """Every test in this folder starts real processes: marked ``process`` (``-m process``
    selects them, ``-m "not process"`` leaves them out)."""
    for item in items:
        if HERE in pathlib.Path(item.fspath).parents:
            item.add_marker(pytest.mark.process)


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(servers=2, workers=3, heartbeat_interval_s=0.2, heartbeat_timeout_s=3.0,
                      log_level="WARNING") as c:
        yield c
    assert all(p.popen.poll() is not None for p in c.procs.values()), "a process outlived the cluster"
