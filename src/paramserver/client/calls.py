"""``Client.call``: a server-side function on every server, its results merged
(``paramserver.tables.functions``)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from paramserver.client.core import Piece
from paramserver.client.scatter import Scatter
from paramserver.errors import NodeLostError
from paramserver.tables import functions
from paramserver.wire.message import Message, Op

if TYPE_CHECKING:
    from paramserver.client.client import Client


def call(client: Client, table: str, function: str, keys: Any, args: dict[str, Any] | None) -> Future[Any]:
    """See ``Client.call``.  With keys, a scatter like a pull's (retried on a stale ring);
    without, one request to every server of the ring, tried again whole if the ring
    moved under it (the answers name the ring they were computed on)."""
    from paramserver.client.client import as_keys

    spec = client._spec(table)
    args = {str(k): (v.tolist() if isinstance(v, (np.ndarray, np.generic)) else v) for k, v in (args or {}).items()}
    header = {"function": str(function), "args": args}
    out: Future[Any] = Future()
    deadline = time.monotonic() + client.config.retry_timeout_s

    def attempt() -> None:
        parts: list[tuple[Message, list[np.ndarray]]] = []

        def on_piece(piece: Piece, msg: Message) -> None:
            parts.append((msg, list(msg.arrays)))

        if keys is not None:
            k = as_keys(keys)
            spec.check_keys(k)
            fut = client._scatter(Op.CALL, table, k, None, on_piece, extra_header=header)
        else:  # every server, over all its rows: one empty piece each
            ring = client._state.ring()
            empty = np.zeros(0, np.uint64)
            pieces = [Piece(s, ring.version, empty, empty.astype(np.int64), np.zeros(0, np.int32),
                            np.zeros(0, np.int64)) for s in ring.servers]
            fut = Scatter(client._state, Op.CALL, {"op": Op.CALL.value, "table": table, "all": True, **header},
                          spec.layout, on_piece, None).start(pieces)

        def done(f: Future[Any]) -> None:
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
                return
            if keys is None:  # the ring must not have moved under an all-rows call
                seen = {(m.header.get("ring_version"), tuple(m.header.get("servers") or ())) for m, _ in parts}
                servers = next(iter(seen))[1] if len(seen) == 1 else ()
                if len(seen) != 1 or len(parts) != len(servers):
                    if time.monotonic() < deadline:  # once the new ring is likely in
                        client._state.refresh_view()
                        threading.Timer(0.1, attempt).start()
                    else:
                        out.set_exception(NodeLostError(f"call {function!r} on {table!r}: the ring kept "
                                                        "changing; try again"))
                    return
            kind = str(parts[0][0].header.get("merge")) if parts else "concat"
            try:
                out.set_result(functions.merge(kind, [a for _, a in parts], args))
            except Exception as merge_exc:
                out.set_exception(merge_exc)

        fut.add_done_callback(done)

    attempt()
    return out
