"""The filters' warm-up: every built-in's kernels, both ways, loaded (or compiled) before a
node serves, for the array types messages bring (``_runtime/warm.py`` says why: a
compile in a server's loop once starved its heartbeats).  The server's and the client's
warm-ups call it; a node with no filtered table pays a few milliseconds."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from paramserver.filters.base import Context, KeyStore, Link
from paramserver.filters.chain import Chain, FilterSpec, chains, pack, unpack
from paramserver.filters.packed import PackedRows
from paramserver.filters.residual import Owed, after_routing, before_routing
from paramserver.routing.hashing import layout_code
from paramserver.routing.partition import route_pull, route_push
from paramserver.routing.ring import Ring
from paramserver.wire.message import Op, decode, encode

#: every built-in on the wire, each way (sigmod runs on the worker: ``before_routing``)
SPEC = ("push=sigmod:threshold=0.5,int8,keycache:min_keys=1,delta,zstd:min_bytes=0;"
        "pull=keycache:min_keys=1,delta,zstd:min_bytes=0;reply=fp16,zstd:min_bytes=0")
OTHER_CODECS = ("push=bf16;reply=int8", "push=fp16;reply=bf16")
SPARSE = "push=sparse;reply=sparse"  # with values mostly zero, or it leaves them as they are


def warm_filters(spec: FilterSpec | None = None) -> None:
    """Every built-in's kernels, or with ``spec`` those of a job's own filters alone (from
    the cache, every built-in's take ~0.2 s: a job that names its filters pays for those)."""
    n = 32
    keys = np.arange(1, n + 1, dtype=np.uint64)
    values = np.linspace(-1, 1, n, dtype=np.float32).reshape(n, 1)
    sparse = np.where(keys[:, None] % 4 == 0, values, np.float32(0))  # what ``sparse`` sends packed
    vnodes, counts = np.zeros(1, np.int32), np.array([n], np.int64)
    specs: tuple[str | FilterSpec, ...] = (SPEC, *OTHER_CODECS, SPARSE) if spec is None else (spec,)
    built = [chains(FilterSpec.parse(s)) for s in specs]
    ordered = any(c.ordered for by in built for c in by.values())
    for layout in (0, layout_code(8)):  # keys as themselves, and as a dense table's positions
        for by_direction in built:
            for vals in (values, sparse):
                _round_trip(by_direction, keys, vals, vnodes, counts, layout)
            if any(f.takes_packed for f in by_direction["push"].wire):  # rows packed by their producer
                _round_trip(by_direction, keys[1:], _routed_packed(sparse), vnodes, counts - 1, layout)
        if ordered:
            ring = Ring.create([1])
            route_pull(ring, keys, layout, ordered=True)  # a vnode's keys in position order: pulls' rows ...
            route_push(ring, keys, values, layout, distinct=True, ordered=True)  # ... and pushes'
    for by_direction in built:
        push = by_direction["push"]
        if push.select is None and not push.lossy:
            continue  # no residuals kept
        owed = Owed(1)
        for _ in range(2):  # the second finds the first's residuals
            sent_keys, sent = before_routing(push, owed, keys, values, {})
            after_routing(push, owed, sent_keys, sent, np.array([sent_keys.shape[0]], np.int64))
        owed.drain(held_only=False)


def _routed_packed(rows: np.ndarray) -> PackedRows:
    """``rows`` packed, checked, reordered and cut as a push of them is routed, a piece whose
    rows do not start on a byte among them (``filters/packed.py``'s kernels)."""
    packed = PackedRows.from_dense(rows)
    replace(packed, known=False).fits()
    return packed.take(np.arange(rows.shape[0] - 1, -1, -1))[1:]


def _round_trip(by_direction: dict[str, Chain], keys: np.ndarray, values: Any, vnodes: np.ndarray,
                counts: np.ndarray, layout: int) -> None:
    """Each direction packed, sent as frames (read-only on arrival, as a node gets them),
    unpacked; twice, so that a key list goes by its signature the second time."""
    link, store = Link(), KeyStore()
    for direction, arrays in (("push", [keys, values, vnodes, counts]), ("pull", [keys, vnodes, counts]),
                              ("reply", [values])):
        chain = by_direction[direction]
        if not chain.wire:
            continue
        for _ in range(2):
            fields, sent = pack(direction, chain, list(arrays), Context(link=link, layout=layout))
            received = decode([bytes(f) for f in encode({"op": Op.PUSH.value, **fields}, sent)])
            unpack(direction, chain, received.header, received.arrays, Context(store=store, layout=layout))
