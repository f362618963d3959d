"""What a server checks of a request before it touches a table, and how it splits a big
one over its vnode threads.

A request carries its keys grouped by vnode (``vnodes``, with ``counts`` keys each):
the segments must cover the keys exactly, name each vnode once (two threads must not
apply the same vnode) and stay on the ring; a client's request must reach the primary
of every vnode it names, else the client routed with a stale ring; and a client is
served only under the server's lease (``checked_table``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

from paramserver.errors import ProtocolError, StaleRingError, UnknownTableError
from paramserver.routing.ring import Ring
from paramserver.server.state import ServerState
from paramserver.store.protocol import VnodeStore
from paramserver.tables.push_ops import MERGE, OP_MERGE, OP_UPDATE, PUSH_OPS, merge_refusal
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message, field

#: requests with fewer keys run on the loop thread (a thread hand-off costs ~50 µs)
PARALLEL_MIN_KEYS = 32_768


def checked_table(state: ServerState, msg: Message, n_keys: int, vnodes: np.ndarray, counts: np.ndarray,
                  primary: bool = True) -> VnodeStore:
    """The request's table, after checking its vnode segments (and, for a client's
    request, that this server is their primary: else the client's ring is stale).  A
    client's request is served under the lease only: also a pull the staleness gate
    parked and releases later, which passes here again."""
    if primary and not state.lease.valid():
        raise StaleRingError(f"server {state.node_id} has had no answer from the scheduler for "
                             f"{state.lease.expired_for() + state.lease.length:.1f} s: its lease ran out, "
                             "so it may have been declared dead; retry on the current ring")
    name = field(msg, "table", str)
    table = state.tables.get(name)
    if table is None:
        raise UnknownTableError(f"unknown table {name!r} (tables: {sorted(state.tables)})")
    assert state.ring is not None and msg.arrays[0].shape[0] == n_keys
    check_segments(table, state.ring, msg.arrays[0], vnodes, counts, state.primary if primary else None,
                   state.node_id, field(msg, "ring_version", int))
    return table


def check_forwarder(state: ServerState, msg: Message, vnodes: np.ndarray) -> None:
    """A forward (``REPLICATE``) is taken only from a live server, and only for vnodes this
    server is not the primary of: else it was made under an older ring by a primary since
    replaced (one cut off, declared dead, its queued forwards delivered once the link heals).
    Its client was never acknowledged and resent the push to the new primary; applied here
    too, it would count twice once the client's applied-pushes record is gone (it left)."""
    sender = msg.header.get("from")
    if isinstance(sender, int) and sender in state.dead:
        raise StaleRingError(f"forward from server {sender}, which was declared dead: refused")
    mine = state.primary[vnodes[vnodes < state.primary.shape[0]]]
    if mine.any():
        raise StaleRingError(f"forward from server {sender} for {int(mine.sum())} vnode(s) this server is the "
                             "primary of: made under an older ring; the client resends it")


def check_segments(table: VnodeStore, ring: Ring, keys: np.ndarray, vnodes: np.ndarray, counts: np.ndarray,
                   primary_of: np.ndarray | None, node_id: int, ring_version: int) -> None:
    """Refuse a malformed request whole; ``primary_of`` (a client's request): the vnodes
    this server is primary of, all of which the request's must be."""
    n_keys = keys.shape[0]
    fault = FAULT_COUNTS if vnodes.ndim != 1 or vnodes.shape != counts.shape else _segment_fault(
        vnodes, counts, n_keys, ring.n_vnodes, primary_of if primary_of is not None else _NONE, primary_of is not None,
        table.slot)
    if fault == FAULT_COUNTS:
        raise ProtocolError(f"vnode counts do not cover the {n_keys} keys exactly")
    if fault == FAULT_TWICE:  # a vnode twice could be applied by two threads
        raise ProtocolError("a request lists a vnode more than once")
    if fault == FAULT_RANGE:
        raise ProtocolError(f"vnodes must be in [0, {ring.n_vnodes}), got {sorted(set(vnodes.tolist()))[:8]}")
    if fault == FAULT_NOT_PRIMARY:
        raise StaleRingError(f"server {node_id} is not the primary of all of vnodes "
                              f"{sorted(set(vnodes.tolist()))[:8]}... (request routed at ring version {ring_version}, "
                              f"this server is at ring version {ring.version})")
    bad = table.check(vnodes, counts, keys)  # dense tables index arrays with the keys
    if bad >= 0:
        raise ProtocolError(key_fault(table.spec, int(keys[bad])))


def key_fault(spec: TableSpec, key: int) -> str:
    """What is wrong with ``key``, which ``VnodeStore.check`` found out of place in ``spec``'s table."""
    if spec.key_bits:
        return (f"table {spec.name!r} is dense (key_bits={spec.key_bits}): key {key} is outside the key space or not "
                "in the vnode segment it was sent in")
    return f"table {spec.name!r} stores 4-byte keys (key_bytes=4): key {key} is not below 2**32"


FAULT_NONE, FAULT_COUNTS, FAULT_TWICE, FAULT_RANGE, FAULT_NOT_PRIMARY = 0, 1, 2, 3, 4
_NONE = np.zeros(0, np.bool_)


@njit(cache=True)  # keeps the GIL: a request names a few dozen vnodes, a hand-off would cost more
def _segment_fault(vnodes: np.ndarray, counts: np.ndarray, n_keys: int, n_vnodes: int, primary_of: np.ndarray,
                   check_primary: bool, slot: np.ndarray) -> int:
    """The first fault of a request's segments, in the order they are said (one pass each,
    in place of nine NumPy calls, 25 µs of every request): the counts must cover the keys
    exactly, no vnode may appear twice, every vnode must be on the ring and, for a client's
    request (``check_primary``), one this server is the primary of and holds."""
    total = 0
    for c in counts:
        if c < 0 or c > n_keys:
            return FAULT_COUNTS
        total += c  # at most len(counts) * n_keys: far from wrapping for any message that fits
    if total != n_keys:
        return FAULT_COUNTS
    ordered = np.sort(vnodes)
    for i in range(1, ordered.shape[0]):
        if ordered[i] == ordered[i - 1]:
            return FAULT_TWICE
    for v in vnodes:
        if v < 0 or v >= n_vnodes:
            return FAULT_RANGE
    if check_primary:
        for v in vnodes:
            if v >= primary_of.shape[0] or not primary_of[v] or v >= slot.shape[0] or slot[v] < 0:
                return FAULT_NOT_PRIMARY
    return FAULT_NONE


def split(pool: ThreadPoolExecutor | None, threads: int, vnodes: np.ndarray, counts: np.ndarray, total: int,
          fn: Callable[[slice, slice], None]) -> None:
    """Call ``fn(segments, keys)`` on slices of the request (``total`` keys): one, or one
    per vnode thread when the request is big (vnodes are independent; kernels drop the GIL)."""
    if pool is None or vnodes.size < 2 or total < PARALLEL_MIN_KEYS:  # the common case: no NumPy call
        fn(slice(0, vnodes.size), slice(0, total))
        return
    ends = np.cumsum(counts)
    cuts = np.unique(np.searchsorted(ends, np.arange(1, threads) * total / threads) + 1)
    bounds = [0, *[int(c) for c in cuts if 0 < c < vnodes.size], int(vnodes.size)]
    starts = np.concatenate([[0], ends])
    futures = [pool.submit(fn, slice(lo, hi), slice(int(starts[lo]), int(starts[hi])))
               for lo, hi in zip(bounds, bounds[1:])]
    for f in futures:
        f.result()


def writer(msg: Message) -> int:
    """Who pushed ``msg`` (-1: no numbered sender)."""
    sender = msg.header.get("sender")
    return sender if isinstance(sender, int) and not isinstance(sender, bool) else -1


def push_op(msg: Message, table: VnodeStore) -> int:
    """The push operation a ``push`` (or its ``replicate``) asks for (``push_ops.PUSH_OPS``;
    ``update``, the table's rule, when it names none)."""
    name = msg.header.get("push_op", "update")
    if name == MERGE:
        return merge_op(table)
    op = PUSH_OPS.get(name) if isinstance(name, str) else None
    if op is None:
        raise ProtocolError(f"push_op must be one of {sorted(PUSH_OPS)}, got {name!r}")
    if op != OP_UPDATE and table.spec.aggregate:
        raise ProtocolError(f"push_op {name!r} on table {table.spec.name!r}, which aggregates pushes (BSP): "
                            "only 'update' is served there")
    return op


def merge_op(table: VnodeStore) -> int:
    """``merge`` (a row cache's change to whole rows, ``tables/push_ops.py``) where the
    table's rows merge; else refused, saying why."""
    refusal = merge_refusal(table.spec)
    if refusal:
        raise ProtocolError(f"table {table.spec.name!r} cannot merge a row cache's rows: {refusal}; "
                            "its caches push gradient sums (row_cache apply=server)")
    return OP_MERGE


def push_width(table: VnodeStore, op: int, client: bool) -> int:
    """The floats a push's row carries: a merge's whole rows; a client's values and the
    stats its table counts; a forwarded push's values."""
    if op == OP_MERGE:
        return table.spec.width
    return table.spec.push_width if client else table.spec.dim


def state_read(table: VnodeStore, msg: Message) -> bool:
    """Whether a pull asks for whole rows (a row cache that trains them: ``state``), checked."""
    if msg.header.get("state") is not True:
        return False
    merge_op(table)
    return True
