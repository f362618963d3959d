"""The ring and how it changes, one change at a time (``Membership``): a state machine
with no sockets and no clock of its own (the host's ``clock`` times migrations, its
``wall_time`` dates the losses and failovers).

Events come in as calls — a server registered (``server_joined``), died or left
(``server_lost``), confirmed its copies (``migrated``), was asked to leave (``remove``),
a hold was lifted (``next_change``) — and what must be said goes out through the
``MembershipHost`` (a command to one node, an answer to a requester, the ring to every
node), which the scheduler implements with its socket and a test with lists.

* A server dies: at once a ring where its backups are primaries (clients retry there),
  with chains refilled; then the primaries copy vnodes to their new backups (repair).
* A server joins, or is removed: the primaries copy what changes holder (and forward
  every later push to it), and once every copy is acknowledged the ring flips.
* Copies a failed or abandoned migration left unconfirmed are redone (repair), from a
  complete live holder.
* A fenced server beats again (``server_returned``): it may have missed the ring, a
  ``MIGRATE``, copies or their answers on a cut link; it gets the ring again, and a
  migration it takes part in is abandoned and planned again.
* Joins and removals wait while vnodes move, and while the host holds them (a restore).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Collection
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from paramserver.errors import Code, ConfigError
from paramserver.routing.ring import Ring, plan_moves
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Op, encode, error_reply

logger = logging.getLogger("paramserver.scheduler.node")  # one log for the scheduler

Requester = tuple[bytes, Any]  # (identity, request id) to answer when a change is done


@dataclass
class NodeInfo:
    id: int
    role: str
    identity: bytes
    address: str
    last_seen: float
    rank: int = -1
    metrics: str = ""  # its /metrics URL (--metrics-port), or ""
    process: str = ""  # who its process is (wire/liveness.py), or ""
    regained: int = 0  # a server's leases regained, as its last beat said (``Lease.regained``)
    pid: int = 0  # its process id, as it registered (0: not given); a launcher waits for its joiner by it


@dataclass
class Migration:
    """Vnode copies in progress, from their primaries (``waiting``) to new holders."""

    id: int
    target: Ring
    waiting: set[int]
    flip: bool  # flip to ``target`` once done (join, removal); a repair flipped first
    moves: dict[int, list[tuple[str, int, int]]] = field(default_factory=dict)  # source -> copies
    leaving: int | None = None  # a removed server, stopped after the flip
    requester: Requester | None = None
    started: float = 0.0  # the scheduler's clock


class MembershipHost(Protocol):
    """What ``Membership`` needs from the scheduler."""

    nodes: dict[int, NodeInfo]  # the live nodes
    tables: dict[str, TableSpec]

    def clock(self) -> float: ...
    def wall_time(self) -> float: ...  # when, for people: the ``at`` of losses and failovers
    def notify(self, node_id: int, header: dict[str, Any]) -> None: ...
    def answer(self, identity: bytes, frames: list[Any]) -> None: ...
    def ring_changed(self, everyone: bool) -> None: ...  # the new ring to the servers (or to every node)
    def ring_formed(self) -> None: ...  # the first ring (or the first after every server died)
    def joining(self, node_id: int) -> None: ...  # a server's join starts: what it must know first
    def retire(self, node_id: int) -> None: ...  # a removed server, off the ring: stop it, forget it
    def holding(self) -> bool: ...  # joins and removals must wait (a restore runs)
    def between_changes(self) -> None: ...  # no vnode moves now: what waited for that may start
    def migration_over(self) -> None: ...  # vnodes stopped moving: what waited may run
    def resync(self, node_id: int) -> None: ...  # the ring again, to a server that may have missed it


class Membership:
    """The ring, the migration under way, the changes queued, and what was lost."""

    def __init__(self, host: MembershipHost, vnodes_per_server: int, servers: int) -> None:
        self.host = host
        self.vnodes_per_server, self.servers = vnodes_per_server, servers  # the first ring's
        self.ring: Ring | None = None
        self.migration: Migration | None = None
        self.changes: deque[tuple[str, int, Requester | None]] = deque()  # joins, removals
        self.incomplete: set[tuple[str, int, int]] = set()  # (table, vnode, server) copies unconfirmed
        # what servers' deaths cost, for job_status: data lost, and failovers
        self.losses: list[dict[str, Any]] = []
        self.failovers: list[dict[str, Any]] = []
        self.moves = 0  # migrations started (a restore loads again if one ran meanwhile)
        self._ring_lost = False  # every server died: the next one to register starts a ring
        self._next_version = 1  # a ring formed after every server died continues the versions
        self._failed_migrations = 0
        self._migration_ids = 0

    # ---- what the scheduler asks -------------------------------------------------------
    @property
    def settled(self) -> bool:
        """A ring, nothing moving or queued, every copy confirmed."""
        return self.ring is not None and self.migration is None and not self.changes and not self.incomplete

    def heading(self) -> set[int]:
        """The servers the ring will have once the queued and running changes are done."""
        servers = set(self.ring.servers) if self.ring is not None else set()
        if self.migration is not None:
            servers |= set(self.migration.target.servers)
            if self.migration.leaving is not None:
                servers.discard(self.migration.leaving)
        for kind, node_id, _ in self.changes:
            if kind == "join":
                servers.add(node_id)
            else:
                servers.discard(node_id)
        if self.ring is None:  # every server died: the registered ones start the next ring
            servers = {n.id for n in self.host.nodes.values() if n.role == "server"}
        return {s for s in servers if s in self.host.nodes}

    def _live_servers(self) -> list[int]:
        return sorted(n.id for n in self.host.nodes.values() if n.role == "server")

    def _replicas(self) -> dict[str, int]:
        return {name: spec.replicas for name, spec in self.host.tables.items()}

    # ---- events ------------------------------------------------------------------------
    def server_joined(self, node_id: int) -> None:
        """A server registered: a live join (its share of vnodes is copied, then the ring
        flips), or the first ring once the expected servers are here."""
        if self.ring is not None:
            self.changes.append(("join", node_id, None))
            self.next_change()
        elif self._ring_lost or len(self._live_servers()) == self.servers:
            self._form_ring(self._next_version)

    def remove(self, node_id: int, requester: Requester) -> None:
        """Take a server out of the ring: its vnodes are copied away, the ring flips, then
        it is stopped; ``requester`` is answered when done."""
        if self.ring is None or node_id not in self.ring.servers:
            raise ConfigError(f"server {node_id} is not on the ring (servers: "
                              f"{self.ring.servers if self.ring else []})")
        leaving = sum(1 for c in self.changes if c[0] == "remove") + (
            1 if self.migration is not None and self.migration.leaving is not None else 0)
        if len(self.ring.servers) - leaving <= 1:
            raise ConfigError("cannot remove the last server of the ring (removals already queued: "
                              f"{leaving})")
        self.changes.append(("remove", node_id, requester))
        self.next_change()

    def next_change(self) -> None:
        """Start the next queued join or removal, unless vnodes are being copied or the
        host holds changes; else redo unconfirmed copies."""
        if self.migration is None:
            self.host.between_changes()
        while self.migration is None and self.changes and self.ring is not None and not self.host.holding():
            kind, node_id, requester = self.changes.popleft()
            try:
                self._change(kind, node_id, requester)
            except Exception as exc:
                logger.exception("%s of server %d failed", kind, node_id)
                self.migration = None
                if requester:
                    self.host.answer(requester[0], error_reply(requester[1], Code.CONFIG,
                                                               f"{kind} of server {node_id} failed: {exc}"))
        if self.migration is None and not self.changes and self.incomplete and self.ring is not None:
            self._repair()

    def migrated(self, node_id: int | None, migration: Any, failed: Any) -> None:
        """A source confirmed its copies of ``migration`` (or a receiver refused one)."""
        if self.migration is None or migration != self.migration.id or node_id is None:
            return  # a migration abandoned since (a server died)
        assert self.ring is not None, "a migration starts from a ring"
        if failed:  # a receiver refused a copy: do not flip onto it
            m, self.migration = self.migration, None
            logger.error("migration %d failed (%s); the ring stays at ring version %d", m.id, failed,
                         self.ring.version)
            self._failed_migrations += 1
            if m.requester is not None:
                self.host.answer(m.requester[0],
                                 error_reply(m.requester[1], Code.SERVER, f"migration failed: {failed}"))
            self._purge_incomplete()
            self.host.migration_over()
            return
        for table, vnode, dest in self.migration.moves.get(node_id, []):
            self.incomplete.discard((table, vnode, dest))
        self.migration.waiting.discard(node_id)
        if not self.migration.waiting:
            self._finish_migration()

    def server_lost(self, node_id: int) -> None:
        """Failover: the dead server's backups become primaries at once; chains are
        refilled and the primaries copy to their new backups (repair) afterwards."""
        m = self.migration
        if m is not None:  # its plan is void: start again from the new ring
            logger.warning("migration %d abandoned: server %d is gone", m.id, node_id)
            self._abandon(m, gone=node_id)
        if self.ring is None or node_id not in self.ring.servers:
            self._purge_incomplete()
            self.next_change()
            return
        old = self.ring
        if len(old.servers) == 1:
            logger.error("the last server of the ring died: every table's data is lost (restore a checkpoint); "
                         "the next server to register starts a new ring")
            self.losses.append({"server": node_id, "tables": sorted(self._replicas()), "vnodes": old.n_vnodes,
                                "vnode_ids": list(range(old.n_vnodes)), "at": self.host.wall_time(),
                                "every_server": True})
            self.ring, self._ring_lost, self._next_version = None, True, old.version + 1
            self.incomplete.clear()
            self.changes = deque(c for c in self.changes if c[0] != "join")  # joiners form the new ring
            if self._live_servers():
                self._form_ring(old.version + 1)
            return
        promoted = Ring(old.without_server(node_id).refilled().chains, old.version + 1)  # one flip, one version
        logger.warning("failover: server %d's vnodes promoted to their backups, ring version %d",
                       node_id, promoted.version)
        self._record_losses(old, node_id)
        self.failovers.append({"server": node_id, "ring_version": promoted.version,
                               "vnodes": int((old.owners == node_id).sum()), "at": self.host.wall_time(),
                               "tables_kept": sorted(n for n, r in self._replicas().items() if r > 1)})
        moves = self._plan(promoted, dead={node_id})  # planned from the ring whose holders have the data
        self.ring = promoted
        self.host.ring_changed(everyone=True)
        self.incomplete = {c for c in self.incomplete if c[2] != node_id}
        self._start_migration(self.ring, moves, flip=False)

    def server_returned(self, node_id: int) -> None:
        """A server silent past the heartbeat timeout, fenced rather than declared dead
        (``detector.py``), beats again.  What went to it or came from it meanwhile may be
        gone (a cut link drops it): a ring, a ``MIGRATE``, vnode copies, their answers.
        Waiting on them would wait forever, with the ring naming holders that never got
        their copy.  So it is sent the ring again, and a migration it takes part in is
        abandoned and planned again: its unconfirmed copies are still in ``incomplete``,
        so the next change or repair redoes them from a complete holder.  Even as a
        source that confirmed, or a receiver whose copies all were: the ring sent again
        ends its forwarding of pushes to new holders (``on_ring``), and forwards lost on
        the cut link are not sent again either."""
        self.host.resync(node_id)
        m = self.migration
        if m is None or not (node_id in m.moves or any(dest == node_id for todo in m.moves.values()
                                                       for _, _, dest in todo)):
            return
        logger.warning("migration %d abandoned: server %d was cut off, so its copies or their answers may be "
                       "lost; planned again", m.id, node_id)
        self._abandon(m, gone=None)
        self.next_change()

    def _abandon(self, m: Migration, gone: int | None) -> None:
        """Drop migration ``m`` unfinished (``gone``: a server that died meanwhile): the
        join or removal it made is queued again; its copies stay unconfirmed."""
        self.migration = None
        if m.leaving is not None and m.leaving != gone:
            self.changes.appendleft(("remove", m.leaving, m.requester))
        elif m.leaving is not None and m.requester is not None:
            self.host.answer(m.requester[0], encode({"op": Op.OK.value, "id": m.requester[1]}))
        joining = [n for n in m.target.servers if self.ring is not None and n not in self.ring.servers]
        for n in joining:
            if n != gone:
                self.changes.appendleft(("join", n, None))

    # ---- the changes -------------------------------------------------------------------
    def _form_ring(self, version: int) -> None:
        servers = self._live_servers()
        self.ring = Ring.create(servers, self.vnodes_per_server, version)
        logger.info("ring formed: ring version %d, %d vnodes over servers %s",
                    self.ring.version, self.ring.n_vnodes, servers)
        everyone, self._ring_lost = self._ring_lost, False  # after a loss, clients route with it too
        self.host.ring_changed(everyone=everyone)
        self.host.ring_formed()

    def _change(self, kind: str, node_id: int, requester: Requester | None) -> None:
        assert self.ring is not None
        node = self.host.nodes.get(node_id)
        if node is None or node.role != "server":
            if requester:
                self.host.answer(requester[0], error_reply(requester[1], Code.CONFIG, f"server {node_id} is gone"))
            return
        if kind == "remove" and (node_id not in self.ring.servers or len(self.ring.servers) <= 1):
            raise ConfigError(f"server {node_id} is not one of several servers on the ring {self.ring.servers}")
        if kind == "join":
            self.host.joining(node_id)
            target = self.ring.with_server(node_id)
            self._start_migration(target, self._plan(target), flip=True)
        else:
            target = Ring(self.ring.without_server(node_id).refilled().chains, self.ring.version + 1)
            self._start_migration(target, self._plan(target), flip=True, leaving=node_id, requester=requester)

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

    def _plan(self, target: Ring, dead: AbstractSet[int] = frozenset()) -> list[tuple[int, str, int, int]]:
        """Copies from the current ring to ``target``: unconfirmed copies are redone, and
        servers that are gone hold nothing."""
        assert self.ring is not None
        lost = {s for s in self.ring.servers if s not in self.host.nodes} | set(dead)
        return plan_moves(self.ring, target, self._replicas(), lost=lost, incomplete=self.incomplete)

    def _start_migration(self, target: Ring, moves: list[tuple[int, str, int, int]], flip: bool,
                         leaving: int | None = None, requester: Requester | None = None) -> None:
        self._migration_ids += 1
        self.moves += 1
        by_source: dict[int, list[tuple[str, int, int]]] = {}
        for source, table, vnode, dest in moves:
            if source in self.host.nodes:
                by_source.setdefault(source, []).append((table, vnode, dest))
                self.incomplete.add((table, vnode, dest))  # until its source confirms it
                if (table, vnode, source) in self.incomplete:  # no complete copy is left: this one rules
                    logger.error("vnode %d of table %r lost updates: no complete copy survived; "
                                 "server %d's is copied to the others", vnode, table, source)
                    self.incomplete.discard((table, vnode, source))
        self.migration = Migration(self._migration_ids, target, set(by_source), flip, moves=by_source,
                                   leaving=leaving, requester=requester, started=self.host.clock())
        logger.info("migration %d: %d vnode copies from %d server(s) toward ring version %d",
                    self._migration_ids, len(moves), len(by_source), target.version)
        for source, todo in by_source.items():
            self.host.notify(source, {"op": Op.MIGRATE.value, "migration": self._migration_ids,
                                      "moves": [list(m) for m in todo]})
        if not by_source:
            self._finish_migration()

    def _purge_incomplete(self) -> None:
        """Forget unconfirmed copies to servers that no longer hold (or are) anything."""
        if self.ring is None:
            self.incomplete.clear()
            return
        reps = self._replicas()
        self.incomplete = {(t, v, s) for t, v, s in self.incomplete
                           if s in self.host.nodes and t in reps and s in self.ring.chains[v, :reps[t]]}

    def _finish_migration(self) -> None:
        m, self.migration = self.migration, None
        assert m is not None and self.ring is not None
        logger.info("migration %d done in %.2f s", m.id, self.host.clock() - m.started)
        self._failed_migrations = 0
        if m.flip:
            self.ring = m.target
            self.host.ring_changed(everyone=True)
            logger.info("ring flipped to ring version %d over servers %s", self.ring.version, self.ring.servers)
        if m.leaving is not None and m.leaving in self.host.nodes:
            self.host.retire(m.leaving)
        if m.requester is not None:
            self.host.answer(m.requester[0], encode({"op": Op.OK.value, "id": m.requester[1],
                                                     "ring_version": self.ring.version}))
        self._purge_incomplete()
        self.host.migration_over()

    def last_copies(self, server: int, ring: Ring | None = None, gone: Collection[int] = ()) -> dict[str, list[int]]:
        """Per table, the vnodes of which ``server`` holds the last complete copy on a live
        server (``replicas=1``, or every other replica died or is still being copied): what
        declaring it dead would lose.  ``gone``: servers to count as dead already (those the
        detector declares dead in the same turn, before the ring shows it)."""
        ring = self.ring if ring is None else ring
        by_table: dict[str, list[int]] = {}
        if ring is None:
            return by_table
        for name, r in sorted(self._replicas().items()):
            chains = ring.chains[:, :r]
            for v in np.flatnonzero((chains == server).any(axis=1)).tolist():
                if not any(s >= 0 and s != server and s not in gone and s in self.host.nodes
                           and (name, v, s) not in self.incomplete for s in chains[v].tolist()):
                    by_table.setdefault(name, []).append(v)
        return by_table

    def _record_losses(self, old: Ring, dead: int) -> None:
        """The vnodes ``dead`` held of which no complete copy is left on a live server
        (``replicas=1``, or every other replica died, or was still being copied, before
        the repair): their keys restart from initial values.  Logged and kept in
        ``losses`` (``job_status``), per table."""
        by_table = self.last_copies(dead, old)
        replicas = self._replicas()
        for name, vnodes in by_table.items():
            if replicas[name] == 1:
                logger.error("table %r has no backup (replicas=1): its %d vnode(s) on server %d restart from "
                             "their initial values; restore a checkpoint, or use replicas=2", name, len(vnodes), dead)
            else:
                logger.error("table %r: server %d held the last complete copy of %d vnode(s) (the other replicas "
                             "died, or were still being copied, before the repair): they restart from their "
                             "initial values; restore a checkpoint, or use more replicas", name, dead, len(vnodes))
        if by_table:
            ids = sorted({v for vnodes in by_table.values() for v in vnodes})
            self.losses.append({"server": dead, "tables": sorted(by_table), "vnodes": len(ids), "vnode_ids": ids,
                                "by_table": by_table, "at": self.host.wall_time()})
