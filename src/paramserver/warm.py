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

``load_numba`` loads the target without numba's BLAS probe: ``numba.np.arraymath``
imports ``scipy.linalg.cython_blas`` where SciPy is installed, to learn whether ``np.dot``
may call BLAS, and that import alone took 0.13-0.19 s of the 0.25 s a worker spent
loading numba on this VM.  No kernel of ours calls BLAS.  With the probe skipped numba
computes a jitted 1-d ``np.dot`` with a loop; its other BLAS paths import SciPy when a
function that uses them is compiled, as before.  Where the caller has imported
``scipy.linalg`` already the probe is free and runs as usual.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

_BLAS = "scipy.linalg.cython_blas"
_loaded = False
_inherited = False  # this process was forked from one that warmed up for it: skip ours


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


_LINES = {"criteo": "1\t" + "\t".join(["1"] * 13 + ["a1b2c3d4"] * 26) + "\n", "libsvm": "1 3:1 7:0.5\n"}


def warm_worker(formats: tuple[str, ...] = ("criteo", "libsvm"), models: tuple[Any, ...] | None = None,
                combine: bool = True) -> None:
    """Load (or compile) the training kernels on tiny inputs: parsing ``formats``,
    deduplication, ``models``' steps and predictions (default: lr, fm and deepfm), routing
    (``combine``: a push whose duplicate keys are merged too) and scattering a pull's reply."""
    from paramserver.apps.models import Model
    from paramserver.data.reader import DataFormat, read_all
    from paramserver.routing.partition import route_pull, route_push, scatter_rows
    from paramserver.routing.ring import Ring
    from paramserver.wire.message import Op, decode, encode

    if _inherited:
        return
    load_numba()
    if models is None:
        models = (Model("lr"), Model("fm", k=2), Model("deepfm", k=2, hidden=(2,)))
    with tempfile.TemporaryDirectory() as tmp:
        for name in formats:
            if name not in _LINES:  # csv and avazu: their kernels load on the first batch
                continue
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(_LINES[name] * 3)
            batch = read_all([path], DataFormat(name))
            uniq, inverse = batch.unique()
            for model in models:
                rows = np.zeros((uniq.size, model.dim), np.float32)
                dense = model.dense_initial(0) if model.deep else None
                grads, _, _ = model.step(batch, inverse, rows, dense)
                model.predict(batch, inverse, rows, dense)
                if combine:
                    route_push(Ring.create([1]), uniq, grads)
                route_push(Ring.create([1]), uniq, grads, distinct=True)
            routed = route_pull(Ring.create([1]), uniq)
            # a pull's reply is scattered from a received (read-only) frame
            frames = encode({"op": Op.OK.value}, [np.zeros((uniq.size, 1), np.float32)])
            (vals,) = decode([bytes(f) for f in frames]).arrays
            scatter_rows(vals, routed.order, np.empty((uniq.size, 1), np.float32))


def warm_server(layouts: tuple[str, ...] = ("hash", "dense")) -> None:
    """Load (or compile) the table kernels for the array types requests bring (read-only
    frames; every other array goes to the kernels read-only too, ``intrinsics.frozen``), for
    ``layouts`` (a hash table's through a vnode's growth): a table of more than one vnode, a
    request's segment check, its update and its lookup, a quota's count, an export, an
    install.  Nothing is left to compile in the serving loop, where a compile of 10-25 s
    (a fresh install's cold cache) once starved the heartbeats mid-repair."""
    from paramserver.routing.ring import Ring
    from paramserver.server.optim import SGD, Zeros
    from paramserver.server.requests import _segment_fault
    from paramserver.server.vnodes import VnodeSet
    from paramserver.spec import TableSpec
    from paramserver.wire.message import Op, decode, encode

    if _inherited:
        return
    load_numba()
    n = 64  # enough keys to make the vnode grow: growth has kernels of its own
    frames = encode({"op": Op.PUSH.value}, [np.arange(1, n + 1, dtype=np.uint64), np.ones((n, 1), np.float32),
                                            np.zeros(1, np.int32), np.array([n], np.int64)])
    keys, grads, vnodes, counts = decode([bytes(f) for f in frames]).arrays  # read-only, as requests
    for bits in [{"hash": 0, "dense": 8}[layout] for layout in layouts]:
        spec = TableSpec("warm-up", optimizer=SGD(), initializer=Zeros(), key_bits=bits)
        VnodeSet(spec, 2, [0, 1])  # a table's vnodes are listed for the kernels one by one
        table = VnodeSet(spec, 1, [0])
        _segment_fault(vnodes, counts, n, 1, np.ones(1, np.bool_), True, table.slot)
        table.check(vnodes, counts, keys)
        table.apply(vnodes, counts, keys, grads)
        table.lookup(vnodes, counts, keys, np.empty((n, 1), np.float32))
        table.missing(vnodes, counts, keys)  # a namespace's quota
        stored, rows = table.tables[0].items()  # an export, a checkpoint, a vnode's copy
        table.install(0, stored, rows)  # a copy received (a repair, a join), a restore
        Ring.create([1]).vnodes(keys, spec.layout)  # an install's and a restore's keys checked


def warm_all() -> None:
    """Every kernel a worker, a server or the driver's scoring uses."""
    warm_worker()
    warm_server()


@dataclass(frozen=True)
class Warmup:
    """What a ``LocalCluster`` loads before it forks its nodes: ``servers`` before the
    servers are forked, then ``workers`` (what the workers and the driver's scoring run)
    before the workers are.  The servers start (imports, registration) while the driver
    loads the workers' kernels."""

    servers: Callable[[], None] = warm_server
    workers: Callable[[], None] = warm_worker


def warm_job(fmt: str, model: Any, layout: str) -> Warmup:
    """What one training job uses: the server kernels of its table's ``layout``
    (``"hash"`` or ``"dense"``), then parsing ``fmt`` and ``model``'s step and prediction."""
    return Warmup(servers=functools.partial(warm_server, (layout,)),
                  workers=functools.partial(warm_worker, (fmt,), (model,), combine=False))
