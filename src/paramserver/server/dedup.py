"""Exactly-once pushes: which (sender, sequence) a server has applied, per vnode.

A client numbers its pushes (``seq``, one per ``push`` call, kept by its retries) and
sends with each one ``acked``: every seq up to it was acknowledged, so it will never be
sent again.  A server remembers, per table and sender, the vnodes each seq newer than
``acked`` was applied to; a retried push (after a failover or a ring change, maybe
routed differently) is applied only to the vnodes it has not reached yet.  Backups keep
the same record from the pushes forwarded to them, and a vnode's record travels with it
when it moves, so a retry that lands on a promoted backup is recognised too.

Memory: one ``bool[n_vnodes]`` per push in flight per sender, and a small record per
sender.  A sender's record goes when it leaves or dies (the scheduler says so), and when
it has been idle longer than ``horizon_s`` (twice the clients' retry timeout: no retry
can come later), so senders that never come back cost nothing.  A sender may have at most
``MAX_UNACKED`` pushes newer than its ``acked`` on record (a client has a few in flight; a
peer that numbers pushes upwards and never acknowledges would grow the record without
end): past it a new one is refused.  Sans-IO, vectorised over a request's vnode segments.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from paramserver.errors import ProtocolError

EXPIRE_EVERY = 1024  # look for idle senders each time this many more have come
MAX_UNACKED = 1 << 16  # pushes of one sender newer than its acked, on record at most


class _Sender:
    __slots__ = ("acked", "seen", "last")

    def __init__(self, now: float) -> None:
        self.acked = -1
        self.seen: dict[int, np.ndarray] = {}  # seq -> bool[n_vnodes]: applied there
        self.last = now  # when it last pushed


class Dedup:
    """Applied pushes of every sender, for one table on one server."""

    def __init__(self, n_vnodes: int, horizon_s: float = 120.0, clock: Callable[[], float] = time.monotonic):
        self.n_vnodes = n_vnodes
        self.clock = clock
        self.horizon_s = horizon_s
        self.senders: dict[int, _Sender] = {}
        self._expire_at = EXPIRE_EVERY

    def forget(self, sender: int) -> None:
        """``sender`` left or died: it never retries."""
        self.senders.pop(sender, None)

    def expire(self, now: float) -> int:
        """Forget the senders idle for longer than ``horizon_s``; return how many."""
        idle = [k for k, s in self.senders.items() if now - s.last > self.horizon_s]
        for k in idle:
            del self.senders[k]
        return len(idle)

    def _sender(self, sender: int, acked: int) -> _Sender:
        s = self.senders.get(sender)
        now = self.clock()
        if s is None:
            if len(self.senders) >= self._expire_at:  # many senders: drop the ones gone quiet
                self.expire(now)
                self._expire_at = len(self.senders) + EXPIRE_EVERY
            s = self.senders[sender] = _Sender(now)
        s.last = now
        if acked > s.acked:  # forget what the sender will never send again
            s.acked = acked
            for seq in [q for q in s.seen if q <= acked]:
                del s.seen[seq]
        return s

    def fresh(self, sender: int, seq: int, acked: int, vnodes: np.ndarray) -> np.ndarray:
        """``bool[len(vnodes)]``: True for the segments push ``seq`` has not been applied to."""
        s = self._sender(sender, acked)
        if seq <= s.acked:  # acknowledged long ago: a duplicate of something applied
            return np.zeros(vnodes.shape[0], bool)
        done = s.seen.get(seq)
        if done is None and len(s.seen) >= MAX_UNACKED:
            raise ProtocolError(f"push {seq} of sender {sender}: {len(s.seen)} of its pushes newer than its acked "
                                f"({s.acked}) are on record already, the most a sender may have in flight is "
                                f"{MAX_UNACKED}: a client sends acked = the last seq all before which were answered")
        return np.ones(vnodes.shape[0], bool) if done is None else ~done[vnodes]

    def unseen(self, sender: int, acked: int, first: int, n: int) -> bool:
        """Whether pushes ``first`` to ``first + n - 1`` of ``sender`` are all newer than its
        ``acked`` and on no record yet (applied to no vnode): a step's batches taken whole
        (``DataPlane.unapplied``); one that is on record goes the way ``fresh`` sorts it."""
        s = self._sender(sender, acked)
        if first <= s.acked:
            return False
        seen = s.seen
        return not any(q in seen for q in range(first, first + n))

    def room(self, sender: int) -> int:
        """How many more pushes of ``sender`` newer than its acked may go on record."""
        s = self.senders.get(sender)
        return MAX_UNACKED - (len(s.seen) if s is not None else 0)

    def mark(self, sender: int, seq: int, vnodes: np.ndarray) -> None:
        """Record push ``seq`` as applied to ``vnodes``."""
        self.mark_many(sender, seq, [vnodes])

    def mark_many(self, sender: int, first: int, vnodes: list[np.ndarray]) -> None:
        """Record pushes ``first``, ``first + 1``, ... as applied to ``vnodes[0]``, ``vnodes[1]``, ..."""
        seen = self._sender(sender, -1).seen
        for k, where in enumerate(vnodes):
            done = seen.get(first + k)
            if done is None:
                done = seen[first + k] = np.zeros(self.n_vnodes, bool)
            done[where] = True

    # ---- a vnode's record travels with it ------------------------------------------
    def export(self, vnode: int) -> list[list[Any]]:
        """``[[sender, acked, [seqs applied to vnode]], ...]`` (plain data, for the wire)."""
        return [[sender, s.acked, [q for q, done in s.seen.items() if done[vnode]]]
                for sender, s in self.senders.items()]

    def merge(self, vnode: int, record: list[list[Any]]) -> None:
        for sender, acked, seqs in record:
            s = self._sender(int(sender), int(acked))
            for seq in seqs:
                if int(seq) > s.acked:
                    self.mark(int(sender), int(seq), np.array([vnode]))
