"""The control plane: what the scheduler tells a server on its control socket (a new
ring, tables created and dropped, a migration to start, a node lost), as handlers over
the server's state (``server/state.py``).

A ring says which vnodes this server holds and is primary of; everything derived from
it (the tables' vnodes, where pushes are forwarded, the peers' sockets) follows at
once, and the copies of a migration not sent yet are void.  A table created before
this server had its first ring (a joiner) waits in ``early_tables`` for it.  A server
lost is dead for good here: nothing waits on it any more (``Peers.lost``).
"""

from __future__ import annotations

import logging

from paramserver.routing.ring import Ring
from paramserver.server.admin import quotas_of
from paramserver.server.clocks import Clocks
from paramserver.server.copies import Copies
from paramserver.server.dedup import Dedup
from paramserver.server.install import check_moves
from paramserver.server.state import Port, ServerState
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message, Op, encode, field, reply

logger = logging.getLogger(__name__)


class ControlPlane:
    """The handlers of ``RING``, ``CREATE_TABLE``, ``DROP_TABLE``, ``MIGRATE``,
    ``NODE_LOST`` and ``ERROR`` on ``state``, answering the scheduler through ``port``;
    ``copies`` are this server's outgoing vnode copies, ``clocks`` its vector clock's
    handlers (a worker lost)."""

    def __init__(self, state: ServerState, port: Port, copies: Copies, clocks: Clocks) -> None:
        self.state, self.port, self.copies, self.clocks = state, port, copies, clocks

    def on_ring(self, msg: Message) -> None:
        """A new ring (first one, a failover, or a finished migration): hold exactly the
        vnodes it gives this server; copies in progress are over."""
        state = self.state
        ring = state.ring = Ring.from_wire(msg.header["ring"])
        peers = self.port.peers
        peers.me = state.node_id
        servers = {int(k): v for k, v in msg.header.get("servers", {}).items() if int(k) != state.node_id}
        for gone in [p for p in peers.addresses if p not in servers and p not in state.dead]:
            self.server_lost(gone)  # its NODE_LOST may have been lost on a cut link: the ring says it
        peers.set_addresses(servers)
        if "tables" in msg.header:  # the scheduler's catalog: a table missing was dropped (its DROP_TABLE lost?)
            for name in [n for n in state.tables if n not in msg.header["tables"]]:
                logger.warning("server %d: table %r is not in the ring's view: dropped (its drop was missed)",
                               state.node_id, name)
                self._drop(name)
        state.quotas = quotas_of(msg.header.get("namespaces") or {})
        for name, wire in msg.header.get("tables", {}).items():
            if name not in state.tables:
                self._add_table(TableSpec.from_wire(wire))
        for spec in state.early_tables.values():  # created before this server had a ring
            if spec.name not in state.tables:
                self._add_table(spec)
        state.early_tables.clear()
        for name, table in state.tables.items():
            # a copy made under this ring (or a newer one) is kept: its plan's flip is still to
            # come, and this ring may reach this server after the copy did (another path)
            copied = state.installs.get(name, {})
            for vnode in [v for v, e in copied.items() if e < ring.version]:
                del copied[vnode]
            table.set_vnodes([*ring.held_by(state.node_id, table.spec.replicas), *copied])
        state.primary = ring.owners == state.node_id
        self.copies.clear()  # a copy not sent yet belongs to a plan the flip made void
        state.refresh_targets()
        logger.info("server %d: ring version %d, primary of %d vnode(s)", state.node_id, ring.version,
                    int(state.primary.sum()))

    def _add_table(self, spec: TableSpec) -> None:
        state = self.state
        assert state.ring is not None
        state.tables[spec.name] = VnodeSet(spec, state.ring.n_vnodes, state.ring.held_by(state.node_id, spec.replicas),
                                           memory=state.config.table_memory, cold_dir=state.config.cold_dir)
        old = state.dedup.get(spec.name)  # kept from a table of this name dropped before: see on_drop_table
        if old is None or old.n_vnodes != state.ring.n_vnodes:
            state.dedup[spec.name] = Dedup(state.ring.n_vnodes, horizon_s=2 * state.config.retry_timeout_s,
                                           clock=state.clock)

    def on_create_table(self, msg: Message) -> None:
        state = self.state
        spec = TableSpec.from_wire(msg.header["spec"])
        if state.ring is None:  # a joiner still waiting for its first ring: keep it for then
            state.early_tables[spec.name] = spec
        elif spec.name not in state.tables:
            self._add_table(spec)
            state.refresh_targets()
        self.port.tell_scheduler(reply(msg))

    def on_drop_table(self, msg: Message) -> None:
        self._drop(field(msg, "name", str))
        self.port.tell_scheduler(reply(msg))

    def _drop(self, name: str) -> None:
        state = self.state
        state.tables.pop(name, None)
        state.early_tables.pop(name, None)
        state.writes.pop(name, None)
        # the exactly-once record stays: a push applied before the drop, and delivered
        # again after a table of the same name is created (a duplicate, a late retry),
        # must not be applied to the new table (chaos seed restore/256)
        state.buffers.drop(name)
        state.moving.pop(name, None)
        state.installs.pop(name, None)
        state.refresh_targets()

    def on_migrate(self, msg: Message) -> None:
        """Copy vnodes to the servers that will hold them after the next ring flip
        (``server/copies.py``); answered with ``MIGRATED`` once every copy is in."""
        migration = field(msg, "migration", int)
        moves = check_moves(msg.header.get("moves"))

        def done(failed: str | None) -> None:
            self.port.tell_scheduler(encode({"op": Op.MIGRATED.value, "migration": migration,
                                             "node_id": self.state.node_id, "failed": failed}))

        self.copies.plan(moves, done)
        logger.info("server %d: migration %d: %d vnode copies to send", self.state.node_id, migration, len(moves))

    def on_node_lost(self, msg: Message) -> None:
        role, node_id = msg.header.get("role"), int(msg.header["node_id"])
        if role == "server":
            self.server_lost(node_id)
            return
        for dedup in self.state.dedup.values():  # a client that left or died never retries
            dedup.forget(node_id)
        if role == "worker":
            self.clocks.worker_lost(node_id)

    def server_lost(self, server: int) -> None:
        """A server died: nothing waits on it any more (a push is acknowledged once every
        *live* backup applied it)."""
        self.state.dead.add(server)
        self.copies.lost(server)
        self.state.refresh_targets()
        self.port.peers.lost(server)

    def on_scheduler_error(self, msg: Message) -> None:
        logger.error("server %d: scheduler says: %s", self.state.node_id, msg.header.get("error"))
