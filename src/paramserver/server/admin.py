"""A server's requests beyond pull and push: export, checkpoint, restore, stats (and the
metrics they sample), server-side functions, and the namespaces' quotas it enforces.

``Admin``'s handlers work on the server's state (``server/state.py``) like the data
plane's (``server/data.py``), off its hot path; the quotas live in the state, where a
push is checked against them (``check_quota``) and a ring notification sets them all
(``quotas_of``)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from paramserver.checkpoint.store import confine
from paramserver.errors import ProtocolError, QuotaError
from paramserver.observe.metrics import ServerMetrics
from paramserver.server import storage
from paramserver.server.requests import checked_table
from paramserver.server.state import Port, ServerState
from paramserver.store.protocol import VnodeStore
from paramserver.tables import functions
from paramserver.tables.namespaces import Quota, namespace_of
from paramserver.wire.message import KEY_TYPES, Message, expect, field, reply


class Admin:
    """The handlers of ``EXPORT``, ``CHECKPOINT``, ``RESTORE``, ``STATS``, ``CALL`` and
    ``NAMESPACE`` on ``state``; the scheduler is answered through ``port``.  ``metrics``:
    the server's request counters, which ``STATS`` samples with the ``figures``."""

    def __init__(self, state: ServerState, port: Port) -> None:
        self.state, self.port = state, port
        self.metrics = ServerMetrics(self.figures)  # counted before each reply (metrics.py)

    # ---- export, checkpoint, restore, stats ----------------------------------------------
    def on_export(self, msg: Message) -> list[Any]:
        """Every key this server is primary of for a table, with its value (state left out)."""
        n = self.state
        if "since" in msg.header:  # a delta (``Client.export_delta``)
            arrays, fields = storage.export_delta(n.tables, n.primary, field(msg, "table", str), msg.header["since"],
                                                  n.config.max_message_bytes, n.node_id, msg.header.get("origin"))
            return reply(msg, arrays, ring_version=n.ring_version(), **fields)
        return reply(msg, list(storage.export_rows(n.tables, n.primary, field(msg, "table", str),
                                                   n.config.max_message_bytes, n.node_id)))

    def on_checkpoint(self, msg: Message) -> list[Any]:
        """Write every stored vnode (keys, values and optimiser state) under ``url`` (a
        client's, or during a job the scheduler's, answered on the control socket)."""
        n = self.state
        since = msg.header.get("since") or {}  # an incremental step: table -> server -> epoch
        if not isinstance(since, dict) or not all(isinstance(t, dict) for t in since.values()):
            raise ProtocolError(f"checkpoint: since must map tables to {{server: epoch}}, got {str(since)[:200]}")
        mine = {t: int(e[str(n.node_id)]) for t, e in since.items() if isinstance(e.get(str(n.node_id)), int)}
        written = storage.write_checkpoint(n.tables, n.primary, confine(field(msg, "url", str),
                                                                        n.config.checkpoint_root), mine, n.node_id)
        return reply(msg, **written, node_id=n.node_id, clocks={str(k): v for k, v in n.gate.vector.clocks.items()})

    def on_restore(self, msg: Message) -> list[Any]:
        """Load the keys this server holds (under the current ring) from checkpoint files."""
        n = self.state
        assert n.ring is not None
        deleted = msg.header.get("deleted")
        loaded = storage.restore_rows(n.tables, n.primary, n.ring, field(msg, "table", str),
                                      confine(field(msg, "step", str), n.config.checkpoint_root),
                                      field(msg, "entries", list), msg.header.get("allow_unverified") is True,
                                      deleted if isinstance(deleted, list) else None)
        return reply(msg, loaded=loaded)

    def figures(self) -> dict[str, Any]:
        """What the server holds now: its tables' sizes, memory and consistency figures."""
        n = self.state
        store = n.key_store
        return {"tables": storage.table_stats(n.tables, n.primary), "rss_bytes": storage.rss_bytes(),
                "consistency": n.gate.telemetry(),
                "filters": {"key_cache": {"lists": len(store.entries), "bytes": store.bytes, "hits": store.hits,
                                          "misses": store.misses},
                            "reply_bytes": {f"{t}/{f}": {"bytes_in": b, "bytes_out": a}
                                            for (t, f), (b, a) in n.filter_bytes.items()}}}

    def on_stats(self, msg: Message) -> list[Any]:
        n = self.state
        vector = n.gate.vector
        figures = self.figures()  # read once: the reply's figures and the metric families agree
        return reply(msg, node_id=n.node_id, pid=os.getpid(), **figures,
                     ring_version=n.ring.version if n.ring else 0,
                     clocks={str(k): v for k, v in vector.clocks.items()},
                     min_clock=vector.low(),  # with no member (all idle): where they come back
                     samples=self.metrics.wire(figures) if msg.header.get("samples") else None)

    # ---- server-side functions ------------------------------------------------------------
    def on_call(self, msg: Message) -> list[Any]:
        """A server-side function over the rows this server is primary of: of the keys
        sent (grouped by vnode, as a pull's), or of all its keys (``all``)."""
        n = self.state
        fn = functions.load_function(field(msg, "function", str))
        args = msg.header.get("args") or {}
        if not isinstance(args, dict):
            raise ProtocolError(f"call: args must be a dict, got {type(args).__name__}")
        keys, vnodes, counts = expect(msg, ("keys", KEY_TYPES, 1), ("vnodes", "<i4", 1), ("counts", "<i8", 1))
        table = checked_table(n, msg, keys.shape[0], vnodes, counts)
        if msg.header.get("all") is True:
            keys, values = storage.primary_rows(table, n.primary)
        else:
            values = np.empty((keys.shape[0], table.spec.dim), np.float32)
            table.lookup(vnodes, counts, keys, values)
            table.settle()  # a tiered table: rows read back from disk may put it over its budget
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
            self.state.quotas.pop(name, None)
        else:
            self.state.quotas[name] = quota
        self.port.tell_scheduler(reply(msg))


def quotas_of(wire: dict[str, Any]) -> dict[str, Quota]:
    """All the quotas, from the scheduler's view of the cluster (a ring notification)."""
    return {name: q for name, w in wire.items() if not (q := Quota.from_wire(w)).unlimited}


def check_quota(state: ServerState, table: VnodeStore, vnodes: np.ndarray, counts: np.ndarray,
                keys: np.ndarray) -> None:
    """Refuse, whole and before anything is applied, a push that would take this
    server's share of its namespace's quota past it (see ``namespaces.Quota.share``)."""
    name = namespace_of(table.spec.name)
    quota = state.quotas.get(name)
    if quota is None or state.ring is None:
        return
    new = table.missing(vnodes, counts, keys)
    if new == 0:
        return
    held = [(storage.primary_keys(t, state.primary), t.row_bytes) for t in state.tables.values()
            if namespace_of(t.spec.name) == name]
    used_keys = sum(k for k, _ in held)
    used_bytes = sum(k * b for k, b in held)
    fraction = float(state.primary.sum()) / state.ring.n_vnodes
    refusal = quota.refusal(fraction, used_keys, used_bytes, new, new * table.row_bytes)
    if refusal:
        raise QuotaError(f"namespace {name!r}: {refusal}; nothing of this push was applied: raise the quota "
                         f"(client.admin.create_namespace({name!r}, max_keys=..., max_bytes=...)), drop tables, or "
                         "use fewer keys")
