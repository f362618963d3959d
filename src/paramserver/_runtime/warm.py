"""Load numba's compiled kernels before the work needs them.

A process that calls a jitted function for the first time pays for numba's CPU target
(its typing and lowering registries) and then for each kernel's cache file.  Workers and
servers do this before they register (``warm_worker``, ``warm_server``), so that a job's
clock starts once they are ready; ``LocalCluster`` does it once in the driver before it
forks its nodes, which then inherit every loaded kernel and start in milliseconds.  A
job that knows what it runs loads only that (``warm_job``: ``paramserver train`` passes
its format, model and table layout), and the nodes forked after it skip their own warm-up
(``inherited``): a kernel the job turns out to need after all loads on its first call.
The servers' kernels are loaded first and the servers forked, then the workers' (``Warmup``).

This module holds what every role shares; each role's own warm-up lives with the role
and is handed in (``server/warmup.py``, ``client/warmup.py``, ``data/warmup.py``,
``apps/ctr/warmup.py``), so that start-up tuning never imports upward.

``load_numba`` loads the target without numba's BLAS probe: ``numba.np.arraymath``
imports ``scipy.linalg.cython_blas`` where SciPy is installed, to learn whether ``np.dot``
may call BLAS, and that import alone took 0.13-0.19 s of the 0.25 s a worker spent
loading numba on this VM.  No kernel of ours calls BLAS.  With the probe skipped numba
computes a jitted 1-d ``np.dot`` with a loop; its other BLAS paths import SciPy when a
function that uses them is compiled, as before.  Where the caller has imported
``scipy.linalg`` already the probe is free and runs as usual.  The CLI calls it before every
command that computes (``cli/main.py``), so that no reader's kernel loads the target first.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

_BLAS = "scipy.linalg.cython_blas"
_loaded = False
_inherited = False  # this process was forked from one that warmed up for it: skip ours
_servers_apart = False  # the servers forked from here load their own kernels (``servers_load_apart``)


def load_numba() -> None:
    """Load numba's CPU target (once a process) without importing SciPy for BLAS."""
    global _loaded
    if _loaded:
        return
    from numba.core.registry import cpu_target

    hide = "scipy.linalg" not in sys.modules and _BLAS not in sys.modules
    if hide:
        sys.modules[_BLAS] = None  # type: ignore[assignment]  # an import of it fails at once
    try:
        cpu_target.typing_context.refresh()
        cpu_target.target_context.refresh()
    finally:
        if hide and _BLAS in sys.modules and sys.modules[_BLAS] is None:
            del sys.modules[_BLAS]
    _loaded = True


def inherited() -> None:
    """Say that the processes forked from this one from now on have what they need loaded
    (``LocalCluster`` calls it after its warm-up): their ``warm_worker`` and
    ``warm_server`` return at once."""
    global _inherited
    _inherited = True


def is_inherited() -> bool:
    """Whether this process was forked from one that warmed up for it (``inherited``)."""
    return _inherited


def servers_load_apart() -> None:
    """Say that the servers of the local clusters this process starts from now on load their
    kernels themselves, once forked, while this process loads the workers' (``LocalCluster``):
    two cores load (or, on a first run, compile) the two sets at once.  For a process that
    starts one cluster, the ``paramserver`` command (``cli/main.py``): a process that starts
    many (a test suite, a notebook) loads the servers' kernels once itself and every later
    cluster's servers inherit them, as by default."""
    global _servers_apart
    _servers_apart = True


def servers_apart() -> bool:
    """Whether the servers forked from this process load their own kernels (``servers_load_apart``)."""
    return _servers_apart


@dataclass(frozen=True)
class Warmup:
    """What a ``LocalCluster`` loads before it forks its nodes: ``servers`` before the
    servers are forked, then ``workers`` (what the workers and the driver's scoring run)
    before the workers are.  The servers start (imports, registration) while the driver
    loads the workers' kernels.  Where the servers load apart (``servers_load_apart``), each
    server runs ``servers`` itself once forked, while the driver loads the workers'.
    ``forked``, if given, is what the driver starts once every node is forked (a thread may
    start then), while it waits for them to register."""

    servers: Callable[[], None]
    workers: Callable[[], None]
    forked: Callable[[], None] | None = None
