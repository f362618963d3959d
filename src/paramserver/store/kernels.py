"""The compiled kernels a table's pushes run: the built-in rules', or a user rule's own.

The built-in rules are dispatched by a switch inside kernels compiled once and cached on
disk (``loops/hash.apply``, ``loops/many.apply_many``, ``loops/dense.dense_apply(_many)``).  A user's
rule (``paramserver.tables.rules``) cannot join that switch, and numba cannot cache a kernel
that takes a function as an argument or closes over one.  So a user rule gets the same
kernels compiled again from the same Python source, with the names of the per-row steps
(``update_row``, ``init_row``, and the kernels they are called from) bound to versions that
call the rule: one source for every table, no copy of any kernel.

Compiling them takes seconds, so they are cached on disk like the built-ins' (issue 33.5:
the docs' example recompiled for 12.5 s at every cluster start).  numba keys a cached
kernel by its source file and its bytecode, never by the globals a clone rebinds, so each
clone is compiled as if it came from an *anchor* file of its own (``_anchor``,
``specialize.anchor_file``): an empty
file whose name is a digest of everything the kernels are compiled from (the rule's source
file, ``dim``, ``storage``'s state width, the kernels' source files, numba's and Python's
versions).  Change any of them and the name changes: a stale kernel is never loaded.  As
with numba's own ``cache=True``, a change to a module the rule's file imports from is not
seen; ``PARAMSERVER_CACHE_DIR`` moves the cache (default ``~/.cache/paramserver``), and a
rule with no source file (defined in ``__main__`` at a prompt) is compiled as before.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from paramserver.errors import ConfigError
from paramserver.store.compact import ROW_DTYPES
from paramserver.store.loops import dense, many
from paramserver.store.loops import hash as hash_loops
from paramserver.store.specialize import RequestLoops, anchor_file, rebind, request_loops, rule_request_loops
from paramserver.tables import push_ops
from paramserver.tables.optim import CUSTOM_KIND, init_value
from paramserver.tables.push_ops import OP_UPDATE


@dataclass(frozen=True)
class Kernels:
    apply: Any  # loops.hash.apply's signature: one hash vnode
    apply_many: Any  # loops.many.apply_many's: every hash vnode segment of a request
    dense_apply_many: Any  # loops.dense.dense_apply_many's
    request: RequestLoops | None = None  # a table's request loops for its row (``specialize.py``), if any


_custom: dict[tuple[str, int], Kernels] = {}


def kernels_for(optimizer: Any, dim: int, storage: str = "float32") -> Kernels:
    """The kernels of a table with this optimiser spec and ``dim``; a user rule's are tried
    (compiled) on rows of ``storage`` (``TableSpec.storage``) too: compact rows run the rule
    on a float32 copy of the row (``compact.py``)."""
    if optimizer.kind != CUSTOM_KIND:
        return Kernels(hash_loops.apply, many.apply_many, dense.dense_apply_many, request_loops(optimizer, dim))
    key = (optimizer.name, dim)
    if key not in _custom:
        _custom[key] = _compile(optimizer, dim)
    if storage != "float32":
        _try(_custom[key], optimizer, dim, optimizer.state_width(dim), storage)
    return _custom[key]


def _anchor(optimizer: Any, dim: int) -> str | None:
    """The anchor file of a user rule's kernels for ``dim`` (created if absent), or None
    where they cannot be cached: no source file, or no writable cache folder."""
    rule = optimizer.rule
    try:
        sources = [Path(inspect.getsourcefile(fn) or "") for fn in (rule.fn, rule.init) if fn is not None]
    except TypeError:  # no source (a prompt's rule)
        return None
    return anchor_file(rule.name, dim, sources, f"{rule.state_width(dim)}")


@njit(inline="always", nogil=True)
def _zeros(state, hp):  # type: ignore[no-untyped-def]
    pass  # the state stays as init_row zeroed it


def _compile(optimizer: Any, dim: int) -> Kernels:
    rule = optimizer.rule
    f, init = rule.jitted()
    width = rule.state_width(dim)
    end = dim + width

    @njit(inline="always", nogil=True)
    def update_row(rows, s, grads, i, dim_, okind, ohp):  # type: ignore[no-untyped-def]  # (numba)
        f(rows[s, :dim], rows[s, dim:end], grads[i], ohp)

    init = init if init is not None else _zeros  # a new key's state: the rule's init, else zeros

    @njit(inline="always", nogil=True)
    def init_row(rows, s, key, dim_, width_, okind, ohp, ikind, ihp, seed):  # type: ignore[no-untyped-def]
        for j in range(dim):
            rows[s, j] = init_value(key, j, ikind, ihp, seed)
        for j in range(dim, end):
            rows[s, j] = 0.0
        init(rows[s, dim:end], ohp)

    at = _anchor(optimizer, dim)
    push_row = rebind(push_ops.push_row, inline="always", update_row=update_row)  # inlined, as the built-ins'
    apply = rebind(hash_loops.apply, anchor=at, push_row=push_row, init_row=init_row)
    dense_apply = rebind(dense.dense_apply, anchor=at, dense_apply_rows=rebind(
        dense.dense_apply_rows, inline="always", push_row=push_row, init_row=init_row))
    kernels = Kernels(apply, rebind(many.apply_many, anchor=at, apply=apply),
                      rebind(dense.dense_apply_many, anchor=at, dense_apply=dense_apply),
                      rule_request_loops(dim, at, push_row=push_row, init_row=init_row))
    _try(kernels, optimizer, dim, width)
    return kernels


def _try(k: Kernels, optimizer: Any, dim: int, width: int, storage: str = "float32") -> None:
    """Compile now, on a scratch row, so that a rule numba cannot compile (or that fails
    on a row) is refused when its table is created, not at its first push."""
    keys = np.zeros(8, np.uint64)
    rows = np.zeros((9, dim + width), ROW_DTYPES[storage])
    grads = np.zeros((1, dim), np.float32)
    grads.flags.writeable = False  # as pushes arrive: read-only frames
    try:
        k.apply(keys, rows, np.zeros(2, np.int64), np.ones(1, np.uint64), grads, 0, 7, dim, OP_UPDATE,
                optimizer.kind, optimizer.params(), 0, np.zeros(2), np.uint64(0))
    except Exception as exc:
        message = str(exc).strip().splitlines()
        raise ConfigError(f"update rule {optimizer.name!r} does not compile for dim={dim}, state_width={width}"
                          f"{'' if storage == 'float32' else f', storage={storage!r}'}: "
                          f"{type(exc).__name__}: {' '.join(message[:6])[:800]}") from None
