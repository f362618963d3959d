"""Vnode copies between servers (joins, removals, repairs), at the receiving end: what
a copy must look like to be installed, and its installation (``INSTALL``).

No sockets: ``install_copy`` checks a copy whole with ``check_install`` before it
changes anything, then installs it into the server's state (``server/state.py``): the
rows, the exactly-once record, the workers' clocks, and the pushes of unfinished clocks
(BSP aggregation, ``consistency/buffers.py``) that travel with their vnode.  The
sending end is ``server/copies.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paramserver.errors import DIVERGED, ProtocolError, UnknownTableError
from paramserver.routing.ring import Ring
from paramserver.server.requests import key_fault
from paramserver.server.state import ServerState
from paramserver.store.protocol import VnodeStore
from paramserver.wire.message import Message, field, reply


def install_copy(state: ServerState, msg: Message) -> list[Any]:
    """A whole vnode copied here (keys, values, optimiser state, applied pushes, and
    for BSP aggregation the pushes of unfinished clocks).  Checked whole first."""
    name, vnode = field(msg, "table", str), field(msg, "vnode", int)
    sender, seqs, buffered = field(msg, "from", int), field(msg, "seqs", list), field(msg, "buffered", list)
    clocks = msg.header.get("clocks") or {}
    table = state.tables.get(name)
    ring = state.ring
    assert ring is not None
    if table is None:
        raise UnknownTableError(f"install: unknown table {name!r} (tables: {sorted(state.tables)})")
    if sender in state.dead:
        raise ProtocolError(f"install from server {sender}, which was declared dead")
    pairs = check_install(msg, table, ring, name, vnode, buffered, seqs, clocks)
    keys, rows = msg.arrays[0], msg.arrays[1]
    if msg.header.get("append") is True:  # the rest of a vnode too big for one message
        if vnode not in table.tables:
            raise ProtocolError(f"install of {name!r}/{vnode}: a continuation with no first part")
        table.install(vnode, keys, rows, replace=False)
        return reply(msg)
    table.install(vnode, keys, rows)
    ring_version = msg.header.get("ring_version")
    if isinstance(ring_version, int) and vnode not in ring.held_by(state.node_id, table.spec.replicas):
        state.installs.setdefault(name, {})[vnode] = ring_version
    state.dedup[name].merge(vnode, seqs)
    for worker, clock in clocks.items():
        state.gate.vector.tick(int(worker), int(clock))
    state.buffers.replace_vnode(name, lambda k: ring.vnodes(k, table.layout), vnode, pairs)
    state.refresh_targets()
    return reply(msg)


def check_moves(moves: Any) -> list[tuple[str, int, int]]:
    """``MIGRATE``'s ``moves``: ``[[table, vnode, dest], ...]``."""
    if not isinstance(moves, list) or not all(
            isinstance(m, list) and len(m) == 3 and isinstance(m[0], str)
            and all(isinstance(x, int) and not isinstance(x, bool) for x in m[1:]) for m in moves):
        raise ProtocolError(f"migrate: moves must be [[table, vnode, dest], ...], got {str(moves)[:200]}")
    return [(m[0], m[1], m[2]) for m in moves]


def check_install(msg: Message, table: VnodeStore, ring: Ring, name: str, vnode: int, buffered: list[Any],
                  seqs: list[Any], clocks: Any) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Refuse a malformed copy of ``vnode`` before anything is installed; return its
    buffered pushes as ``(clock, keys, grads)``."""
    if not 0 <= vnode < ring.n_vnodes:
        raise ProtocolError(f"install: vnode {vnode} is not in [0, {ring.n_vnodes})")
    if len(msg.arrays) != 2 + 2 * len(buffered) or not all(isinstance(c, int) for c in buffered):
        raise ProtocolError(f"install: {len(msg.arrays)} arrays for {len(buffered)} buffered clocks")
    if not all(isinstance(r, list) and len(r) == 3 and isinstance(r[0], int) and isinstance(r[1], int)
               and isinstance(r[2], list) and all(isinstance(q, int) for q in r[2]) for r in seqs):
        raise ProtocolError("install: seqs must be [[sender, acked, [seq, ...]], ...]")
    if not isinstance(clocks, dict) or not all(isinstance(c, int) and str(w).isdigit() for w, c in clocks.items()):
        raise ProtocolError("install: clocks must map worker ids to ints")
    keys, rows = msg.arrays[0], msg.arrays[1]
    if keys.dtype != np.uint64 or keys.ndim != 1 or rows.dtype != np.float32 \
            or rows.shape != (keys.shape[0], table.width):
        raise ProtocolError(f"install of {name!r}/{vnode}: keys must be <u8[n] and rows <f4[n, {table.width}], "
                            f"got {keys.dtype}{keys.shape} and {rows.dtype}{rows.shape}")
    pairs = [(c, msg.arrays[2 + 2 * i], msg.arrays[3 + 2 * i]) for i, c in enumerate(buffered)]
    for _, k, g in pairs:
        check_grads(table, k, g)
    for k in [keys, *[k for _, k, _ in pairs]]:  # a dense table indexes arrays with them
        bad = table.check(np.array([vnode], np.int32), np.array([k.shape[0]], np.int64), k)
        if bad >= 0:
            raise ProtocolError(f"install of {name!r}/{vnode}: {key_fault(table.spec, int(k[bad]))}")
    return pairs


def check_grads(table: VnodeStore, keys: np.ndarray, grads: np.ndarray, width: int | None = None) -> None:
    """A push's rows: ``width`` (default ``dim``; a client's push, ``spec.push_width``)
    finite floats a key."""
    width = table.spec.dim if width is None else width
    if grads.shape != (keys.shape[0], width):
        raise ProtocolError(f"push to {table.spec.name!r}: grads must have shape "
                            f"({keys.shape[0]}, {width}), got {grads.shape}")
    if not np.isfinite(grads).all():
        raise ProtocolError(f"push to {table.spec.name!r}: grads contain NaN or inf, so {DIVERGED}")
