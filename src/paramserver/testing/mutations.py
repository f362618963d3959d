"""Mutations: one safety mechanism switched off for a chaos run, to prove that the
campaign notices (``paramserver chaos --mutate NAME``).  Each patches the class or
module that holds the mechanism, and ``mutated`` puts it back afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np


def _patch(obj: Any, name: str, value: Any) -> Callable[[], None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    return lambda: setattr(obj, name, old)


def _patches(obj: Any, **values: Any) -> Callable[[], None]:
    """Several of ``obj``'s names patched; undone together."""
    undo = [_patch(obj, name, value) for name, value in values.items()]

    def undo_all() -> None:
        for u in reversed(undo):
            u()

    return undo_all


def _no_dedup() -> Callable[[], None]:
    from paramserver.server.dedup import Dedup
    return _patch(Dedup, "fresh", lambda self, sender, seq, acked, vnodes: np.ones(vnodes.shape[0], bool))


def _ack_before_backups() -> Callable[[], None]:
    from paramserver.server.peers import Peers
    forward = Peers.forward

    def eager(self: Any, *args: Any) -> bool:
        forward(self, *args)
        return False  # the client is answered now, whatever the backups do

    return _patch(Peers, "forward", eager)


def _ignore_ring_version() -> Callable[[], None]:
    from paramserver.server import requests
    check = requests.check_segments
    return _patch(requests, "check_segments",
                  lambda table, ring, keys, vnodes, counts, primary_of, node_id, ring_version:
                  check(table, ring, keys, vnodes, counts, None, node_id, ring_version))


def _no_staleness_gate() -> Callable[[], None]:
    from paramserver.consistency.clock import StalenessGate
    return _patch(StalenessGate, "ready", lambda self, clock, staleness: True)


def _forwards_wait_forever() -> Callable[[], None]:
    from paramserver.server.peers import Peers
    return _patch(Peers, "expire", lambda self: None)


def _no_lease() -> Callable[[], None]:
    from paramserver.server.lease import Lease
    return _patch(Lease, "valid", lambda self: True)


def _restore_unheld() -> Callable[[], None]:
    """Restore as clients once did: each server loads once, whatever the ring does."""
    from paramserver.scheduler.restores import Restore, Restores
    loaded, settled = Restores._loaded, Restores.settled

    def once(self: Restores, op: Any) -> None:
        op.lost = set()  # a load interrupted by a ring change counts as done
        if self.current is not None and self.host.ring is not None:
            self.current.ring_version, self.current.moves = self.host.ring.version, self.host.ring_moves
        loaded(self, op)

    def eager(self: Restores) -> None:
        if self.current is None and self.queue:
            r: Restore = self.queue.pop(0)
            self.current, r.waiting = r, False
            r.ring_version, r.moves = (self.host.ring.version if self.host.ring else 0), self.host.ring_moves
            self.host.fan_out(r.header, self._loaded, servers=list(self.host.ring.servers) if self.host.ring else [])
        elif self.current is not None and self.current.waiting:
            settled(self)

    undo = [_patch(Restores, "_loaded", once), _patch(Restores, "settled", eager),
            _patch(Restores, "busy", property(lambda self: False))]

    def undo_all() -> None:
        for u in reversed(undo):
            u()

    return undo_all


def _write_off_last_copy() -> Callable[[], None]:
    """Declare a silent server dead at the heartbeat timeout even when it holds the last
    complete copy of some vnodes (as before the detector fenced such servers)."""
    from paramserver.scheduler.detector import Detector
    return _patch(Detector, "_wait_for", lambda self, node, now, dead, quiet: False)


def _accept_stale_forwards() -> Callable[[], None]:
    """Apply a forward from a server declared dead, or for a vnode this server is now the
    primary of (as before the nemesis found a dead primary's late forward counted twice)."""
    import paramserver.server.data as data
    return _patch(data, "check_forwarder", lambda state, msg, vnodes: None)


def _trust_silent_copies() -> Callable[[], None]:
    """Count on the copies of a server that has missed its heartbeats, so that one paused past
    the timeout is written off for backups held by a server killed a moment later (nor wait
    for the backups to beat once its deadline passed, which would catch it too)."""
    from paramserver.scheduler.detector import Detector
    return _patches(Detector, SUSPECT_BEATS=1e9, _unconfirmed=lambda self, node, dead: False)


def _count_unconfirmed_copies() -> Callable[[], None]:
    """Write off a silent server at its deadline for copies on servers not heard from since,
    so that one killed a moment before the deadline (two beats not yet missed) is counted on
    (as before the nemesis's seed 801)."""
    from paramserver.scheduler.detector import Detector
    return _patch(Detector, "_unconfirmed", lambda self, node, dead: False)


def _dead_together() -> Callable[[], None]:
    """Judge each silent server alone, not counting those declared dead in the same turn (as
    before the nemesis found a scheduler cut off from every server losing every table)."""
    from paramserver.scheduler.detector import Detector
    alone = Detector._wait_for
    return _patches(Detector, _wait_for=lambda self, node, now, dead, quiet: alone(self, node, now, [], []),
                    _unconfirmed=lambda self, node, dead: False)


def _rejoin_at_the_minimum() -> Callable[[], None]:
    """A worker back from idle joins the vector clock at the members' minimum, or 0 with
    none left, below the clock it had ticked (as before issue 28.3)."""
    import math

    from paramserver.consistency.clock import VectorClock

    def join(self: VectorClock, worker: int, low: int | None = None) -> int:
        if worker not in self.clocks:
            m = self.min()
            self.clocks[worker] = 0 if math.isinf(m) else int(m)
        return self.clocks[worker]

    return _patch(VectorClock, "join", join)


def _client_retry_fresh_seq() -> Callable[[], None]:
    """The client's core numbers a resent piece of a push as a new push, instead of
    keeping its ``seq``: a server that applied it before cannot tell."""
    from paramserver.client import core
    request = core.request

    def renumbered(kind: Any, header: dict[str, Any], piece: Any, tries: int, sequencer: Any, wire: Any = None) -> Any:
        if tries and "seq" in header:
            header = {**header, "seq": sequencer.take()}
        return request(kind, header, piece, tries, sequencer, wire)

    return _patch(core, "request", renumbered)


def _client_forgets_in_flight() -> Callable[[], None]:
    """The client's acked watermark counts every push numbered so far as answered,
    forgetting the ones still in flight: servers drop their record of those."""
    from paramserver.client.core import Sequencer
    return _patch(Sequencer, "acked", lambda self: self.seq)


def _client_ignores_cache_miss() -> Callable[[], None]:
    """The client takes a server's "key list not held" for an answer, as ps-lite's key
    cache once crashed on it: the push it refused is acknowledged and never applied."""
    from paramserver.client import core
    from paramserver.errors import KeyCacheMissError
    from paramserver.wire.message import Op
    decide = core.decide

    def trusting(piece: Any, tries: int, msg: Any, exc: Any, **kw: Any) -> Any:
        if msg is not None and msg.op is Op.ERROR and msg.header.get("code") == "key_cache_miss":
            return core.Decision(core.Verdict.DONE)
        if isinstance(exc, KeyCacheMissError):
            return core.Decision(core.Verdict.DONE)
        return decide(piece, tries, msg, exc, **kw)

    return _patch(core, "decide", trusting)


def _evict_on_primary_only() -> Callable[[], None]:
    """A lifecycle's primary evicts and tells no copy: the copies keep the keys (and after
    a failover the old values come back)."""
    from paramserver.server.data import DataPlane
    return _patch(DataPlane, "_forward_evicted", lambda self, table, evicted: None)


def _cache_reads_past_bound() -> Callable[[], None]:
    """A worker's row cache reads and checks its hits against ``s + 3`` versions, not ``s``."""
    from paramserver.client.row_cache import RowCache
    read, stale = RowCache.read, RowCache.stale

    def loose(method: Callable[..., Any]) -> Callable[..., Any]:
        def with_more(self: RowCache, *args: Any) -> Any:
            self.s += 3
            try:
                return method(self, *args)
            finally:
                self.s -= 3
        return with_more

    undo = [_patch(RowCache, "read", loose(read)), _patch(RowCache, "stale", loose(stale))]

    def undo_all() -> None:
        for u in reversed(undo):
            u()

    return undo_all


#: name -> (what it switches off, how)
MUTATIONS: dict[str, tuple[str, Callable[[], Callable[[], None]]]] = {
    "no-dedup": ("skip the retry dedup: a resent push is applied again", _no_dedup),
    "ack-before-backups": ("acknowledge a push before its backups applied it", _ack_before_backups),
    "ignore-ring-version": ("serve requests routed with a stale ring (no ring-version/primary check)",
                            _ignore_ring_version),
    "no-staleness-gate": ("answer pulls without the staleness gate", _no_staleness_gate),
    "no-lease": ("serve without a lease from the scheduler", _no_lease),
    "forwards-wait-forever": ("a server waits for ever on a forward or copy lost between two live servers (no "
                              "deadline)", _forwards_wait_forever),
    "restore-unheld": ("restore a table without holding ring changes or loading again after one", _restore_unheld),
    "rejoin-at-the-minimum": ("a worker back from idle rejoins the vector clock below the clock it ticked",
                              _rejoin_at_the_minimum),
    "write-off-last-copy": ("declare a silent server dead on time even when it holds the last complete copy of "
                            "some vnodes", _write_off_last_copy),
    "dead-together": ("declare servers silent in the same turn dead each for having its backups on the others",
                      _dead_together),
    "accept-stale-forwards": ("apply a forward from a server declared dead, or for a vnode this server is now "
                              "the primary of", _accept_stale_forwards),
    "trust-silent-copies": ("count on a silent server's copies when judging another silent one",
                            _trust_silent_copies),
    "count-unconfirmed-copies": ("write off a silent server at its deadline for copies on servers not heard from "
                                 "since", _count_unconfirmed_copies),
    "client-retry-fresh-seq": ("the client resends a push's piece under a new seq instead of its own",
                               _client_retry_fresh_seq),
    "client-forgets-in-flight": ("the client's acked watermark counts the pushes still in flight as answered",
                                 _client_forgets_in_flight),
    "client-ignores-cache-miss": ("the client takes a server's key-cache miss for an answer (a push with filters "
                                  "is acknowledged unapplied)", _client_ignores_cache_miss),
    "evict-on-primary-only": ("a table's primary evicts keys without telling the other copies",
                              _evict_on_primary_only),
    "cache-reads-past-bound": ("a worker's row cache reads rows up to s + 3 versions old, not s",
                               _cache_reads_past_bound),
}


@contextlib.contextmanager
def mutated(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    if name not in MUTATIONS:
        from paramserver.errors import ConfigError
        raise ConfigError(f"unknown mutation {name!r}; known: {', '.join(MUTATIONS)}")
    undo = MUTATIONS[name][1]()
    try:
        yield
    finally:
        undo()


