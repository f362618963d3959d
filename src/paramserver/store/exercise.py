"""A table's kernels loaded when it is made, not at its first request: its request loops,
its tiers' loops and a training job's steps, each run once in this process on a scratch
table of the same row.

Compiled for their row (``store/specialize.py``), a table's loops are loaded from numba's
disk cache (or, on a cold cache, compiled) at their first call.  Run here, that call is
the table's creation, in the server's handler of ``CREATE_TABLE`` or its warm-up, and not
its first request, inside the serving loop (as a user rule's kernels, ``kernels._try``).

The scratch tables are made by the store these functions are handed (``NewStore``:
``VnodeSet``, whose constructor calls ``loops`` and ``tiers``), so this module imports
none of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np

from paramserver._runtime.intrinsics import frozen
from paramserver.filters.kernels import sparse_encode
from paramserver.store.protocol import VnodeStore
from paramserver.store.readahead import warm as warm_readahead
from paramserver.store.specialize import MAX_DIM
from paramserver.store.table import MIN_CAPACITY
from paramserver.tables.spec import TableSpec
from paramserver.tables.steps import unsuited

#: a row width whose hash tables take the generic loops (wider than request loops take):
#: what a warm-up uses to load them (``server/warmup.py``)
GENERIC_DIM = MAX_DIM + 1

#: the rows whose loops have run in this process
EXERCISED: set[tuple[Any, ...]] = set()


class NewStore(Protocol):
    """How a scratch table is made: ``VnodeSet``'s constructor."""

    def __call__(self, spec: TableSpec, n_vnodes: int, vnodes: Iterable[int], memory: int = 0,
                 cold_dir: str = "") -> VnodeStore: ...


def loops(spec: TableSpec, new: NewStore) -> None:
    """Run a table's request loops once on a scratch table of its row, made by ``new``."""
    row = (spec.optimizer, spec.dim, spec.storage, bool(spec.key_bits), spec.key_bytes)
    if row in EXERCISED:
        return
    EXERCISED.add(row)
    scratch = new(TableSpec("scratch", spec.dim, optimizer=spec.optimizer, initializer=spec.initializer,
                            storage=spec.storage, key_bits=min(spec.key_bits, 8), key_bytes=spec.key_bytes), 1, [0])
    # a hash vnode: more keys than its first capacity holds, so it grows (its row's ``rehash``);
    # a dense one (of as few as 2 keys) never grows
    n = 1 if spec.key_bits else MIN_CAPACITY
    keys, vnodes, counts = np.arange(1, n + 1, dtype=np.uint64), np.zeros(1, np.int32), np.full(1, n, np.int64)
    grads = np.zeros((n, spec.dim), np.float32)
    keys, vnodes, counts, grads = (frozen(a) for a in (keys, vnodes, counts, grads))  # as a request's frames arrive
    scratch.apply(vnodes, counts, keys, grads)
    scratch.lookup(vnodes, counts, keys, np.empty((n, spec.dim), np.float32))
    scratch.add_masked(vnodes, counts, keys, *sparse_encode(grads.reshape(-1).view(np.uint32)))  # a sparse add
    if spec.key_bytes == 4:  # the generic loops over 4-byte keys, which no server's warm-up loads
        scratch.missing(vnodes, counts, keys)  # a namespace's quota
        stored, rows = scratch.tables[0].items()  # an export, a checkpoint, a copy
        scratch.install(0, stored, rows)  # a copy received, a restore


def tiers(spec: TableSpec, cold_dir: str, new: NewStore) -> None:
    """Run the tiers' loops once (a table with a memory budget): a scratch table of this row,
    its budget a few slots, pushed past it and read back."""
    row = ("tiers", spec.optimizer, spec.dim, spec.storage, bool(spec.lifecycle), spec.hot_keys)
    if row in EXERCISED:
        return
    EXERCISED.add(row)
    scratch = new(TableSpec("scratch", spec.dim, optimizer=spec.optimizer, initializer=spec.initializer,
                            storage=spec.storage, lifecycle=spec.lifecycle or None, memory=1,
                            hot_keys=spec.hot_keys), 1, [0], cold_dir=cold_dir)
    vnodes, counts = frozen(np.zeros(1, np.int32)), frozen(np.array([64], np.int64))
    keys = frozen(np.arange(1, 65, dtype=np.uint64))
    scratch.apply(vnodes, counts, keys, frozen(np.zeros((64, spec.dim), np.float32)))
    scratch.settle()
    scratch.prefetch(vnodes, counts, keys)
    scratch.lookup(vnodes, counts, keys, np.empty((64, spec.dim), np.float32))
    scratch.settle()
    warm_readahead()


def steps(spec: TableSpec, new: NewStore) -> None:
    """Run a table's steps once (``steps``, for the index types a step's occurrences come
    in), where its rows can be stepped: what a training job's servers load before they
    register (``server/warmup.py``).  Any other table loads them at its first step (a few
    milliseconds from the disk cache; on a cold cache, a compile of ~1 s a type)."""
    row = ("steps", spec.optimizer, spec.dim, spec.storage, spec.key_bytes)
    if row in EXERCISED or spec.key_bits or unsuited(spec, "lr" if spec.dim == 1 else "fm") is not None:
        return
    EXERCISED.add(row)
    scratch = new(TableSpec("scratch", spec.dim, optimizer=spec.optimizer, initializer=spec.initializer,
                            storage=spec.storage, key_bytes=spec.key_bytes), 1, [0])
    keys, vnodes, counts = np.ones(1, np.uint64), np.zeros(1, np.int32), np.ones(1, np.int64)
    for index in (np.uint16, np.int32):  # an occurrence's place among its batch's keys: as a step brings it
        scratch.steps(vnodes, counts, keys, np.zeros(1, index), np.arange(2, dtype=np.int64), np.zeros(0, np.float32),
                      np.zeros(1, np.float32), np.ones(3, np.int64), np.ones(1, np.int64), 0.0, lambda n: None)
