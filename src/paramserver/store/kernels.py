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
clone is compiled as if it came from an *anchor* file of its own (``_anchor``): an empty
file whose name is a digest of everything the kernels are compiled from (the rule's source
file, ``dim``, ``storage``'s state width, the kernels' source files, numba's and Python's
versions).  Change any of them and the name changes: a stale kernel is never loaded.  As
with numba's own ``cache=True``, a change to a module the rule's file imports from is not
seen; ``PARAMSERVER_CACHE_DIR`` moves the cache (default ``~/.cache/paramserver``), and a
rule with no source file (defined in ``__main__`` at a prompt) is compiled as before.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numba import njit

from paramserver.errors import ConfigError
from paramserver.store.compact import ROW_DTYPES
from paramserver.store.loops import dense, many
from paramserver.store.loops import hash as hash_loops
from paramserver.tables import optim
from paramserver.tables.optim import CUSTOM_KIND, OP_UPDATE, init_value


@dataclass(frozen=True)
class Kernels:
    apply: Any  # loops.hash.apply's signature: one hash vnode
    apply_many: Any  # loops.many.apply_many's: every hash vnode segment of a request
    dense_apply_many: Any  # loops.dense.dense_apply_many's


_custom: dict[tuple[str, int], Kernels] = {}


def kernels_for(optimizer: Any, dim: int, storage: str = "float32") -> Kernels:
    """The kernels of a table with this optimiser spec and ``dim``; a user rule's are tried
    (compiled) on rows of ``storage`` (``TableSpec.storage``) too: compact rows run the rule
    on a float32 copy of the row (``compact.py``)."""
    if optimizer.kind != CUSTOM_KIND:
        return Kernels(hash_loops.apply, many.apply_many, dense.dense_apply_many)
    key = (optimizer.name, dim)
    if key not in _custom:
        _custom[key] = _compile(optimizer, dim)
    if storage != "float32":
        _try(_custom[key], optimizer, dim, optimizer.state_width(dim), storage)
    return _custom[key]


def _rebind(fn: Any, inline: Literal["never", "always"] = "never", anchor: str | None = None, **names: Any) -> Any:
    """``fn`` (a numba function) compiled again with some of its global names bound anew;
    cached on disk as if its source were the file ``anchor`` (see the module's doc)."""
    py = fn.py_func
    scope = dict(py.__globals__)
    scope.update(names)
    code = py.__code__ if anchor is None else py.__code__.replace(co_filename=anchor)
    clone = types.FunctionType(code, scope, py.__name__, py.__defaults__, py.__closure__)
    return njit(nogil=True, inline=inline, cache=anchor is not None)(clone)


#: the packages whose sources the kernels are compiled from (a file changed: new anchors)
_KERNEL_PACKAGES = ("store", "store/loops", "tables", "routing", "_runtime")


def cache_dir() -> Path:
    root = os.environ.get("PARAMSERVER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "paramserver")
    return Path(root) / "rules"


def _anchor(optimizer: Any, dim: int) -> str | None:
    """The anchor file of a user rule's kernels for ``dim`` (created if absent), or None
    where they cannot be cached: no source file, or no writable cache folder."""
    import numba

    rule = optimizer.rule
    digest = hashlib.sha256(f"{rule.name}|{dim}|{rule.state_width(dim)}|{numba.__version__}|{sys.version}".encode())
    try:
        for fn in (rule.fn, rule.init):
            if fn is not None:
                digest.update(Path(inspect.getsourcefile(fn) or "").read_bytes())
        package = Path(__file__).resolve().parent.parent
        for sub in _KERNEL_PACKAGES:
            for path in sorted((package / sub).glob("*.py")):
                digest.update(path.name.encode() + path.read_bytes())
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        name = "".join(c if c.isalnum() else "_" for c in rule.name)[:60]
        anchor = folder / f"{name}_dim{dim}_{digest.hexdigest()[:20]}.py"
        if not anchor.exists():  # written once: numba keys its index by the file's mtime and size
            tmp = anchor.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(f"# the compiled kernels of update rule {rule.name} for dim={dim} are cached beside\n"
                           "# this file (paramserver.store.kernels); it holds no code\n")
            try:
                os.link(tmp, anchor)  # whole, and never replaced: two servers may race here
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        return str(anchor)
    except (OSError, TypeError):  # no source (a prompt's rule), or the cache folder is not writable
        return None


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
    push_row = _rebind(optim.push_row, inline="always", update_row=update_row)  # inlined, as the built-ins'
    apply = _rebind(hash_loops.apply, anchor=at, push_row=push_row, init_row=init_row)
    dense_apply = _rebind(dense.dense_apply, anchor=at, dense_apply_rows=_rebind(
        dense.dense_apply_rows, inline="always", push_row=push_row, init_row=init_row))
    kernels = Kernels(apply, _rebind(many.apply_many, anchor=at, apply=apply),
                      _rebind(dense.dense_apply_many, anchor=at, dense_apply=dense_apply))
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
