"""How the scheduler changes the ring, one change at a time (``RingChanges``, a part of
``SchedulerNode`` kept in its own file).

* A server dies: at once a ring where its backups are primaries (clients retry there),
  with chains refilled; then the primaries copy vnodes to their new backups (repair).
* A server joins, or is removed: the primaries copy what changes holder (and forward
  every later push to it), and once every copy is acknowledged the ring flips.
* Copies a failed or abandoned migration left unconfirmed are redone (repair), from a
  complete live holder.

Table commands that arrive while vnodes move wait (``deferred``) for the flip.  This is
still written against the scheduler's state and sockets; issue 13 makes it a state
machine of its own.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paramserver.errors import ConfigError, ParamServerError
from paramserver.routing.ring import Ring, plan_moves
from paramserver.scheduler.restores import Restores
from paramserver.spec import TableSpec
from paramserver.wire.message import Message, Op, encode, error_reply
from paramserver.wire.message import field as hfield

logger = logging.getLogger("paramserver.scheduler.node")  # one log for the scheduler


@dataclass
class NodeInfo:
    id: int
    role: str
    identity: bytes
    address: str
    last_seen: float
    rank: int = -1


@dataclass
class Migration:
    """Vnode copies in progress, from their primaries (``waiting``) to new holders."""

    id: int
    target: Ring
    waiting: set[int]
    flip: bool  # flip to ``target`` once done (join, removal); a repair flipped first
    moves: dict[int, list[tuple[str, int, int]]] = field(default_factory=dict)  # source -> copies
    leaving: int | None = None  # a removed server, stopped after the flip
    requester: tuple[bytes, Any] | None = None
    started: float = 0.0  # the scheduler's clock


class RingChanges:
    """Joins, removals, failovers and repairs of the ring."""

    # the scheduler's state and helpers this part uses (SchedulerNode defines them)
    sock: Any
    clock: Callable[[], float]
    nodes: dict[int, NodeInfo]
    by_identity: dict[bytes, int]
    ring: Ring | None
    tables: dict[str, TableSpec]
    migration: Migration | None
    changes: deque[tuple[str, int, tuple[bytes, Any] | None]]
    deferred: list[tuple[bytes, Message]]
    incomplete: set[tuple[str, int, int]]
    losses: list[dict[str, Any]]
    failovers: list[dict[str, Any]]
    _announced: list[int] | None
    _failed_migrations: int
    _op_seq: int
    _ring_lost: bool
    _next_version: int
    restores: Restores
    ring_moves: int
    _notify: Callable[[NodeInfo, dict[str, Any]], None]
    _cluster_view: Callable[[], dict[str, Any]]
    _remove: Callable[[int, str], None]
    _form_ring: Callable[[int], None]
    _handle_message: Callable[[bytes, Message], None]
    _serve_server_waiters: Callable[..., None]

    def _replicas(self) -> dict[str, int]:
        return {name: spec.replicas for name, spec in self.tables.items()}

    def _broadcast_view(self) -> None:
        """The ring and the servers' addresses, to every node (clients route with it)."""
        view = {"op": Op.RING.value, **self._cluster_view()}
        for node in self.nodes.values():
            self._notify(node, view)

    def _next_change(self) -> None:
        """Start a restore waiting for copies to finish, or else the next queued join or
        removal, unless vnodes are being copied (a restore holds joins and removals)."""
        self.restores.settled()
        while self.migration is None and self.changes and self.ring is not None and not self.restores.busy:
            kind, node_id, requester = self.changes.popleft()
            try:
                self._change(kind, node_id, requester)
            except Exception as exc:
                logger.exception("%s of server %d failed", kind, node_id)
                self.migration = None
                if requester:
                    self.sock.send(error_reply(requester[1], "config", f"{kind} of server {node_id} failed: {exc}"),
                         requester[0])
        if self.migration is None and not self.changes and self.incomplete and self.ring is not None:
            self._repair()

    def _repair(self) -> None:
        """Redo the copies an abandoned or failed migration left unconfirmed."""
        assert self.ring is not None
        self._purge_incomplete()
        if not self.incomplete:
            return
        if self._failed_migrations >= 3:
            logger.error("%d vnode copies stay unconfirmed after 3 failed migrations; fix the cause "
                         "(see the servers' logs) and add or remove a server to retry", len(self.incomplete))
            return
        moves = self._plan(self.ring)
        unsourced = self.incomplete - {(t, v, d) for _, t, v, d in moves}
        if unsourced:  # no complete live holder is left to copy from: that data is gone
            logger.error("%d vnode copies have no complete source left (data lost): %s",
                         len(unsourced), sorted(unsourced)[:8])
            self.incomplete -= unsourced
        if moves:
            self._start_migration(self.ring, moves, flip=False)

    def _change(self, kind: str, node_id: int, requester: tuple[bytes, Any] | None) -> None:
        assert self.ring is not None
        node = self.nodes.get(node_id)
        if node is None or node.role != "server":
            if requester:
                self.sock.send(error_reply(requester[1], "config", f"server {node_id} is gone"), requester[0])
            return
        if kind == "remove" and (node_id not in self.ring.servers or len(self.ring.servers) <= 1):
            raise ConfigError(f"server {node_id} is not one of several servers on the ring {self.ring.servers}")
        if kind == "join":
            self._broadcast_view()  # every server learns the joiner's address, it the tables
            self._notify(node, {"op": Op.WORKERS.value, "workers": self._announced or []})
            target = self.ring.with_server(node_id)
            self._start_migration(target, self._plan(target), flip=True)
        else:
            target = Ring(self.ring.without_server(node_id).refilled().chains, self.ring.version + 1)
            self._start_migration(target, self._plan(target), flip=True, leaving=node_id, requester=requester)

    def _plan(self, target: Ring, dead: AbstractSet[int] = frozenset()) -> list[tuple[int, str, int, int]]:
        """Copies from the current ring to ``target``: unconfirmed copies are redone, and
        servers that are gone hold nothing."""
        assert self.ring is not None
        lost = {s for s in self.ring.servers if s not in self.nodes} | set(dead)
        return plan_moves(self.ring, target, self._replicas(), lost=lost, incomplete=self.incomplete)

    def _start_migration(self, target: Ring, moves: list[tuple[int, str, int, int]], flip: bool,
                         leaving: int | None = None, requester: tuple[bytes, Any] | None = None) -> None:
        self._op_seq += 1
        self.ring_moves += 1
        by_source: dict[int, list[tuple[str, int, int]]] = {}
        for source, table, vnode, dest in moves:
            if source in self.nodes:
                by_source.setdefault(source, []).append((table, vnode, dest))
                self.incomplete.add((table, vnode, dest))  # until its source confirms it
                if (table, vnode, source) in self.incomplete:  # no complete copy is left: this one rules
                    logger.error("vnode %d of table %r lost updates: no complete copy survived; "
                                 "server %d's is copied to the others", vnode, table, source)
                    self.incomplete.discard((table, vnode, source))
        self.migration = Migration(self._op_seq, target, set(by_source), flip, moves=by_source, leaving=leaving,
                                    requester=requester, started=self.clock())
        logger.info("migration %d: %d vnode copies from %d server(s) toward ring version %d",
                    self._op_seq, len(moves), len(by_source), target.version)
        for source, todo in by_source.items():
            self._notify(self.nodes[source], {"op": Op.MIGRATE.value, "migration": self._op_seq,
                                              "moves": [list(m) for m in todo]})
        if not by_source:
            self._finish_migration()

    def on_migrated(self, identity: bytes, msg: Message) -> None:
        node_id = self.by_identity.get(identity)
        if self.migration is None or msg.header.get("migration") != self.migration.id or node_id is None:
            return  # a migration abandoned since (a server died)
        failed = msg.header.get("failed")
        assert self.ring is not None, "a migration starts from a ring"
        if failed:  # a receiver refused a copy: do not flip onto it
            m, self.migration = self.migration, None
            logger.error("migration %d failed (%s); the ring stays at ring version %d", m.id, failed, self.ring.version)
            self._failed_migrations += 1
            if m.requester is not None:
                self.sock.send(error_reply(m.requester[1], "server", f"migration failed: {failed}"), m.requester[0])
            self._purge_incomplete()
            self._after_migration()
            return
        for table, vnode, dest in self.migration.moves.get(node_id, []):
            self.incomplete.discard((table, vnode, dest))
        self.migration.waiting.discard(node_id)
        if not self.migration.waiting:
            self._finish_migration()

    def _purge_incomplete(self) -> None:
        """Forget unconfirmed copies to servers that no longer hold (or are) anything."""
        if self.ring is None:
            self.incomplete.clear()
            return
        reps = self._replicas()
        self.incomplete = {(t, v, s) for t, v, s in self.incomplete
                           if s in self.nodes and t in reps and s in self.ring.chains[v, :reps[t]]}

    def _finish_migration(self) -> None:
        m, self.migration = self.migration, None
        assert m is not None and self.ring is not None
        logger.info("migration %d done in %.2f s", m.id, self.clock() - m.started)
        self._failed_migrations = 0
        if m.flip:
            self.ring = m.target
            self._broadcast_view()
            logger.info("ring flipped to ring version %d over servers %s", self.ring.version, self.ring.servers)
        if m.leaving is not None and m.leaving in self.nodes:
            self._notify(self.nodes[m.leaving], {"op": Op.STOP.value})
            self._remove(m.leaving, "removed")
        if m.requester is not None:
            self.sock.send(encode({"op": Op.OK.value, "id": m.requester[1], "ring_version": self.ring.version}),
                 m.requester[0])
        self._purge_incomplete()
        self._after_migration()

    def _after_migration(self) -> None:
        """Table commands that waited, then the next membership change."""
        deferred, self.deferred = self.deferred, []
        for identity, msg in deferred:
            if self.migration is not None:  # the next change started: wait again
                self.deferred.append((identity, msg))
                continue
            try:
                self._handle_message(identity, msg)
            except ParamServerError as exc:
                self.sock.send(error_reply(msg.id, "config", str(exc)), identity)
            except Exception as exc:
                logger.exception("deferred %s failed", msg.op.value)
                self.sock.send(error_reply(msg.id, "internal", f"{type(exc).__name__}: {exc}"), identity)
        self._next_change()
        self._serve_server_waiters()

    def _server_lost(self, node_id: int) -> None:
        """Failover: the dead server's backups become primaries at once; chains are
        refilled and the primaries copy to their new backups (repair) afterwards."""
        m = self.migration
        if m is not None:  # its plan is void: start again from the new ring
            self.migration = None
            logger.warning("migration %d abandoned: server %d is gone", m.id, node_id)
            if m.leaving is not None and m.leaving != node_id:
                self.changes.appendleft(("remove", m.leaving, m.requester))
            elif m.leaving is not None and m.requester is not None:
                self.sock.send(encode({"op": Op.OK.value, "id": m.requester[1]}), m.requester[0])
            joining = [n for n in m.target.servers if self.ring is not None and n not in self.ring.servers]
            for n in joining:
                if n != node_id:
                    self.changes.appendleft(("join", n, None))
        if self.ring is None or node_id not in self.ring.servers:
            self._purge_incomplete()
            self._next_change()
            return
        old = self.ring
        if len(old.servers) == 1:
            logger.error("the last server of the ring died: every table's data is lost (restore a checkpoint); "
                         "the next server to register starts a new ring")
            self.losses.append({"server": node_id, "tables": sorted(self._replicas()), "vnodes": old.n_vnodes,
                                "vnode_ids": list(range(old.n_vnodes)), "at": time.time(), "every_server": True})
            self.ring, self._ring_lost, self._next_version = None, True, old.version + 1
            self.incomplete.clear()
            self.changes = deque(c for c in self.changes if c[0] != "join")  # joiners form the new ring
            if any(n.role == "server" for n in self.nodes.values()):
                self._form_ring(old.version + 1)
            return
        self.ring = old.without_server(node_id).refilled()
        self.ring = Ring(self.ring.chains, old.version + 1)  # one flip, one ring version
        logger.warning("failover: server %d's vnodes promoted to their backups, ring version %d",
                       node_id, self.ring.version)
        lost = int((old.owners == node_id).sum())
        self._record_losses(old, node_id)
        self.failovers.append({"server": node_id, "ring_version": self.ring.version, "vnodes": lost, "at": time.time(),
                               "tables_kept": sorted(n for n, r in self._replicas().items() if r > 1)})
        self._broadcast_view()
        promoted, self.ring = self.ring, old  # plan from the ring whose holders have the data
        moves = self._plan(promoted, dead={node_id})
        self.ring = promoted
        self.incomplete = {c for c in self.incomplete if c[2] != node_id}
        self._start_migration(self.ring, moves, flip=False)

    def _record_losses(self, old: Ring, dead: int) -> None:
        """The vnodes ``dead`` held of which no complete copy is left on a live server
        (``replicas=1``, or every other replica died, or was still being copied, before
        the repair): their keys restart from initial values.  Logged and kept in
        ``losses`` (``job_status``), per table."""
        by_table: dict[str, list[int]] = {}
        for name, r in sorted(self._replicas().items()):
            chains = old.chains[:, :r]
            for v in np.flatnonzero((chains == dead).any(axis=1)).tolist():
                if not any(s >= 0 and s != dead and s in self.nodes and (name, v, s) not in self.incomplete
                           for s in chains[v].tolist()):
                    by_table.setdefault(name, []).append(v)
        for name, vnodes in by_table.items():
            if self._replicas()[name] == 1:
                logger.error("table %r has no backup (replicas=1): its %d vnode(s) on server %d restart from "
                             "their initial values; restore a checkpoint, or use replicas=2", name, len(vnodes), dead)
            else:
                logger.error("table %r: server %d held the last complete copy of %d vnode(s) (the other replicas "
                             "died, or were still being copied, before the repair): they restart from their "
                             "initial values; restore a checkpoint, or use more replicas", name, dead, len(vnodes))
        if by_table:
            ids = sorted({v for vnodes in by_table.values() for v in vnodes})
            self.losses.append({"server": dead, "tables": sorted(by_table), "vnodes": len(ids), "vnode_ids": ids,
                                "by_table": by_table, "at": time.time()})

    def on_remove_server(self, identity: bytes, msg: Message) -> None:
        """Take a server out of the ring: its vnodes are copied away, the ring flips,
        then it is stopped; answered when done."""
        node_id = hfield(msg, "node_id", int)
        if self.ring is None or node_id not in self.ring.servers:
            raise ConfigError(f"server {node_id} is not on the ring (servers: "
                              f"{self.ring.servers if self.ring else []})")
        leaving = sum(1 for c in self.changes if c[0] == "remove") + (
            1 if self.migration is not None and self.migration.leaving is not None else 0)
        if len(self.ring.servers) - leaving <= 1:
            raise ConfigError("cannot remove the last server of the ring (removals already queued: "
                              f"{leaving})")
        self.changes.append(("remove", node_id, (identity, msg.id)))
        self._next_change()
