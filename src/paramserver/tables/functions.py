"""Server-side functions: run where the rows are, merge the partial results on the client.

``client.call(table, "module:function", keys=None, args={...})`` runs a registered
function on every server, over the rows that server is the primary of — of ``keys``, or
all of them — and merges what the servers return as the function declares:

* ``merge="sum"``: each server returns an array (or a number); the client adds them;
* ``merge="concat"``: each returns ``(keys, rows)``; the client concatenates them;
* ``merge="topk"``: each returns ``(keys, scores)``, its own best ``args["k"]``; the
  client keeps the ``k`` best of all.

A function is ``f(keys, values, args)``: ``keys`` uint64[n] and ``values`` float32[n, dim]
(read-only), ``args`` the call's dict (numbers, strings, lists).  Like update rules
(``paramserver.tables.rules``), it is named ``"module:function"`` and imported by the servers:
code never travels on the wire.  The ones below ship with the package, registered by
name (``"paramserver.functions:top_k"``, their older name, still loads)::

    client.call("w", "dot", args={"vector": v})        # keys, values @ v
    client.call("w", "sum_of_squares")                 # squared L2 norm
    client.call("w", "top_k", args={"k": 10})          # largest |value|
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from paramserver.errors import ConfigError
from paramserver.plugins import Kind, declare, load_plugin, register

MERGES = ("sum", "concat", "topk")


class ServerFunction:
    """A function servers run over their rows, and how the client merges the results."""

    def __init__(self, fn: Callable[..., Any], merge: str) -> None:
        if merge not in MERGES:
            raise ConfigError(f"@paramserver.server_function: merge must be one of {MERGES}, got {merge!r}")
        self.fn, self.merge = fn, merge
        self.__doc__, self.__name__ = fn.__doc__, fn.__name__

    def __call__(self, keys: np.ndarray, values: np.ndarray, args: dict[str, Any]) -> Any:
        return self.fn(keys, values, args)

    def __repr__(self) -> str:
        return f"ServerFunction({self.fn.__module__}:{self.fn.__qualname__}, merge={self.merge!r})"


def server_function(merge: str = "sum") -> Callable[[Callable[..., Any]], ServerFunction]:
    """Declare ``f(keys, values, args)`` a server-side function (see the module's doc)."""
    if merge not in MERGES:
        raise ConfigError(f"@paramserver.server_function: merge must be one of {MERGES}, got {merge!r}")

    def wrap(fn: Callable[..., Any]) -> ServerFunction:
        return ServerFunction(fn, merge)
    return wrap


def load_function(name: str) -> ServerFunction:
    """The server-side function ``name`` names: a shipped one's (``"top_k"``), or
    ``"module:function"`` imported (a plug-in of kind ``function``, ``docs/plugins.md``)."""
    obj = load_plugin(FUNCTION, name).obj
    assert isinstance(obj, ServerFunction)
    return obj


def run(fn: ServerFunction, keys: np.ndarray, values: np.ndarray, args: dict[str, Any]) -> list[np.ndarray]:
    """Call ``fn`` on one server's rows; its result as the arrays of the reply."""
    out = fn(keys, values, args)
    if fn.merge == "sum":
        arr = np.asarray(out, np.float64)
        return [np.ascontiguousarray(arr.reshape(arr.shape or (1,))), np.array(arr.shape, np.int64)]
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ConfigError(f"{fn!r} must return (keys, rows), got {type(out).__name__}")
    k, r = np.ascontiguousarray(out[0], np.uint64), np.ascontiguousarray(out[1])
    if r.dtype != np.float32:
        r = r.astype(np.float32)
    if k.ndim != 1 or r.shape[:1] != k.shape:
        raise ConfigError(f"{fn!r} returned {k.shape[0]} keys and rows of shape {r.shape}")
    if fn.merge == "topk":
        kk = _k(args)
        if r.ndim != 1:
            raise ConfigError(f"{fn!r} (merge topk) must return 1-d scores, got shape {r.shape}")
        best = np.argsort(-r, kind="stable")[:kk]
        k, r = k[best], r[best]
    return [k, r]


def merge(kind: str, parts: list[list[np.ndarray]], args: dict[str, Any]) -> Any:
    """The client's side: the servers' replies merged (``kind`` from their headers)."""
    if kind == "sum":
        total = None
        for data, shape in parts:
            arr = data.reshape(tuple(int(s) for s in shape))
            total = arr if total is None else total + arr
        return np.zeros(1) if total is None else total
    keys = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.uint64)
    rows = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.float32)
    if kind == "topk":
        best = np.argsort(-rows, kind="stable")[:_k(args)]
        return keys[best], rows[best]
    return keys, rows


def _k(args: dict[str, Any]) -> int:
    k = args.get("k", 10)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"a top-k function needs args['k'], an int >= 1; got {k!r}")
    return k


# ---- the ones that ship ------------------------------------------------------------------
@server_function(merge="concat")
def dot(keys: np.ndarray, values: np.ndarray, args: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's dot product with ``args["vector"]`` (``dim`` numbers)."""
    v = np.asarray(args["vector"], np.float64)
    if v.shape != (values.shape[1],):
        raise ConfigError(f"dot: vector must have {values.shape[1]} numbers (the table's dim), got {v.shape}")
    return keys, (values.astype(np.float64) @ v).astype(np.float32)


@server_function(merge="concat")
def row_norms(keys: np.ndarray, values: np.ndarray, args: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's L2 norm."""
    return keys, np.sqrt(np.einsum("ij,ij->i", values.astype(np.float64), values.astype(np.float64)))


@server_function(merge="sum")
def column_sums(keys: np.ndarray, values: np.ndarray, args: dict[str, Any]) -> np.ndarray:
    """The sum of the rows (``dim`` numbers)."""
    return np.asarray(values.astype(np.float64).sum(axis=0))


@server_function(merge="sum")
def sum_of_squares(keys: np.ndarray, values: np.ndarray, args: dict[str, Any]) -> float:
    """The squared L2 norm of all the values (its square root: the table's norm)."""
    return float(np.einsum("ij,ij->", values.astype(np.float64), values.astype(np.float64)))


@server_function(merge="sum")
def count(keys: np.ndarray, values: np.ndarray, args: dict[str, Any]) -> float:
    """How many keys are stored (or, with keys, how many of them)."""
    return float(keys.shape[0])


@server_function(merge="topk")
def top_k(keys: np.ndarray, values: np.ndarray, args: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The ``args["k"]`` keys of largest ``|value|`` in ``args.get("column", 0)`` (or of
    largest value, with ``args["signed"]``)."""
    col = values[:, int(args.get("column", 0))]
    return keys, (col if args.get("signed") else np.abs(col))


@server_function(merge="topk")
def sample(keys: np.ndarray, values: np.ndarray, args: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A uniform sample of ``args["k"]`` stored keys (seeded by ``args.get("seed", 0)``):
    every key gets a score from a hash of (seed, key), and the ``k`` best are kept."""
    from paramserver.routing.hashing import hash64_array

    seed = np.uint64(int(args.get("seed", 0)) & 0xFFFFFFFFFFFFFFFF)
    h = hash64_array(keys ^ seed)
    return keys, (h >> np.uint64(40)).astype(np.float32)


FUNCTION = declare(Kind(
    "function", "server-side function", "a function decorated with @paramserver.server_function(...)",
    lambda obj: isinstance(obj, ServerFunction), "every server", "mypackage.functions:norms",
    fix="decorate {attr} with @paramserver.server_function(...)",
    moved={"paramserver.functions": "paramserver.tables.functions"}, settings=False))
for _name, _fn in list(globals().items()):  # the ones that ship, by name: "top_k"
    if isinstance(_fn, ServerFunction):
        register("function", _name, _fn)
