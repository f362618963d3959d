"""The cluster's tables and namespaces as the scheduler keeps them (``Catalog``): which
tables exist with which spec, each namespace's quota, and the commands that change them
(``CREATE_TABLE``, ``DROP_TABLE``, ``TABLE_INFO``, ``CREATE_NAMESPACE``, ``DROP_NAMESPACE``).

The scheduler's list is the one clients route with (it goes out with every ring); the
servers hold the data, so a change is made on every server (a fan-out through the
``CatalogHost``) and answered once they all did it.  A table command that comes while
vnodes move waits (``deferred``) until the migration is over: the plan of the copies
under way does not know the new table, nor that a dropped one is gone.  Quotas are set
here and enforced by the servers.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

from paramserver.errors import Code, ConfigError, ParamServerError
from paramserver.routing.ring import Ring
from paramserver.scheduler.fanout import FanOut
from paramserver.tables.namespaces import Quota, check_name, namespace_of
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message, Op, encode, error_reply, reply
from paramserver.wire.message import field as hfield

logger = logging.getLogger("paramserver.scheduler.node")  # one log for the scheduler


class CatalogHost(Protocol):
    """What ``Catalog`` needs of the scheduler."""

    sock: Any  # the scheduler's ROUTER: answers go to a node by its identity

    @property
    def ring(self) -> Ring | None: ...
    @property
    def moving(self) -> bool: ...  # vnodes are being copied: table commands wait

    def fan_out(self, header: dict[str, Any], on_done: Callable[[FanOut], None],
                timeout_s: float = math.inf, servers: list[int] | None = None) -> int: ...
    def dispatch(self, identity: bytes, msg: Message) -> None: ...  # a deferred command, handled as if it came now


class Catalog:
    """The tables, the namespaces' quotas, and the table commands waiting for a migration."""

    def __init__(self, host: CatalogHost) -> None:
        self.host = host
        self.tables: dict[str, TableSpec] = {}
        self.quotas: dict[str, Quota] = {}  # namespace -> its quota (servers enforce them)
        self.deferred: list[tuple[bytes, Message]] = []  # table commands waiting for a migration

    def view(self) -> dict[str, Any]:
        """The tables and the namespaces' quotas, as a ring's message carries them."""
        return {"tables": {name: spec.to_wire() for name, spec in self.tables.items()},
                "namespaces": {name: q.to_wire() for name, q in self.quotas.items()}}

    # ---- tables ------------------------------------------------------------------------
    def create_table(self, identity: bytes, msg: Message) -> None:
        if self.host.moving:  # vnodes are moving: the plan does not know this table
            self.deferred.append((identity, msg))
            return
        spec = TableSpec.from_wire(msg.header.get("spec"))
        old = self.tables.get(spec.name)
        if old is not None:
            if msg.header.get("fresh"):  # a job's driver on a running cluster: its model starts from nothing
                raise ConfigError(f"table {spec.name!r} exists on this cluster already (an earlier job's, or "
                                  "another's): a job makes its tables new.  Drop it first (paramserver cluster "
                                  f"drop-table {spec.name} --scheduler ADDRESS), or give this job a cluster of its own")
            if old != spec:
                raise ConfigError(f"table {spec.name!r} exists with a different spec "
                                  f"({old.to_wire()}); drop it first or use another name")
            self.host.sock.send(reply(msg, spec=spec.to_wire()), identity)
            return
        ring = self.host.ring
        if ring is None:
            raise ConfigError("the ring is not formed yet: wait for all servers to register")
        if spec.replicas > len(ring.servers):
            raise ConfigError(f"table {spec.name!r}: replicas={spec.replicas} needs at least {spec.replicas} "
                              f"servers, the ring has {len(ring.servers)}; add servers or lower replicas")
        self.tables[spec.name] = spec
        logger.info("table %r created: %s", spec.name, spec.to_wire())

        def failed() -> None:  # a server could not create it (memory for a dense table): un-list it everywhere
            if self.tables.get(spec.name) == spec:
                del self.tables[spec.name]
                logger.warning("table %r could not be created on every server: dropped again", spec.name)
                self.host.fan_out({"op": Op.DROP_TABLE.value, "name": spec.name}, lambda op: None)

        self._on_every_server(identity, msg, {"op": Op.CREATE_TABLE.value, "spec": spec.to_wire()}, failed)

    def drop_table(self, identity: bytes, msg: Message) -> None:
        if self.host.moving:
            self.deferred.append((identity, msg))
            return
        name = hfield(msg, "name", str)
        if self.tables.pop(name, None) is None:
            raise ConfigError(f"no table {name!r} to drop (tables: {sorted(self.tables)})")
        logger.info("table %r dropped", name)
        self._on_every_server(identity, msg, {"op": Op.DROP_TABLE.value, "name": name})

    def table_info(self, identity: bytes, msg: Message) -> None:
        self.host.sock.send(reply(msg, tables={n: s.to_wire() for n, s in self.tables.items()}), identity)

    # ---- namespaces --------------------------------------------------------------------
    def create_namespace(self, identity: bytes, msg: Message) -> None:
        """Set (or change, or with no limits lift) a namespace's quota on every server."""
        name, quota = check_name(msg.header.get("name")), Quota.from_wire(msg.header.get("quota"))
        if quota.unlimited:
            self.quotas.pop(name, None)
        else:
            self.quotas[name] = quota
        logger.info("namespace %r: quota %s", name, quota.to_wire())
        self._on_every_server(identity, msg, {"op": Op.NAMESPACE.value, "name": name, "quota": quota.to_wire()})

    def drop_namespace(self, identity: bytes, msg: Message) -> None:
        """Drop every table of a namespace, and its quota; other namespaces are untouched."""
        if self.host.moving:
            self.deferred.append((identity, msg))
            return
        name = check_name(msg.header.get("name"))
        dropped = sorted(t for t in self.tables if namespace_of(t) == name)
        for table in dropped:
            del self.tables[table]
        self.quotas.pop(name, None)
        logger.info("namespace %r dropped: tables %s", name, dropped)
        left = {"n": len(dropped) + 1}

        def one(op: FanOut) -> None:
            left["n"] -= 1
            if left["n"] == 0:
                self.host.sock.send(reply(msg, tables=dropped), identity)

        for table in dropped:
            self.host.fan_out({"op": Op.DROP_TABLE.value, "name": table}, one)
        self.host.fan_out({"op": Op.NAMESPACE.value, "name": name, "quota": None}, one)

    # ---- how a command reaches the servers ---------------------------------------------
    def _on_every_server(self, identity: bytes, msg: Message, header: dict[str, Any],
                         on_error: Callable[[], None] | None = None) -> None:
        """Send ``header`` to every server; answer ``msg`` once all did it, or with the first
        error (after ``on_error``)."""
        def answer(op: FanOut) -> None:
            if op.errors:
                if on_error is not None:
                    on_error()
                self.host.sock.send(error_reply(msg.id, Code.SERVER, str(next(iter(op.errors.values())))), identity)
            else:
                self.host.sock.send(encode({"op": Op.OK.value, "id": msg.id}), identity)

        self.host.fan_out(header, answer)

    def migration_over(self) -> None:
        """Vnodes stopped moving: the table commands that waited run now, in order (until the
        next change starts: then the rest wait again)."""
        deferred, self.deferred = self.deferred, []
        for identity, msg in deferred:
            if self.host.moving:  # the next change started: wait again
                self.deferred.append((identity, msg))
                continue
            try:
                self.host.dispatch(identity, msg)
            except ParamServerError as exc:
                self.host.sock.send(error_reply(msg.id, Code.CONFIG, str(exc)), identity)
            except Exception as exc:
                logger.exception("deferred %s failed", msg.op.value)
                self.host.sock.send(error_reply(msg.id, Code.INTERNAL, f"{type(exc).__name__}: {exc}"), identity)
