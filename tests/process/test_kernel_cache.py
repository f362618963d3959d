"""Kernels compiled by different processes, loaded together from the cache (``store/specialize.py``).

Each table's request loops are one function compiled again per (rule, width) and cached on
disk.  numba names a compiled function's symbol by its module, its name, its argument types
and a number counted in the process that compiled it; two clones compiled by two processes
could carry the same name, and once both were loaded into one process the later one's calls
went to the earlier one's functions: a server holding an FTRL table of one column and an
AdaGrad table of five updated the second with the first's loops.  Each clone is now named
after its cache anchor."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from paramserver.store.specialize import request_loops
from paramserver.tables.optim import FTRL, AdaGrad

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = os.path.join(HERE, "..", "unit", "test_step_requests.py")


def test_every_specialisation_is_named_apart():
    """The names that make a compiled function's symbol differ between two tables' loops
    whatever the process-local number numba adds."""
    one, five = request_loops(FTRL(), 1), request_loops(AdaGrad(), 5)
    assert one is not None and five is not None
    for a, b in ((one.apply, five.apply), (one.lookup, five.lookup), (one.steps, five.steps)):
        assert a.py_func.__qualname__ != b.py_func.__qualname__
        assert a.py_func.__qualname__.startswith(a.py_func.__name__ + "__")


@pytest.mark.timeout(240)
def test_kernels_compiled_by_two_processes_compute_right_together(tmp_path):
    """An FTRL table's loops compiled by one process and an AdaGrad table's by another, then
    both loaded from the cache into a third: each step changes what a pull, the worker's
    kernel and a push would (the unit tests' own check, run on a fresh cache)."""
    env = {**os.environ, "PARAMSERVER_CACHE_DIR": str(tmp_path)}

    def run(*select: str) -> None:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", STEPS, *select]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]

    run("-k", "applies_what_pull_kernel_and_push_would_and")  # FTRL, one column: compiled here
    run("-k", "factorization")  # AdaGrad, five columns: compiled in another process
    run()  # both from the cache, the FTRL loops first
