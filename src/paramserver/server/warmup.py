"""The server's warm-up: every table kernel a request can reach, loaded (or compiled)
before the server registers (``_runtime/warm.py`` says why)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from paramserver._runtime.warm import is_inherited, load_numba
from paramserver.filters.chain import FilterSpec
from paramserver.filters.warmup import warm_filters
from paramserver.routing.ring import Ring
from paramserver.server.requests import _segment_fault
from paramserver.store.vnodes import GENERIC_DIM, VnodeSet, exercise_steps
from paramserver.tables.optim import CUSTOM_KIND, SGD, Zeros
from paramserver.tables.spec import TableSpec
from paramserver.tables.steps import check_batch
from paramserver.wire.message import Op, decode, encode
from paramserver.wire.step_arrays import STEP_ARRAYS, read_step_arrays


def warm_server(layouts: tuple[str, ...] = ("hash", "dense"), filters: bool | FilterSpec = True,
                storages: tuple[str, ...] = ("float32",), tables: tuple[TableSpec, ...] = (),
                steps: bool = True) -> None:
    """Load (or compile) the table kernels for the array types requests bring (read-only
    frames; every other array goes to the kernels read-only too, ``intrinsics.frozen``), for
    ``layouts`` (a hash table's through a vnode's growth): a table of more than one vnode, a
    request's segment check, its update and its lookup, a step's kernels, a quota's count, an export, an
    install; with ``filters``, every built-in filter's decoding and encoding (0.2 s from the
    cache: a job that knows it has none skips them, one that knows its own passes their
    spec); for the row formats ``storages`` (``TableSpec.storage``: each has kernels of its
    own).  Nothing of float32 tables is left
    to compile in the serving loop, where a compile of 10-25 s (a fresh install's cold cache)
    once starved the heartbeats mid-repair.  The 16-bit formats are not warmed unless asked
    (``train --storage`` asks for its own): they added 49 s to a cold server start for every
    user, and their first table compiles its kernels at its first request instead (7 s for a
    first fp16 push on a cold cache, measured with two servers that kept beating; then from
    the disk cache).  ``tables``: a job's own tables, whose request loops (compiled for their
    rows, ``store/specialize.py``) are loaded too: each is a kernel of its own, ~0.1 s from
    the disk cache at a table's first request otherwise; with ``steps``, their steps too
    (``VnodeSet.steps``: a training job's table takes its batches as steps); the hash tables
    warmed take the job's key width (``TableSpec.key_bytes``), whose loops are others."""
    if is_inherited():
        return
    load_numba()
    n = 64  # enough keys to make the vnode grow: growth has kernels of its own
    frames = encode({"op": Op.PUSH.value}, [np.arange(1, n + 1, dtype=np.uint64), np.ones((n, 1), np.float32),
                                            np.zeros(1, np.int32), np.array([n], np.int64)])
    keys, grads, vnodes, counts = decode([bytes(f) for f in frames]).arrays  # read-only, as requests
    # the scratch tables take the job's built-in rule where it is known: their request loops (and steps) are
    # then the job's own, loaded once, and none of another rule's (a user's rule keeps SGD here: its kernels
    # are its own table's, loaded below)
    rule = tables[0].optimizer if tables and tables[0].optimizer.kind != CUSTOM_KIND else SGD()
    key_bytes = tables[0].key_bytes if tables else 8  # the job's keys: 4-byte keys' loops are others
    for bits, storage in [({"hash": 0, "dense": 8}[layout], s) for layout in layouts for s in storages]:
        spec = TableSpec("warm-up", optimizer=rule, initializer=Zeros(), key_bits=bits, storage=storage)
        if key_bytes == 4 and not spec.narrow_refusal():
            spec = replace(spec, key_bytes=4)
        VnodeSet(spec, 2, [0, 1])  # a table's vnodes are listed for the kernels one by one
        table = VnodeSet(spec, 1, [0])
        _segment_fault(vnodes, counts, n, 1, np.ones(1, np.bool_), True, table.slot)
        table.check(vnodes, counts, keys)
        table.apply(vnodes, counts, keys, grads)
        table.lookup(vnodes, counts, keys, np.empty((n, 1), np.float32))
        if not bits:
            _warm_generic(spec, vnodes, counts, keys)
        table.missing(vnodes, counts, keys)  # a namespace's quota
        stored, rows = table.tables[0].items()  # an export, a checkpoint, a vnode's copy
        table.install(0, stored, rows)  # a copy received (a repair, a join), a restore
        Ring.create([1]).vnodes(keys, spec.layout)  # an install's and a restore's keys checked
    _warm_steps(n)
    for spec in tables:  # their request loops, run once (``store/exercise.loops``), and a job's steps
        VnodeSet(TableSpec("warm-up", spec.dim, optimizer=spec.optimizer, initializer=spec.initializer,
                           storage=spec.storage, key_bits=min(spec.key_bits, 8), key_bytes=spec.key_bytes), 1, [0])
        if steps:
            exercise_steps(spec)
    if filters:
        # a filtered request's decoding, a filtered reply's encoding
        warm_filters(filters if isinstance(filters, FilterSpec) else None)


def _warm_generic(spec: TableSpec, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> None:
    """The generic loops of ``spec``'s storage and keys: other push operations, rows wider than
    request loops take."""
    n = keys.shape[0]
    wide = VnodeSet(TableSpec("warm-up", GENERIC_DIM, optimizer=SGD(), initializer=Zeros(), storage=spec.storage,
                              key_bytes=spec.key_bytes), 1, [0])
    wide_grads = np.ones((n, GENERIC_DIM), np.float32)
    wide_grads.flags.writeable = False
    wide.apply(vnodes, counts, keys, wide_grads)
    wide.lookup(vnodes, counts, keys, np.empty((n, GENERIC_DIM), np.float32))


def _warm_steps(n: int) -> None:
    """A step's check of its batch (``server/steps.py``) on a request's read-only arrays.  The
    step itself is a table's (``VnodeSet.steps``, exercised with its request loops); the
    gradient kernels alone serve only a step that goes batch by batch (a key lifecycle, a
    quota, copies to forward to), loaded at its first."""
    # a step's keys in three bytes and its rows' lengths (``wire/packing.py``), alone and in a group
    arrays: list[np.ndarray] = [np.array([[3, 0, 0], [5, 0, 0]], np.uint8), np.zeros(1, np.int32),
                                np.array([2], np.int32), np.zeros(2, np.uint16), np.array([2], np.uint8),
                                np.zeros(0, np.float32), np.zeros(1, np.uint8), np.array([2, 1, 1], np.int64)]
    read_step_arrays(decode([bytes(f) for f in encode({"op": Op.STEP.value}, arrays)]), 1)
    read_step_arrays(decode([bytes(f) for f in encode({"op": Op.STEP.value}, arrays[:7])]))
    for dtype in dict(STEP_ARRAYS)["inverse"]:  # an occurrence's index into the keys: 16 bits or 32
        frames = encode({"op": Op.STEP.value}, [np.zeros(n, dtype), np.arange(n + 1, dtype=np.int64),
                                                np.ones(n, np.float32), np.zeros(n, np.float32)])
        inverse, indptr, vals, labels = decode([bytes(f) for f in frames]).arrays
        check_batch("warm-up", 1, inverse, indptr, vals, labels)
