import pathlib

import pytest

from paramserver import LocalCluster

HERE = pathlib.Path(__file__).parent


#: the files that take longest (``make test``'s ``--durations``), run first: ``make test`` runs this
#: folder on both cores a file at a time (``pytest -n 2 --dist loadfile --no-loadscope-reorder``: by
#: default pytest-xdist hands out the files with the most tests first), and a long file met last
#: would run alone at the end (the emulated hosts' 2.5 minutes did)
LONGEST_FIRST = ("test_nemesis_jobs.py", "test_nemesis.py", "test_kernel_cache.py", "test_tiers_cluster.py",
                 "test_train.py", "test_row_cache_cluster.py")


def pytest_collection_modifyitems(items):
    """Every test in this folder starts real processes: marked ``process`` (``-m process``
    selects them, ``-m "not process"`` leaves them out); the longest files first, the rest in
    their order."""
    for item in items:
        if HERE in pathlib.Path(item.fspath).parents:
            item.add_marker(pytest.mark.process)
    first = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(pathlib.Path(item.fspath).name, len(first))
               if HERE in pathlib.Path(item.fspath).parents else len(first))


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(servers=2, workers=3, heartbeat_interval_s=0.2, heartbeat_timeout_s=3.0,
                      log_level="WARNING") as c:
        yield c
    assert all(p.popen.poll() is not None for p in c.procs.values()), "a process outlived the cluster"
