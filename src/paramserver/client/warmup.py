"""The client's warm-up: routing a pull, a push and a step, and scattering a pull's reply, loaded
(or compiled) before a worker registers (``_runtime/warm.py`` says why)."""

from __future__ import annotations

import numpy as np

from paramserver._runtime.warm import is_inherited, load_numba
from paramserver.filters.chain import FilterSpec
from paramserver.filters.warmup import warm_filters
from paramserver.routing.partition import route_pull, route_push, scatter_rows, scatter_rows_within
from paramserver.routing.ring import Ring
from paramserver.routing.steps import every_value_one, route_steps
from paramserver.wire.message import Op, decode, encode
from paramserver.wire.step_groups import group_arrays


def warm_client(keys: np.ndarray | None = None, grads: np.ndarray | None = None, combine: bool = True,
                filters: bool | FilterSpec = True) -> None:
    """Route a push of ``grads`` to ``keys`` (distinct keys; ``combine``: also a push whose
    duplicate keys are merged) and a pull of them, and scatter the pull's reply from a
    received (read-only) frame; with ``filters``, every built-in filter's kernels (those of
    the spec, if a ``FilterSpec``).  Without
    ``keys``: three keys of dim 1."""
    if is_inherited():
        return
    load_numba()
    if keys is None:
        keys = np.array([3, 5, 7], np.uint64)
    if grads is None:
        grads = np.ones((keys.size, 1), np.float32)
    if combine:
        route_push(Ring.create([1]), keys, grads)
    route_push(Ring.create([1]), keys, grads, distinct=True)
    routed = route_pull(Ring.create([1]), keys)
    frames = encode({"op": Op.OK.value}, [np.zeros((keys.size, 1), np.float32)])
    (vals,) = decode([bytes(f) for f in frames]).arrays
    scatter_rows(vals, routed.order, np.empty((keys.size, 1), np.float32))
    scatter_rows_within(vals, routed.order, np.empty((keys.size, 1), np.float32), 0, keys.size)  # a big pull's half
    for rank_dtype in (np.uint16, np.int32):  # a step's keys (their width looked up) and their occurrences' places
        route_steps(Ring.create([1]), [keys], [np.zeros(2, np.int64)], 0, None, np.dtype(rank_dtype))
    every_value_one([np.ones(2, np.float32)])
    group_arrays(np.array([3, 5], np.uint32), np.zeros(1, np.int32), np.array([2], np.int64),  # three-byte keys
                 np.zeros(2, np.uint16), np.array([0, 2], np.int64), np.ones(2, np.float32),  # and rows' lengths
                 np.zeros(1, np.float32), np.array([2, 1, 1], np.int64))
    if filters:
        # a filtered table's requests, residuals and routing in position order
        warm_filters(filters if isinstance(filters, FilterSpec) else None)
