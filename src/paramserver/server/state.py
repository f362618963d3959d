"""A server's whole state as one object (``ServerState``), and the port its handlers
send on (``Port``).

The server is a loop over explicit state: ``ServerNode`` (``server/node.py``) reads a
message, picks its handler by op, and the handler (the data plane in ``server/data.py``
and ``server/clocks.py``, a copy received in ``server/install.py``, the control plane in
``server/control.py``, the rest in ``server/admin.py`` and ``server/copies.py``) reads
and changes this state and sends what it must through the port.  Nothing of a server
that a handler may change lives anywhere else, so what one request can touch is what is
written here, and a test can build a server's state without its sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from paramserver.config import Config
from paramserver.consistency.buffers import ClockBuffers
from paramserver.consistency.clock import StalenessGate
from paramserver.filters.base import KeyStore
from paramserver.routing.ring import Ring
from paramserver.server.dedup import Dedup
from paramserver.server.lease import Lease
from paramserver.server.peers import Peers, forward_targets
from paramserver.store.protocol import VnodeStore
from paramserver.tables.namespaces import Quota
from paramserver.tables.spec import TableSpec
from paramserver.wire.security import NodeTokens


class Port(Protocol):
    """What a handler sends on: answers to clients (and to peers' requests, on the
    server's ROUTER), messages to the scheduler (on the control DEALER), and requests to
    the other servers (``peers``).  Handlers log on their own module's logger."""

    @property
    def peers(self) -> Peers: ...

    def answer(self, frames: list[Any], identity: bytes) -> None:
        """Send ``frames`` to the ROUTER peer ``identity`` (a client, a server)."""

    def tell_scheduler(self, frames: list[Any]) -> None:
        """Send ``frames`` to the scheduler."""


@dataclass
class LastWrites:
    """A table's last push (its writer and the version it made) and the last of another
    writer's before it: enough to say, for any writer, the last version someone else made,
    in constant room however many clients ever pushed."""

    writer: int = -1
    version: int = 0
    before: int = 0  # the last version a writer other than ``writer`` made

    def wrote(self, writer: int, version: int) -> None:
        if writer != self.writer or writer < 0:
            self.before = self.version
        self.writer, self.version = writer, version

    def foreign(self, writer: object) -> int:
        """The last version a writer other than ``writer`` made (-1, no one client, is
        another to everyone)."""
        return self.before if writer == self.writer and self.writer >= 0 else self.version


@dataclass(eq=False)
class ServerState:
    """Everything a server's handlers read and change.

    Args:
        config: the server's settings.
        clock: the transport's clock (a simulated one in tests).
        tokens: with a secret, the node tokens that prove ids (``wire/security.py``).
        lease: clients are served only under it (``server/lease.py``).
        threads: threads a request's vnode segments are applied by; ``pool`` runs them.
    """

    config: Config
    clock: Callable[[], float]
    tokens: NodeTokens | None
    lease: Lease
    threads: int
    pool: ThreadPoolExecutor | None
    node_id: int = -1
    ring: Ring | None = None
    tables: dict[str, VnodeStore] = field(default_factory=dict)
    early_tables: dict[str, TableSpec] = field(default_factory=dict)  # created before the first ring
    dedup: dict[str, Dedup] = field(default_factory=dict)  # table -> exactly-once record
    primary: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # per vnode: this server is its primary
    dead: set[int] = field(default_factory=set)  # servers declared dead
    installs: dict[str, dict[int, int]] = field(default_factory=dict)  # table -> vnode copied here -> sender's ring
    targets: dict[str, np.ndarray] = field(default_factory=dict)  # table -> int32[n_vnodes, k]: forward to
    moving: dict[str, dict[int, set[int]]] = field(default_factory=dict)  # table -> vnode -> servers copied to
    gate: StalenessGate = field(default_factory=StalenessGate)  # live workers' vector clock, parked pulls
    buffers: ClockBuffers = field(default_factory=ClockBuffers)  # BSP: pushes of unfinished clocks
    quotas: dict[str, Quota] = field(default_factory=dict)  # namespace -> its quota (the scheduler says)
    key_store: KeyStore = field(default_factory=KeyStore)  # key lists sent whole, by signature (keycache filter)
    filter_bytes: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (table, filter): reply bytes in, out
    writes: dict[str, LastWrites] = field(default_factory=dict)  # table -> who pushed last, and who before

    def ring_version(self) -> int:
        """The version of the ring this server holds (0 before its first)."""
        return self.ring.version if self.ring else 0

    def counted(self, table: VnodeStore, writer: int, pushes: int = 1) -> None:
        """``pushes`` of ``writer``'s (-1: no one client's, a BSP clock's sum) moved ``table``'s
        version (a row cache's bound, ``VnodeStore.version``), as they applied."""
        if pushes:
            table.version += pushes
            last = self.writes.get(table.spec.name)
            if last is None:  # once a table (``setdefault`` would make one every push)
                last = self.writes[table.spec.name] = LastWrites()
            last.wrote(writer, table.version)

    def foreign(self, table: VnodeStore, writer: object) -> int:
        """The last of ``table``'s versions that a push not ``writer``'s made (0: none yet): a
        row cache whose rows came at or after it holds no other writer's step it missed."""
        last = self.writes.get(table.spec.name)
        return last.foreign(writer) if last is not None else 0

    def refresh_targets(self) -> None:
        """Recompute where pushes are forwarded: the ring, the tables, the vnodes moving
        or the dead changed.  Before the first ring there is nothing to forward: a server
        started again hears of a death before its ring (the scheduler tells every server),
        and the ring's arrival computes them with the dead it knows by then."""
        if self.ring is None:
            return
        self.targets = forward_targets(self.ring, self.tables, self.moving, self.dead | {self.node_id})
