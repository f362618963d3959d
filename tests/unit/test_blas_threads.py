"""The ``paramserver`` command runs its processes on one BLAS thread (``paramserver/__init__``):
its nodes compute side by side, a node a core, and OpenBLAS's helper threads only spun (0.1 s
of a core a process as numpy loaded).  A library user's import leaves BLAS as it was.  Each
case runs in a fresh interpreter: the setting must come before numpy loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = "import sys; sys.argv[0] = {argv0!r}; import paramserver, os; print(os.environ.get('OPENBLAS_NUM_THREADS'))"


@pytest.mark.parametrize(("argv0", "given", "seen"), [
    ("/venv/bin/paramserver", None, "1"),  # the console script
    ("/venv/bin/paramserver", "4", "4"),  # the user's own setting is kept
    ("/home/me/notebook.py", None, "None"),  # a library user's process
])
def test_the_command_runs_on_one_blas_thread_and_a_library_user_keeps_theirs(argv0, given, seen):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(argv0=argv0)], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == seen, out.stderr
