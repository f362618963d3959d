"""The data plane: a client's pulls and pushes, and the pushes a primary forwards to its
backups (``REPLICATE``), as handlers over a server's state (``server/state.py``).

A request is checked whole before any table is touched (``requests.checked_table``: the
lease, the table, its vnode segments, that this server is their primary), so a malformed one
changes nothing and gets an error reply.  A push is applied once per vnode, whatever
the retries (``fresh``: ``server/dedup.py``), then forwarded whole to the servers that
also hold its vnodes (``Peers.forward``); the client is answered once every live one
applied it (``finished``).  A push to a table that aggregates (BSP) waits in the clock
buffers (``consistency/buffers.py``) until its clock is finished (``server/clocks.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from paramserver.errors import Code, ProtocolError, UnknownTableError
from paramserver.filters.base import Context
from paramserver.filters.chain import chains, pack, unpack
from paramserver.server import masked_rows
from paramserver.server.admin import check_quota
from paramserver.server.install import check_grads
from paramserver.server.peers import Acks, Answer
from paramserver.server.requests import (
    check_forwarder,
    checked_table,
    push_op,
    push_width,
    split,
    state_read,
    writer,
)
from paramserver.server.state import Port, ServerState
from paramserver.store.life import subset
from paramserver.store.protocol import VnodeStore
from paramserver.tables.push_ops import OP_MERGE, OP_UPDATE
from paramserver.wire.message import KEY_TYPES, Message, Op, error_reply, expect, field, reply

logger = logging.getLogger(__name__)

#: a push's arrays once checked: keys, grads, vnodes, counts
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
#: keys of a tiered table's pull served, or push applied, between two settles: the rows a
#: request reads back from disk stay in memory until the next settle, so a pull of 10^5 cold
#: keys (a test set's part) held all of theirs over the budget at once
TIER_PART = 16_384


def serve_pull(state: ServerState, msg: Message, table: VnodeStore | None = None) -> list[Any]:
    """Answer a pull (``table``: checked for this request already; a pull the gate
    held is checked again, the ring may have moved meanwhile)."""
    keys, vnodes, counts = msg.arrays
    if table is None:
        table = checked_table(state, msg, keys.shape[0], vnodes, counts)
    whole = state_read(table, msg)
    out = read_rows(state, table, keys, vnodes, counts, whole=whole)
    fields = _versions(state, table, msg.header.get("writer")) if msg.header.get("versions") else {}
    arrays, fields = filtered_rows(state, table, msg, out, fields, whole)
    return reply(msg, arrays, **fields)


def _versions(state: ServerState, table: VnodeStore, writer: object) -> dict[str, Any]:
    """A row cache's bound, which an answer carries: the table's version, and the last one
    another writer than ``writer`` made (``foreign``; a cache that reads back its merges'
    rows only while others write, ``RowCache.wants_rows``)."""
    return {"version": table.version, "foreign": state.foreign(table, writer)}


def filtered_rows(state: ServerState, table: VnodeStore, msg: Message, out: np.ndarray, fields: dict[str, Any],
                  whole: bool) -> Answer:
    """Rows read for ``msg`` as its reply carries them: through the table's reply filters
    where it asked for them (``reply_filters``), their lossless ones alone for ``whole`` rows."""
    if not table.spec.filters or not msg.header.get("reply_filters"):  # the default: no lookup
        return [out], fields
    chain = chains(table.spec.filters)["reply"]
    if whole:  # a cache trains these rows and sends their change: never rounded (an int8 block would
        chain = chain.exact()  # take a row's value, its accumulators and the next row's as one scale)
    if not chain:
        return [out], fields
    sizes: dict[str, list[int]] = {}
    packed, arrays = pack("reply", chain, [out], Context(), sizes)
    fields.update(packed)
    for name, (before, after) in sizes.items():
        seen = state.filter_bytes.setdefault((table.spec.name, name), [0, 0])
        seen[0] += before
        seen[1] += after
    return arrays, fields


def read_rows(state: ServerState, table: VnodeStore, keys: np.ndarray, vnodes: np.ndarray,
              counts: np.ndarray, whole: bool = False) -> np.ndarray:
    """The rows of a checked request's keys (``float32[n, dim]``; a key never pushed reads as
    its initial value), the server's threads splitting its vnodes, a part at a time where the
    table is tiered.  ``whole``: value and state (``float32[n, width]``, a key never pushed
    as its row would start), for a row cache that trains its rows (``tables/push_ops.py``)."""
    out = np.empty((keys.shape[0], table.spec.width if whole else table.spec.dim), np.float32)
    _by_parts(table, counts, keys.shape[0], lambda seg, at: _split(
        state, vnodes[seg], counts[seg], at.stop - at.start,
        partial(_lookup, table, vnodes[seg], counts[seg], keys[at], out[at])))
    return out


def apply_rows(state: ServerState, table: VnodeStore, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray,
               grads: np.ndarray, op: int = OP_UPDATE) -> None:
    """Apply a push's rows (the server's threads splitting its vnodes), a part at a time where
    the table is tiered (``_by_parts``), as a pull is served."""
    def part(seg: slice, at: slice) -> None:
        vn, cn, ks, gs = vnodes[seg], counts[seg], keys[at], grads[at]
        _split(state, vn, cn, ks.shape[0], lambda s, k: table.apply(vn[s], cn[s], ks[k], gs[k], op))

    _by_parts(table, counts, keys.shape[0], part)


def _by_parts(table: VnodeStore, counts: np.ndarray, total: int, run: Callable[[slice, slice], None]) -> None:
    """``run(segments, keys)`` over a request: at once, or for a tiered table a part at a time
    (``_parts``), settled after each, so that the cold rows a part reads back go back to disk
    before the next part's come (one settle after the whole request otherwise)."""
    if not table.tiered:
        run(slice(0, counts.shape[0]), slice(0, total))
        return
    for lo, hi, a, b in _parts(counts, total):
        run(slice(lo, hi), slice(a, b))
        table.settle()


def _lookup(table: VnodeStore, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, out: np.ndarray,
            segments: slice, at: slice) -> None:
    table.lookup(vnodes[segments], counts[segments], keys[at], out[at])


def _parts(counts: np.ndarray, total: int) -> list[tuple[int, int, int, int]]:
    """A tiered table's pull as vnode segments ``[lo, hi)`` and keys ``[a, b)`` served
    between two settles: at most ``TIER_PART`` keys at a time (a segment is never cut: one
    bigger than that is a part of its own).  A walk over the segments (a vnode each), not
    the keys."""
    if total <= TIER_PART:
        return [(0, counts.shape[0], 0, total)]
    parts, lo, a, b = [], 0, 0, 0
    for s, n in enumerate(counts.tolist()):
        if b > a and b - a + n > TIER_PART:
            parts.append((lo, s, a, b))
            lo, a = s, b
        b += n
    parts.append((lo, counts.shape[0], a, b))
    return parts


def unfiltered(state: ServerState, msg: Message, direction: str) -> None:
    """Take a filtered request's arrays back to what its sender had (in place: a pull the
    gate parks is served from them later); the table's own filters only."""
    if "filters" not in msg.header:
        return
    name = field(msg, "table", str)
    table = state.tables.get(name)
    if table is None:
        raise UnknownTableError(f"unknown table {name!r} (tables: {sorted(state.tables)})")
    msg.arrays = unpack(direction, chains(table.spec.filters)[direction], msg.header, msg.arrays,
                        Context(store=state.key_store, layout=table.spec.layout))


def push_time(msg: Message) -> float | None:
    """The time a push says it is (``Client.set_time``), None when it says none."""
    t = msg.header.get("time")
    if t is None:
        return None
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not np.isfinite(t):
        raise ProtocolError(f"a push's time must be a finite number, got {t!r}")
    return float(t)


def stored_part(table: VnodeStore, keys: np.ndarray, grads: np.ndarray, vnodes: np.ndarray,
                counts: np.ndarray) -> Arrays:
    """The part of a push whose keys this server stores (a lifecycle that admits)."""
    return subset(table.stored(vnodes, counts, keys), keys, grads, vnodes, counts)


def _split(state: ServerState, vnodes: np.ndarray, counts: np.ndarray, total: int,
           fn: Callable[[slice, slice], None]) -> None:
    split(state.pool, state.threads, vnodes, counts, total, fn)


class DataPlane:
    """The handlers of ``PULL``, ``PUSH`` and ``REPLICATE`` on ``state``, answering
    through ``port``."""

    def __init__(self, state: ServerState, port: Port) -> None:
        self.state, self.port = state, port

    def on_pull(self, msg: Message, identity: bytes = b"") -> list[Any] | None:
        unfiltered(self.state, msg, "pull")
        keys, vnodes, counts = expect(msg, ("keys", KEY_TYPES, 1), ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        state = self.state
        table = checked_table(state, msg, keys.shape[0], vnodes, counts)
        clock = msg.header.get("clock")
        if isinstance(clock, int):  # ASP is admitted at once, and its staleness recorded too
            if not state.gate.admit(clock, table.spec.staleness, (identity, msg), state.clock(), identity):
                return None  # answered by clocks.moved
        return serve_pull(state, msg, table)

    def on_prefetch(self, msg: Message) -> list[Any]:
        """Keys a later pull or push will name (``Client.prefetch``): a tiered table begins
        reading their cold rows (``Tiers.prefetch``) where that pays; answered at once with
        how many were not in memory (``cold``; None: the table has no tiers here) and
        whether it reads ahead (``reading``).  Never gated: it reads nothing a clock guards."""
        keys, vnodes, counts = expect(msg, ("keys", KEY_TYPES, 1), ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        table = checked_table(self.state, msg, keys.shape[0], vnodes, counts)
        found = table.prefetch(vnodes, counts, keys)
        return reply(msg, cold=None if found is None else found[0], reading=found is not None and found[1])

    def on_push(self, msg: Message, identity: bytes = b"") -> list[Any] | None:
        added = masked_rows.added(self.state, msg, self._numbered)  # a sparse add, never made dense
        if added is not None:
            return added
        unfiltered(self.state, msg, "push")
        keys, grads, vnodes, counts = expect(msg, ("keys", KEY_TYPES, 1), ("grads", "<f4", 2),
                                             ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        table = checked_table(self.state, msg, keys.shape[0], vnodes, counts)
        op = push_op(msg, table)
        check_grads(table, keys, grads, push_width(table, op, True))  # values (stats, rows)
        answer = None
        if op == OP_MERGE and msg.header.get("read_back") is True:  # a row cache's merge: its rows as merged
            answer = partial(self._merged, table, msg, keys, vnodes, counts)
        return self.pushed(table, msg, keys, grads, vnodes, counts, identity, answer)

    def _merged(self, table: VnodeStore, msg: Message, keys: np.ndarray, vnodes: np.ndarray,
                counts: np.ndarray) -> Answer:
        """A merge's answer, read once it is applied: the whole rows it left and the table's
        version then (a cache keeps them as a pull's, ``RowCache.merged``)."""
        out = read_rows(self.state, table, keys, vnodes, counts, whole=True)
        return filtered_rows(self.state, table, msg, out, _versions(self.state, table, writer(msg)), True)

    def pushed(self, table: VnodeStore, msg: Message, keys: np.ndarray, grads: np.ndarray, vnodes: np.ndarray,
               counts: np.ndarray, identity: bytes, answer: Answer | Callable[[], Answer] | None = None,
               ) -> list[Any] | None:
        """A client's checked push (or a step's gradient, ``server/steps.py``): applied once,
        forwarded to the copies; the reply now, or None when it waits for theirs.  ``answer``:
        the arrays and fields the reply carries (none: a bare acknowledgement), or what reads
        them once the push is applied."""
        waits, answer = self._applied(table, msg, keys, grads, vnodes, counts, identity, answer)
        if waits:
            return None
        return reply(msg) if answer is None else reply(msg, answer[0], **answer[1])

    def applied(self, table: VnodeStore, msg: Message, keys: np.ndarray, grads: np.ndarray, vnodes: np.ndarray,
                counts: np.ndarray, identity: bytes) -> bool:
        """``pushed``'s work: the push applied once and forwarded to the copies; True when its
        reply waits for theirs (the copies' answers send it), False when it is the caller's to
        send."""
        return self._applied(table, msg, keys, grads, vnodes, counts, identity, None)[0]

    def _applied(self, table: VnodeStore, msg: Message, keys: np.ndarray, grads: np.ndarray, vnodes: np.ndarray,
                 counts: np.ndarray, identity: bytes,
                 answer: Answer | Callable[[], Answer] | None) -> tuple[bool, Answer | None]:
        """``applied``, and the answer (read now that the push is applied, where it is a reader)."""
        state = self.state
        check_quota(state, table, vnodes, counts, keys)  # before the dedup marks it applied
        fresh = self._fresh(table, msg, keys, grads, vnodes, counts)
        life = table.life
        if life is not None:  # what the admission policy lets in; stamped once applied
            fresh = life.admit(*fresh)
        self._apply(table, msg, *fresh)
        if callable(answer):
            answer = answer()
        if life is not None:
            life.touched(fresh[2], fresh[3], fresh[0], push_time(msg))
            if life.policy is not None:  # backups store what this primary stores, and only that
                keys, grads, vnodes, counts = stored_part(table, keys, life.values(grads), vnodes, counts)
        table.settle()  # a tiered table over its budget: rows to disk, once stamped
        # forwarded whole, even the part already applied here: a retry after a failover
        # may find this server with the push and a backup without it; backups dedup too
        targets = state.targets.get(table.spec.name)
        waits = targets is not None and state.ring is not None and \
            self.port.peers.forward(targets, state.ring.version, table.spec.name, msg, keys, grads, vnodes, counts,
                                    identity, answer)
        if life is not None and life.due(state.primary):  # after the push's forward: backups see both in order
            self._forward_evicted(table, life.sweep(state.primary))
        return bool(waits), answer

    def on_replicate(self, msg: Message) -> list[Any]:
        """A push the primary applied, forwarded: apply it to the vnodes held here (a
        ring flip may have moved some meanwhile; those are no longer this server's).  Or
        (``evict``) the keys its primary evicted: drop them here too."""
        if msg.header.get("evict") is True:
            return self._evicted(msg)
        keys, grads, vnodes, counts = expect(msg, ("keys", KEY_TYPES, 1), ("grads", "<f4", 2),
                                             ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        table = checked_table(self.state, msg, keys.shape[0], vnodes, counts, primary=False)  # the primary retries
        check_forwarder(self.state, msg, vnodes)
        check_grads(table, keys, grads, push_width(table, push_op(msg, table), False))
        held = table.holds(vnodes)
        if not held.all():
            rows = np.repeat(held, counts)
            keys, grads, vnodes, counts = keys[rows], grads[rows], vnodes[held], counts[held]
        keys, grads, vnodes, counts = self._fresh(table, msg, keys, grads, vnodes, counts)
        self._apply(table, msg, keys, grads, vnodes, counts)
        if table.life is not None:
            table.life.touched(vnodes, counts, keys, push_time(msg))
        table.settle()
        return reply(msg, applied=int(keys.shape[0]))

    def _evicted(self, msg: Message) -> list[Any]:
        keys, vnodes, counts = expect(msg, ("keys", KEY_TYPES, 1), ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        table = checked_table(self.state, msg, keys.shape[0], vnodes, counts, primary=False)
        check_forwarder(self.state, msg, vnodes)
        if table.life is None:
            raise ProtocolError(f"evict on table {table.spec.name!r}, which has no lifecycle")
        ends = np.cumsum(counts)
        dropped = sum(table.life.evict(int(v), keys[e - c:e]) for v, c, e in zip(vnodes, counts, ends, strict=True)
                      if table.holds(np.array([v], np.int32))[0])
        return reply(msg, applied=dropped)

    def _forward_evicted(self, table: VnodeStore, evicted: list[tuple[int, np.ndarray]]) -> None:
        """Tell the servers that also hold the swept vnodes what this primary evicted."""
        state = self.state
        targets = state.targets.get(table.spec.name)
        if not evicted or targets is None or state.ring is None:
            return
        vnodes = np.array([v for v, _ in evicted], np.int32)
        counts = np.array([k.shape[0] for _, k in evicted], np.int64)
        header = {"op": Op.REPLICATE.value, "table": table.spec.name, "ring_version": state.ring.version,
                  "evict": True, "from": state.node_id}

        def done(failed: str | None) -> None:
            if failed:  # that copy keeps the keys: the chaos campaign checks that copies agree
                logger.warning("server %d: eviction not applied by a copy: %s", state.node_id, failed)

        self.port.peers.scatter(targets, vnodes, counts, header, [np.concatenate([k for _, k in evicted])],
                                Acks(done=done))

    def finished(self, acks: Acks) -> None:
        """Every live server a push was forwarded to answered (``Peers``' callback): the
        client is answered; a migration's copies, all in, report it done."""
        if acks.request is not None and acks.identity is not None:
            if acks.failed:  # applied here, not on every backup: the client retries, and the
                # retry (same seq) is skipped where applied and forwarded again
                self.port.answer(error_reply(acks.request.id, Code.STALE_RING, f"{acks.failed}; retry",
                                             ring_version=self.state.ring_version()), acks.identity)
            else:
                arrays, fields = acks.answer if acks.answer is not None else ([], {})
                self.port.answer(reply(acks.request, arrays, **fields), acks.identity)
        if acks.done is not None:
            acks.done(acks.failed)

    def _fresh(self, table: VnodeStore, msg: Message, keys: np.ndarray, grads: np.ndarray, vnodes: np.ndarray,
               counts: np.ndarray) -> Arrays:
        """The part of a push not applied yet (a retry may have reached some vnodes)."""
        state = self.state
        numbered = self._numbered(msg)
        if numbered is None:
            return keys, grads, vnodes, counts  # an unnumbered push: at least once
        sender, seq, acked = numbered
        dedup = state.dedup[table.spec.name]
        fresh = dedup.fresh(sender, seq, acked, vnodes)
        if not fresh.all():
            logger.info("server %d: push %d of %d already applied to %d vnode(s): skipped there",
                        state.node_id, seq, sender, int((~fresh).sum()))
            rows = np.repeat(fresh, counts)
            keys, grads, vnodes, counts = keys[rows], grads[rows], vnodes[fresh], counts[fresh]
        dedup.mark(sender, seq, vnodes)
        return keys, grads, vnodes, counts

    def _numbered(self, msg: Message) -> tuple[int, int, int] | None:
        """A push's sender, number and ``acked``, checked (its sender's token too); None for
        an unnumbered push, applied at least once."""
        sender, seq = msg.header.get("sender"), msg.header.get("seq")
        if not isinstance(sender, int) or not isinstance(seq, int):
            return None
        if self.state.tokens is not None:  # the sender proves it is the node whose pushes it acknowledges
            self.state.tokens.check(sender, msg.header.get("sender_token"), f"push {seq}")
        acked = msg.header.get("acked", -1)
        if not isinstance(acked, int) or not -1 <= acked < seq:
            raise ProtocolError(f"push {seq}: acked must be an int in [-1, {seq}), got {acked!r}")
        return sender, seq, acked

    def unapplied(self, table: VnodeStore, pushes: list[Message]) -> bool:
        """Whether each of ``pushes`` (a step's batches, numbered in turn) is numbered, applied
        to none of its vnodes yet, and has room on its sender's record: then they may be taken
        whole (``server/steps.py``) and recorded by ``mark_applied`` as they are.  Else (a
        retry that reached some of them) they go one by one, as ``applied`` takes a push."""
        numbered = self._numbered(pushes[0]) if pushes else None
        if numbered is None:
            return False
        sender, seq, acked = numbered
        for k, msg in enumerate(pushes):  # one header: its sender and acked, seq, seq + 1, ... (``_on_steps``)
            h = msg.header
            if h.get("sender") != sender or h.get("seq") != seq + k or h.get("acked", -1) != acked:
                return False
        dedup = self.state.dedup[table.spec.name]
        return dedup.unseen(sender, acked, seq, len(pushes)) and dedup.room(sender) >= len(pushes)

    def mark_applied(self, table: VnodeStore, pushes: list[Message]) -> None:
        """Record ``pushes`` (checked by ``unapplied``) as applied to all their vnodes: the
        exactly-once record and the table's version, as ``applied`` records a push."""
        if not pushes:
            return
        self.state.dedup[table.spec.name].mark_many(pushes[0].header["sender"], pushes[0].header["seq"],
                                                    [msg.arrays[1] for msg in pushes])
        self.state.counted(table, pushes[0].header["sender"], sum(1 for msg in pushes if msg.arrays[0].shape[0]))

    def _apply(self, table: VnodeStore, msg: Message, keys: np.ndarray, grads: np.ndarray,
               vnodes: np.ndarray, counts: np.ndarray) -> None:
        state = self.state
        op = push_op(msg, table)
        if keys.shape[0]:  # one push, however many keys: counted before a BSP clock buffers it too
            state.counted(table, writer(msg))
        if op != OP_UPDATE:
            apply_rows(state, table, vnodes, counts, keys, grads, op)
            return
        if table.spec.aggregate:  # BSP aggregation: applied once the clock is finished
            clock = field(msg, "clock", int)
            if clock >= state.gate.vector.min():
                state.buffers.add(table.spec.name, clock, keys, grads)
                return
            # its clock was already applied (a worker that rejoined behind the others):
            # apply it now, as a late update, rather than lose it
            logger.warning("push for finished clock %d applied late on %r", clock, table.spec.name)
        apply_rows(state, table, vnodes, counts, keys, grads)
