"""What the ``paramserver`` command sets as the package loads (``paramserver/__init__``), and a
library user's import does not: one BLAS thread (its nodes compute side by side, a node a core,
and OpenBLAS's helper thread only spun, 0.1 s of a core a process as numpy loaded), and the
cyclic collector left off for the command's ``main`` to turn on once start-up's objects are
frozen out of it (on at once, it scanned them all at the next imports: 18 ms a start).  Each
case runs in a fresh interpreter: the settings must come before numpy loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = ("import sys; sys.argv[0] = {argv0!r}; import paramserver, os, gc; "
          "print(os.environ.get('OPENBLAS_NUM_THREADS'), gc.isenabled())")


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
    threads, collecting = out.stdout.split()
    assert threads == seen, out.stderr
    # the command's main turns the collector on once start-up's objects are frozen out of it (cli/main.py);
    # a library user's is on again as soon as the package is imported
    assert collecting == ("False" if argv0.endswith("/paramserver") else "True")
