"""The request loops of ``store/loops/slots.py`` compiled for one table's row: its value
columns and its update rule as compile-time constants.

A generic kernel takes the rule and the width as arguments and switches on them for each
key; compiled for the row at hand, the inner loop is the probe, the rule's arithmetic
and nothing else (2.5-3x the keys a second, ``bench/engine.py``).  Each (rule, dim) is
compiled once from the same source with ``DIM`` and ``KIND`` bound anew
(``rebind``) and cached on disk beside an anchor file named by everything it is
compiled from (``anchor_file``), as a user rule's kernels are (``kernels.py``).

Rows of up to ``MAX_DIM`` value columns get loops of their own (the rows a CTR model
keeps: a weight, an embedding of up to 16); wider rows, push operations other than the
rule's update, and a user's rule keep the generic kernels (``vnodes._apply_many``), whose
per-key overhead a wide row's arithmetic hides.
"""

from __future__ import annotations

import hashlib
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from numba import njit

from paramserver.store.loops import hash as hash_loops
from paramserver.store.loops import slots, step_groups
from paramserver.tables.optim import CUSTOM_KIND

#: the widest row (value columns) compiled a loop of its own
MAX_DIM = 16

_loops: dict[tuple[int, int], RequestLoops] = {}


@dataclass(frozen=True)
class RequestLoops:
    apply: Any  # slots.apply_request, for this row
    lookup: Any  # slots.lookup_request, for this row
    dense_apply: Any  # slots.dense_apply_request, for this row (a dense table's pushes)
    steps: Any  # step_groups.step_batches, for this row (a step of several batches, its model's by the width)
    rehash: Any = hash_loops.rehash  # loops.hash.rehash, for this row's width (a user rule's: the generic one)


def request_loops(optimizer: Any, dim: int) -> RequestLoops | None:
    """The request loops of a table with this optimiser spec and ``dim`` (a hash table's
    pushes and pulls, a dense table's pushes), or None where the generic kernels serve it."""
    if optimizer.kind == CUSTOM_KIND or not 1 <= dim <= MAX_DIM:
        return None
    key = (optimizer.kind, dim)
    if key not in _loops:
        _loops[key] = _compile(optimizer, dim)
    return _loops[key]


def _compile(optimizer: Any, dim: int) -> RequestLoops:
    anchor = anchor_file(f"{optimizer.name}_slots", dim, [])
    apply, lookup, dense_apply = (rebind(fn, anchor=anchor, DIM=dim, KIND=optimizer.kind)
                                  for fn in (slots.apply_request, slots.lookup_request, slots.dense_apply_request))
    rehash = rebind(hash_loops.rehash, anchor=anchor, WIDTH=dim + optimizer.state_width(dim))
    return RequestLoops(apply, lookup, dense_apply, _steps(anchor, dim, apply, lookup), rehash)


def _steps(anchor: str | None, dim: int, apply: Any, lookup: Any) -> Any:
    """A step of several batches over this row's loops (``step_groups.step_batches``): it
    calls the row's own ``apply`` and ``lookup``."""
    return rebind(step_groups.step_batches, anchor=anchor, DIM=dim, apply_request=apply, lookup_request=lookup)


def rule_request_loops(dim: int, anchor: str | None, **steps: Any) -> RequestLoops | None:
    """The request loops of a user rule's table (``steps``: its ``push_row`` and
    ``init_row``, ``kernels._compile``'s), cached beside its kernels' ``anchor``."""
    if not 1 <= dim <= MAX_DIM:
        return None
    apply = rebind(slots.apply_request, anchor=anchor, DIM=dim, KIND=CUSTOM_KIND, **steps)
    lookup = rebind(slots.lookup_request, anchor=anchor, DIM=dim, KIND=CUSTOM_KIND)
    return RequestLoops(apply, lookup, rebind(slots.dense_apply_request, anchor=anchor, DIM=dim, KIND=CUSTOM_KIND,
                                              **steps), _steps(anchor, dim, apply, lookup))


def rebind(fn: Any, inline: Literal["never", "always"] = "never", anchor: str | None = None, **names: Any) -> Any:
    """``fn`` (a numba function) compiled again with some of its global names bound anew;
    cached on disk as if its source were the file ``anchor`` (``anchor_file``).

    A clone cached beside an anchor is named after it too (``__qualname__``): numba names a
    compiled function's symbol by its module, its name, its argument types and a number
    counted in the process that compiled it, and two clones of one function (the same
    module, name and types) compiled by two processes could carry the same number.  Loaded
    into one process from the cache, the later one's calls were linked to the earlier
    one's functions: a server holding an FTRL table of 1 column and an AdaGrad table of 5,
    their kernels compiled by two earlier processes, updated the second with the first's
    loops (``tests/process/test_kernel_cache.py``)."""
    py = fn.py_func
    scope = dict(py.__globals__)
    scope.update(names)
    code = py.__code__ if anchor is None else py.__code__.replace(co_filename=anchor)
    clone = types.FunctionType(code, scope, py.__name__, py.__defaults__, py.__closure__)
    if anchor is not None:
        clone.__qualname__ = f"{py.__name__}__{Path(anchor).stem}"
    return njit(nogil=True, inline=inline, cache=anchor is not None)(clone)


#: the packages whose sources the kernels are compiled from (a file changed: new anchors)
KERNEL_PACKAGES = ("store", "store/loops", "tables", "routing", "_runtime")


def cache_dir() -> Path:
    root = os.environ.get("PARAMSERVER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "paramserver")
    return Path(root) / "rules"


def anchor_file(label: str, dim: int, sources: list[Path], extra: str = "") -> str | None:
    """The anchor file of kernels ``label`` compiled for ``dim`` from the kernel packages
    and ``sources`` (created if absent), or None where it cannot be: a source file that
    cannot be read, or no writable cache folder."""
    import numba

    digest = hashlib.sha256(f"{label}|{dim}|{extra}|{numba.__version__}|{sys.version}".encode())
    try:
        for path in sources:
            digest.update(path.read_bytes())
        package = Path(__file__).resolve().parent.parent
        for sub in KERNEL_PACKAGES:
            for path in sorted((package / sub).glob("*.py")):
                digest.update(path.name.encode() + path.read_bytes())
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        name = "".join(c if c.isalnum() else "_" for c in label)[:60]
        anchor = folder / f"{name}_dim{dim}_{digest.hexdigest()[:20]}.py"
        if not anchor.exists():  # written once: numba keys its index by the file's mtime and size
            tmp = anchor.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(f"# the compiled kernels {label} for dim={dim} are cached beside\n"
                           "# this file (paramserver.store.specialize); it holds no code\n")
            try:
                os.link(tmp, anchor)  # whole, and never replaced: two servers may race here
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        return str(anchor)
    except OSError:  # a source that cannot be read, or the cache folder is not writable
        return None
