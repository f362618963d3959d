"""``Client.call``: a server-side function on every server, its results merged
(``paramserver.tables.functions``)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from paramserver.client.core import Piece, as_keys
from paramserver.client.scatter import Scatter
from paramserver.errors import NodeLostError
from paramserver.tables import functions
from paramserver.wire.message import Message, Op

if TYPE_CHECKING:
    from paramserver.client.caller import Caller
    from paramserver.tables.spec import TableSpec


class FunctionCalls:
    """``Client.call``, on the client's ``caller``."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    def call(self, table: str, function: str, keys: Any = None, args: dict[str, Any] | None = None) -> Future[Any]:
        """Run the server-side function ``"module:function"`` on every server, over the
        rows it is the primary of (of ``keys``, or all of them), and merge the results as
        the function declares (``paramserver.tables.functions``: a sum, ``(keys, rows)``
        concatenated, or the top ``args["k"]``).  ``args``: numbers, strings, lists or
        numpy arrays (sent as lists).  Returns a future, like ``pull``.

        With keys, a scatter like a pull's (retried on a stale ring); without, one request
        to every server of the ring, tried again whole if the ring moved under it (the
        answers name the ring they were computed on)."""
        c = self.caller
        c.losses.check()
        spec = c.spec(table)
        args = {str(k): (v.tolist() if isinstance(v, (np.ndarray, np.generic)) else v) for k, v in (args or {}).items()}
        header = {"function": str(function), "args": args}
        out: Future[Any] = Future()
        deadline = time.monotonic() + c.config.retry_timeout_s

        def attempt() -> None:
            parts: list[tuple[Message, list[np.ndarray]]] = []
            fut = self._send_call(spec, keys, header, parts)

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
                            c.state.refresh_view()
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

    def _send_call(self, spec: TableSpec, keys: Any, header: dict[str, Any],
                   parts: list[tuple[Message, list[np.ndarray]]]) -> Future[Any]:
        """One attempt of a call: a scatter of ``keys`` like a pull's, or without keys one
        empty piece to every server of the ring (over all its rows); answers go to ``parts``."""
        def on_piece(piece: Piece, msg: Message) -> None:
            parts.append((msg, list(msg.arrays)))

        if keys is not None:
            k = as_keys(keys)
            spec.check_keys(k)
            return self.caller.scatter(Op.CALL, spec.name, k, None, on_piece, extra_header=header)
        ring = self.caller.state.ring()
        empty = np.zeros(0, np.uint64)
        pieces = [Piece(s, ring.version, empty, empty.astype(np.int64), np.zeros(0, np.int32),
                        np.zeros(0, np.int64)) for s in ring.servers]
        return Scatter(self.caller.state, Op.CALL, {"op": Op.CALL.value, "table": spec.name, "all": True, **header},
                       spec.layout, on_piece, None).start(pieces)
