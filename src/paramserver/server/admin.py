"""A server's requests beyond pull and push: export, checkpoint, restore, stats,
server-side functions, and the namespaces' quotas it enforces (``Admin``, a part of
``ServerNode`` kept in its own file; the hot path stays in ``node.py``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from paramserver.checkpoint.store import confine
from paramserver.errors import ProtocolError, QuotaError
from paramserver.server import storage
from paramserver.server.vnodes import VnodeSet
from paramserver.tables import functions
from paramserver.tables.namespaces import Quota, namespace_of
from paramserver.wire.message import Message, expect, field, reply

if TYPE_CHECKING:
    from paramserver.server.node import ServerNode


class Admin:
    def __init__(self, node: ServerNode) -> None:
        self.node = node
        self.quotas: dict[str, Quota] = {}  # namespace -> its quota (the scheduler says)

    # ---- export, checkpoint, restore, stats ----------------------------------------------
    def on_export(self, msg: Message) -> list[Any]:
        """Every key this server is primary of for a table, with its value (state left out)."""
        n = self.node
        return reply(msg, list(storage.export_rows(n.tables, n.primary, field(msg, "table", str),
                                                   n.config.max_message_bytes, n.node_id)))

    def on_checkpoint(self, msg: Message) -> list[Any]:
        """Write every stored vnode (keys, values and optimiser state) under ``url`` (a
        client's, or during a job the scheduler's, answered on the control socket)."""
        n = self.node
        files = storage.write_checkpoint(n.tables, n.primary, confine(field(msg, "url", str),
                                                                      n.config.checkpoint_root))
        return reply(msg, files=files, clocks={str(k): v for k, v in n.gate.vector.clocks.items()})

    def on_restore(self, msg: Message) -> list[Any]:
        """Load the keys this server holds (under the current ring) from checkpoint files."""
        n = self.node
        assert n.ring is not None
        loaded = storage.restore_rows(n.tables, n.primary, n.ring, field(msg, "table", str),
                                      confine(field(msg, "step", str), n.config.checkpoint_root),
                                      field(msg, "entries", list), msg.header.get("allow_unverified") is True)
        return reply(msg, loaded=loaded)

    def state(self) -> dict[str, Any]:
        """What the server holds now: its tables' sizes, memory and consistency figures."""
        n = self.node
        return {"tables": storage.table_stats(n.tables, n.primary), "rss_bytes": storage.rss_bytes(),
                "consistency": n.gate.telemetry()}

    def on_stats(self, msg: Message) -> list[Any]:
        n = self.node
        vector = n.gate.vector
        state = self.state()  # read once: the reply's figures and the metric families agree
        return reply(msg, node_id=n.node_id, pid=os.getpid(), **state,
                     ring_version=n.ring.version if n.ring else 0,
                     clocks={str(k): v for k, v in vector.clocks.items()},
                     min_clock=vector.low(),  # with no member (all idle): where they come back
                     samples=n.metrics.wire(state) if msg.header.get("samples") else None)

    # ---- server-side functions ------------------------------------------------------------
    def on_call(self, msg: Message) -> list[Any]:
        """A server-side function over the rows this server is primary of: of the keys
        sent (grouped by vnode, as a pull's), or of all its keys (``all``)."""
        n = self.node
        fn = functions.load_function(field(msg, "function", str))
        args = msg.header.get("args") or {}
        if not isinstance(args, dict):
            raise ProtocolError(f"call: args must be a dict, got {type(args).__name__}")
        keys, vnodes, counts = expect(msg, ("keys", "<u8", 1), ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        table = n._table(msg, keys.shape[0], vnodes, counts)
        if msg.header.get("all") is True:
            keys, values = storage.primary_rows(table, n.primary)
        else:
            values = np.empty((keys.shape[0], table.spec.dim), np.float32)
            table.lookup(vnodes, counts, keys, values)
        values.flags.writeable = False
        arrays = functions.run(fn, keys, values, args)
        return reply(msg, arrays, merge=fn.merge, ring_version=n.ring.version if n.ring else 0,
                     servers=sorted(int(s) for s in n.ring.servers) if n.ring else [])

    # ---- namespaces' quotas ----------------------------------------------------------------
    def on_namespace(self, msg: Message) -> None:
        """The scheduler sets (or, with no quota, lifts) a namespace's quota."""
        name = field(msg, "name", str)
        quota = Quota.from_wire(msg.header.get("quota"))
        if quota.unlimited:
            self.quotas.pop(name, None)
        else:
            self.quotas[name] = quota
        self.node.control.send(reply(msg))

    def set_quotas(self, wire: dict[str, Any]) -> None:
        """All the quotas, from the scheduler's view of the cluster (a ring notification)."""
        self.quotas = {name: q for name, w in wire.items() if not (q := Quota.from_wire(w)).unlimited}

    def check_quota(self, table: VnodeSet, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> None:
        """Refuse, whole and before anything is applied, a push that would take this
        server's share of its namespace's quota past it (see ``namespaces.Quota.share``)."""
        name = namespace_of(table.spec.name)
        quota = self.quotas.get(name)
        n = self.node
        if quota is None or n.ring is None:
            return
        new = table.missing(vnodes, counts, keys)
        if new == 0:
            return
        held = [(storage.primary_keys(t, n.primary), t.row_bytes) for t in n.tables.values()
                if namespace_of(t.spec.name) == name]
        used_keys = sum(k for k, _ in held)
        used_bytes = sum(k * b for k, b in held)
        fraction = float(n.primary.sum()) / n.ring.n_vnodes
        refusal = quota.refusal(fraction, used_keys, used_bytes, new, new * table.row_bytes)
        if refusal:
            raise QuotaError(f"namespace {name!r}: {refusal}; nothing of this push was applied: raise the quota "
                             f"(client.create_namespace({name!r}, max_keys=..., max_bytes=...)), drop tables, or "
                             "use fewer keys")
