"""The client's calls on its tables' key lifecycle (``paramserver.lifecycle``): the time
its pushes carry (``set_time``), and delta exports (``export_delta``), on the client's
``Caller`` (``LifeCalls``); ``Client`` calls them.

A delta token is text, ``"<ring version>:<server>=<epoch>@<origin>,..."``: the epoch each
server starts its next delta from, and which run of the table's epochs it counts in.  The
ring is part of it: after a server died, joined or left, the vnodes have other primaries,
whose epochs do not continue these, so such a token gets a full export (``Delta.base``
True) and a fresh token; so does a token from another run of a server's table (the
server was restarted or restored, or the token is another cluster's).  A token naming an
epoch its server never reached is refused (``ProtocolError``): it was altered, and a
delta from it would leave out changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from paramserver.errors import ConfigError
from paramserver.wire.message import Message, Op

if TYPE_CHECKING:
    from paramserver.client.caller import Caller
    from paramserver.tables.spec import TableSpec


@dataclass(frozen=True)
class Delta:
    """What changed in a table: ``keys`` and their ``values`` (set them), ``deleted``
    (keys evicted: drop them; apply before the sets), and the ``token`` to ask from next
    time.  ``base``: this is every key of the table, not a change (``since`` was None,
    or could not be honoured): replace what you hold by it."""

    keys: np.ndarray
    values: np.ndarray
    deleted: np.ndarray
    token: str
    base: bool


def parse_token(token: str) -> tuple[int, dict[int, int], dict[int, int]]:
    """A token's ring version, epochs and their origins by server (an older token, with
    none, gives none); ``ConfigError`` for text that is not one."""
    try:
        ring, _, rest = token.partition(":")
        epochs, origins = {}, {}
        for item in filter(None, rest.split(",")):
            server, _, value = item.partition("=")
            epoch, at, origin = value.partition("@")
            epochs[int(server)] = int(epoch)
            if at:
                origins[int(server)] = int(origin)
        if any(e < 0 for e in epochs.values()):
            raise ValueError("a negative epoch")
        return int(ring), epochs, origins
    except ValueError:
        raise ConfigError(f"{token!r} is not a delta token (one that export_delta returned, like "
                          "'3:1=5@81,2=5@93')") from None


def with_stats(spec: TableSpec, grads: np.ndarray, stats: Any) -> np.ndarray:
    """A push's rows as its table takes them: where its admission counts shows and clicks
    (``Lifecycle.stats``), those after the values (``stats``, ``[n, 2]``; None: one show
    and no click a key); elsewhere the values alone (``stats`` must then be None)."""
    if not spec.lifecycle.stats:
        if stats is not None:
            raise ConfigError(f"push to {spec.name!r}: stats (shows, clicks) are for a table whose admission "
                              f"counts them (lifecycle 'admit=score:...'); its lifecycle is {str(spec.lifecycle)!r}")
        return grads
    n = grads.shape[0]
    if stats is None:
        stats = np.column_stack([np.ones(n, np.float32), np.zeros(n, np.float32)])
    stats = np.asarray(stats, np.float32)
    if stats.shape != (n, 2) or not np.isfinite(stats).all() or (stats < 0).any():
        raise ConfigError(f"push to {spec.name!r}: stats must be finite shows and clicks >= 0 of shape ({n}, 2), "
                          f"got shape {stats.shape}")
    return np.hstack([grads, stats])


class LifeCalls:
    """Lifecycle calls of a client, on its ``caller``: the time its pushes carry
    (``Caller.time``) and delta exports."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    def set_time(self, time: float | None) -> None:
        """The time this client's pushes carry from now on (any unit, never going back:
        examples, seconds, your data's timestamps): a lifecycle's TTL and score count in
        it (``Lifecycle``).  None: pushes carry none (the server keeps its latest)."""
        if time is not None and (isinstance(time, bool) or not np.isfinite(float(time))):
            raise ConfigError(f"set_time takes a finite number or None, got {time!r}")
        self.caller.time = None if time is None else float(time)

    def export_delta(self, table: str, since: str | None = None, timeout_s: float | None = None) -> Delta:
        """The keys of ``table`` that changed since ``since`` (a token an earlier call
        returned; None: every key), their values, and the keys evicted since.  Each
        server answers as of the moment it is asked; call it at a clock boundary, or
        with the workers paused, for one cut of the whole table.  The table needs a
        lifecycle (``"track"`` at least)."""
        c = self.caller
        c.losses.check()
        spec = c.spec(table)
        if not spec.lifecycle:
            raise ConfigError(f"table {table!r} tracks no changes: create it with lifecycle='track' (or any "
                              "admission or eviction) to export deltas")
        ring = c.state.ring()
        epochs: dict[int, int] = {}
        origins: dict[int, int] = {}
        base = since is None
        if since is not None:
            version, epochs, origins = parse_token(since)
            base = version != ring.version or set(epochs) != set(c.state.view.servers)
        replies = self._ask_each(table, {} if base else epochs, origins, timeout_s)
        moved = any(m.header.get("ring_version") != ring.version for m in replies.values())
        if not base and (moved or not all(m.header.get("whole") for m in replies.values())):
            replies = self._ask_each(table, {}, {}, timeout_s)
            base = True
        parts = [m.arrays for m in replies.values()]
        keys = np.concatenate([a[0] for a in parts]) if parts else np.zeros(0, np.uint64)
        values = np.concatenate([a[1] for a in parts]) if parts else np.zeros((0, spec.dim), np.float32)
        deleted = np.zeros(0, np.uint64) if base else np.setdiff1d(np.concatenate([a[2] for a in parts]), keys)
        token = f"{ring.version}:" + ",".join(f"{s}={int(m.header['epoch'])}@{int(m.header.get('origin', 0))}"
                                              for s, m in sorted(replies.items()))
        return Delta(keys, values, deleted, token, base)

    def _ask_each(self, table: str, since: dict[int, int], origins: dict[int, int],
                  timeout_s: float | None) -> dict[int, Message]:
        """Every server's delta of ``table`` from its epoch in ``since`` (0: all its keys),
        counted in the run ``origins`` names (none: an older token's, unchecked)."""
        rpc = self.caller.rpc
        futures = {s: rpc.request(address, {"op": Op.EXPORT.value, "table": table, "since": since.get(s, 0)}
                                  | ({"origin": origins[s]} if s in origins else {}))
                   for s, address in self.caller.state.view.servers.items()}
        return {s: f.result(timeout=timeout_s) for s, f in futures.items()}
