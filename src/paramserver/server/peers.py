"""A server's requests to the other servers (forwarded pushes, vnode copies) and their
answers.

``Peers`` keeps one DEALER a peer and, per request sent, what waits on its answer: an
``Acks``, which counts the answers it still needs.  A client's push is acknowledged once
every backup applied it; a migration reports done once every copy was installed.  A peer
that dies counts as having answered (a push is acknowledged once every *live* backup
applied it); a peer that refuses makes the whole ``Acks`` fail, and the client retries.

A request unanswered past its deadline (``expire``) fails its ``Acks`` too: a forward or
a copy, or its answer, lost between two servers that both go on beating (a link that
drops, a reconnect that loses what was queued, a peer's slow-peer budget) would otherwise
hold the client's push, or the migration, for ever.  The client retries with the same
seq: the backups that applied it skip it (exactly-once), the others apply it.  The
deadline knows the request's size: ``ANSWER_WITHIN_S``, plus its bytes at ``SLOWEST_LINK_BPS``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from paramserver.errors import ProtocolError
from paramserver.routing.ring import Ring
from paramserver.store.protocol import VnodeStore
from paramserver.wire.message import Message, Op, decode, encode
from paramserver.wire.transport import Poller, Transport

logger = logging.getLogger(__name__)


#: a request to another server is answered within this long, plus its bytes at SLOWEST_LINK_BPS (``expire``)
ANSWER_WITHIN_S = 10.0
SLOWEST_LINK_BPS = 1e6  # 8 Mbit/s: a link slower than this between servers is not one to replicate over
#: what a backup needs of a push besides its arrays: exactly-once, BSP clock, push op, lifecycle time
FORWARDED = ("sender", "sender_token", "seq", "acked", "clock", "push_op", "time")
#: what a client's reply carries besides the acknowledgement: its arrays and header fields (a step's)
Answer = tuple[list[np.ndarray], dict[str, Any]]

class Acks:
    """What waits on answers from other servers: a client's push (``request``, answered
    to ``identity``) or a migration (``done(failed)`` runs once every copy answered)."""

    __slots__ = ("pending", "identity", "request", "done", "failed", "answer")

    def __init__(self, identity: bytes | None = None, request: Message | None = None,
                 done: Callable[[str | None], None] | None = None, answer: Answer | None = None) -> None:
        self.pending, self.identity, self.request, self.done = 0, identity, request, done
        self.answer = answer  # what the client's reply carries besides the acknowledgement (a step's)
        self.failed: str | None = None  # why a receiver refused (the client must retry)


class Peers:
    """The other servers of the ring, as this one talks to them.

    Args:
        finished: called with an ``Acks`` once all its answers are in.
    """

    def __init__(self, transport: Transport, poller: Poller, max_message_bytes: int,
                 finished: Callable[[Acks], None]) -> None:
        self.transport, self.poller, self.max_message_bytes = transport, poller, max_message_bytes
        self.finished = finished
        self.addresses: dict[int, str] = {}  # server id -> address
        self.socks: dict[int, Any] = {}
        self.awaiting: dict[int, tuple[int, Acks]] = {}  # request id -> (peer, what waits)
        self.deadlines: dict[int, float] = {}  # request id -> when it fails unanswered (the transport's clock)
        self.next_deadline = float("inf")  # the earliest of them (expire looks no further before it)
        self._next_request = 1
        self.me = -1  # this server's id, for the logs

    def __contains__(self, server: int) -> bool:
        return server in self.addresses

    def set_addresses(self, addresses: dict[int, str]) -> None:
        """The ring's servers now: a socket to one that left is closed once nothing awaits it."""
        self.addresses = addresses
        awaited = {peer for peer, _ in self.awaiting.values()}
        for gone in [p for p in self.socks if p not in addresses and p not in awaited]:
            self._close(gone)

    def ask(self, server: int, header: dict[str, Any], arrays: list[np.ndarray], acks: Acks) -> None:
        """Send a request to another server; ``acks`` hears when it answers (or dies)."""
        request_id, self._next_request = self._next_request, self._next_request + 1
        self.awaiting[request_id] = (server, acks)
        deadline = self.transport.now() + ANSWER_WITHIN_S + sum(a.nbytes for a in arrays) / SLOWEST_LINK_BPS
        self.deadlines[request_id] = deadline
        self.next_deadline = min(self.next_deadline, deadline)
        acks.pending += 1
        self._sock(server).send(encode({**header, "id": request_id}, arrays))

    def expire(self) -> None:
        """Fail what waits on a request unanswered past its deadline (the module's note)."""
        now = self.transport.now()
        if now < self.next_deadline:
            return
        for request_id, deadline in list(self.deadlines.items()):
            if deadline <= now:
                peer, acks = self.awaiting.pop(request_id)
                del self.deadlines[request_id]
                why = (f"server {peer} did not answer request {request_id} within "
                       f"{ANSWER_WITHIN_S:g} s and its size's time: the request or its answer was lost; retry")
                logger.warning("server %d: %s", self.me, why)
                self.acked(acks, why)
        self.next_deadline = min(self.deadlines.values(), default=float("inf"))

    def receive(self, ready: set[Any]) -> None:
        """Take the answers waiting on the sockets ``poll`` found ready."""
        for peer, sock in list(self.socks.items()):
            if sock in ready:
                self.handle(peer, sock)

    def handle(self, peer: int, sock: Any) -> None:
        for _ in range(256):
            frames = sock.try_recv()
            if frames is None:
                return
            try:
                msg = decode(frames, self.max_message_bytes)
            except ProtocolError as exc:
                logger.error("server %d: undecodable answer from server %d: %s", self.me, peer, exc)
                continue
            error = None
            if msg.op is Op.ERROR:
                error = f"server {peer} refused: {msg.header.get('error')}"
                logger.error("server %d: %s", self.me, error)
            entry = self.awaiting.pop(msg.id, None) if isinstance(msg.id, int) else None
            if entry is not None:
                self.deadlines.pop(msg.id, None)
                self.acked(entry[1], error)

    def acked(self, acks: Acks, error: str | None = None) -> None:
        acks.failed = acks.failed or error
        acks.pending -= 1
        if acks.pending <= 0:
            self.finished(acks)

    def forward(self, targets: np.ndarray, ring_version: int, table: str, msg: Message, keys: np.ndarray,
                grads: np.ndarray, vnodes: np.ndarray, counts: np.ndarray, identity: bytes,
                answer: Answer | None = None) -> bool:
        """Forward a push applied here to the servers that also hold its vnodes
        (``targets``: see ``forward_targets``); True if the client's acknowledgement now
        waits for theirs."""
        if vnodes.size == 0:
            return False
        header: dict[str, Any] = {"op": Op.REPLICATE.value, "table": table, "ring_version": ring_version,
                                  "from": self.me, **{k: msg.header[k] for k in FORWARDED if k in msg.header}}
        return self.scatter(targets, vnodes, counts, header, [keys, grads], Acks(identity, msg, answer=answer))

    def scatter(self, targets: np.ndarray, vnodes: np.ndarray, counts: np.ndarray, header: dict[str, Any],
                rows: list[np.ndarray], acks: Acks) -> bool:
        """Send ``header`` to every server ``targets`` names for some of ``vnodes``, with the
        ``rows`` arrays' rows of those vnodes' segments, then their vnodes and counts;
        ``acks`` hears every answer.  False if no server was named."""
        per_segment = targets[vnodes]
        servers = np.unique(per_segment[per_segment >= 0]).tolist()
        for server in servers:
            segs = (per_segment == server).any(axis=1)
            if segs.all():
                arrays = [*rows, vnodes, counts]
            else:
                mine = np.repeat(segs, counts)
                arrays = [*(a[mine] for a in rows), vnodes[segs], counts[segs]]
            self.ask(server, header, arrays, acks)
        return bool(servers)

    def lost(self, server: int) -> None:
        """``server`` died: nothing waits on it any more."""
        self.addresses.pop(server, None)
        self._close(server)
        for request_id, (peer, acks) in list(self.awaiting.items()):
            if peer == server:
                del self.awaiting[request_id]
                self.deadlines.pop(request_id, None)
                self.acked(acks)

    def drop(self, waiting: set[Acks]) -> None:
        """Stop waiting for the answers ``waiting`` awaits (their requests are void): a late
        answer is ignored, and one lost on a cut link is no longer waited for."""
        if waiting:
            for request_id in [r for r, (_, acks) in self.awaiting.items() if acks in waiting]:
                del self.awaiting[request_id]
                self.deadlines.pop(request_id, None)

    def close(self) -> None:
        for server in list(self.socks):
            self._close(server)

    def _sock(self, server: int) -> Any:
        sock = self.socks.get(server)
        if sock is None:
            sock = self.transport.connect(self.addresses[server], self.max_message_bytes)
            self.socks[server] = sock
            self.poller.register(sock)
        return sock

    def _close(self, server: int) -> None:
        sock = self.socks.pop(server, None)
        if sock is not None:
            self.poller.unregister(sock)
            sock.close()


def forward_targets(ring: Ring, tables: Mapping[str, VnodeStore], moving: dict[str, dict[int, set[int]]],
                    skip: set[int]) -> dict[str, np.ndarray]:
    """Per table, ``int32[n_vnodes, k]``: the servers a push to each vnode is forwarded to
    (its backups, and whoever the vnode is being copied to), -1 where none; ``skip`` (the
    dead, and this server) never are.  Tables that forward nothing are left out."""
    targets = {}
    for name, table in tables.items():
        columns = [ring.chains[:, j] for j in range(1, table.spec.replicas)]
        copies = moving.get(name, {})
        for k in range(max((len(d) for d in copies.values()), default=0)):
            col = np.full(ring.n_vnodes, -1, np.int32)
            for v, dests in copies.items():
                if k < len(dests):
                    col[v] = sorted(dests)[k]
            columns.append(col)
        if columns:
            t = np.column_stack(columns).astype(np.int32)
            t[np.isin(t, list(skip))] = -1
            if (t >= 0).any():
                targets[name] = t
    return targets
