"""Restoring a table from a checkpoint, coordinated by the scheduler (``Restores``).

Every server of the ring loads the keys it holds (as primary or backup) from the
checkpoint's files.  Done by a client alone, that raced the ring: a server that joined
meanwhile was sent a copy of a vnode taken before its source had loaded, and the
restored rows were lost without a word (the ``restore`` chaos scenario found it).  So
the scheduler runs it:

* it waits for vnode copies under way to finish, and holds joins and removals while it
  restores (they start once it is done);
* it sends ``restore`` to every server of the ring and waits for each answer;
* if the ring changed meanwhile (a server died, so a failover and a repair copied
  vnodes), it loads again once the copies are done: loading writes the same rows, so
  doing it twice is harmless, since nothing may push to a table being restored;
* it answers with the keys loaded by their primaries, which the client checks against
  the manifest.

No sockets: the scheduler's ``fan_out`` sends the commands and ``reply`` the answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from paramserver.errors import Code, ConfigError
from paramserver.routing.ring import Ring
from paramserver.scheduler.fanout import FanOut
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message, Op, error_reply, reply
from paramserver.wire.message import field as hfield

logger = logging.getLogger("paramserver.scheduler.node")


class Host(Protocol):
    """What of the scheduler a restore uses."""

    ring: Ring | None
    tables: dict[str, TableSpec]
    @property
    def ring_moves(self) -> int: ...

    @property
    def moving(self) -> bool: ...
    def fan_out(self, header: dict[str, Any], on_done: Any, timeout_s: float = ...,
                servers: list[int] | None = None) -> int: ...
    def answer(self, identity: bytes, frames: list[Any]) -> None: ...
    def restored(self) -> None: ...


@dataclass
class Restore:
    identity: bytes
    request: Message
    table: str
    header: dict[str, Any]  # the command sent to the servers
    ring_version: int = 0
    moves: int = 0
    rounds: int = 0
    waiting: bool = False  # for vnode copies to finish before (again) loading


class Restores:
    """The restores asked for, one at a time, in order."""

    MAX_ROUNDS = 10  # loads redone after ring changes; past it the restore fails

    def __init__(self, host: Host) -> None:
        self.host = host
        self.current: Restore | None = None
        self.queue: list[Restore] = []

    @property
    def busy(self) -> bool:
        return self.current is not None

    def request(self, identity: bytes, msg: Message) -> None:
        """A client's ``restore``: ``table``, ``step``, ``entries`` (the manifest's files),
        ``allow_unverified`` (first-format entries, without sha256, accepted)."""
        table = hfield(msg, "table", str)
        if table not in self.host.tables:
            raise ConfigError(f"unknown table {table!r}: create it before restoring it")
        header = {"op": Op.RESTORE.value, "table": table, "step": hfield(msg, "step", str),
                  "entries": hfield(msg, "entries", list)}
        if msg.header.get("allow_unverified") is True:  # first-format entries (no sha256): the client opted in
            header["allow_unverified"] = True
        if isinstance(msg.header.get("deleted"), list):  # an incremental step's evictions
            header["deleted"] = msg.header["deleted"]
        self.queue.append(Restore(identity, msg, table, header))
        self.settled()

    def settled(self) -> None:
        """Start (or redo) a restore if no vnode is moving; the scheduler calls it when
        copies finish."""
        if self.current is None and self.queue:
            self.current = self.queue.pop(0)
            self.current.waiting = True
        r = self.current
        if r is None or not r.waiting or self.host.moving or self.host.ring is None:
            return
        if r.table not in self.host.tables:
            self._finish(error_reply(r.request.id, Code.CONFIG, f"table {r.table!r} was dropped during its restore"))
            return
        r.waiting, r.rounds = False, r.rounds + 1
        r.ring_version, r.moves = self.host.ring.version, self.host.ring_moves
        self.host.fan_out(r.header, self._loaded, servers=list(self.host.ring.servers))

    def _loaded(self, op: FanOut) -> None:
        r = self.current
        if r is None:
            return
        if op.errors:
            server, error = sorted(op.errors.items())[0]
            self._finish(error_reply(r.request.id, Code.CONFIG, f"server {server} could not restore {r.table!r}: "
                                     f"{error}"))
            return
        ring = self.host.ring
        if op.lost or ring is None or ring.version != r.ring_version or self.host.ring_moves != r.moves:
            if r.rounds >= self.MAX_ROUNDS:
                self._finish(error_reply(r.request.id, Code.NODE_LOST, f"the ring changed during each of {r.rounds} "
                                         f"loads of {r.table!r}; restore it again once the cluster is stable"))
                return
            logger.info("restore of %r: the ring changed while it loaded; loading again once copies are done",
                        r.table)
            r.waiting = True
            self.settled()
            return
        loaded = sum(int(h.get("loaded", 0)) for h in op.replies.values())
        logger.info("table %r restored: %d key(s)", r.table, loaded)
        self._finish(reply(r.request, loaded=loaded))

    def _finish(self, frames: list[Any]) -> None:
        r = self.current
        assert r is not None
        self.current = None
        self.host.answer(r.identity, frames)
        self.host.restored()  # starts what it held, and the next restore
