"""``Caller``: what every call of one client goes through, as one object its groups of
calls are built on (the clocks, server functions, filters' flushes, the lifecycle's
calls): the client's identity once registered, its shared state and requests, the loss
check, the table specs it knows, and the scatter of a pull, push or call into one request
per server.  The groups hold it and nothing of each other's (issue 45: no mixin reaching
into another's state); ``Client`` is their face."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from paramserver.client.core import Piece, Wire, call_header, push_header
from paramserver.client.scatter import Scatter
from paramserver.errors import ConfigError, UnknownTableError
from paramserver.filters.packed import PackedRows
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message, Op

if TYPE_CHECKING:
    from paramserver.client.io_thread import IOThread
    from paramserver.client.losses import Losses
    from paramserver.client.rpc import Rpc
    from paramserver.client.state import ClientState
    from paramserver.config import Config


class Caller:
    """One client's calls, underneath its public face."""

    def __init__(self, config: Config, role: str, io: IOThread, state: ClientState, rpc: Rpc,
                 losses: Losses) -> None:
        self.config, self.role, self.io, self.state, self.rpc, self.losses = config, role, io, state, rpc, losses
        self.lock: threading.Lock = state.lock
        self.node_id = -1  # the scheduler's number for this node, once registered
        self.token = ""  # this node's token where the cluster has keys
        self.clock = 0  # clocks this worker has finished (its pulls are gated on it)
        self.time: float | None = None  # the time its pushes carry (``Client.set_time``)

    def spec(self, table: str) -> TableSpec:
        """``table``'s spec, asking the scheduler when another node created it since."""
        spec = self.state.tables.get(table)
        if spec is None:
            tables = self.rpc.scheduler({"op": Op.TABLE_INFO.value})["tables"]
            with self.lock:
                self.state.tables = {n: TableSpec.from_wire(w) for n, w in tables.items()}
            spec = self.state.tables.get(table)
        if spec is None:
            raise UnknownTableError(f"unknown table {table!r} (tables: {sorted(self.state.tables)}); "
                                    "create it with create_table()")
        return spec

    def scatter(self, kind: Op, table: str, keys: np.ndarray, extra: np.ndarray | PackedRows | None,
                on_piece: Callable[[Piece, Message], None], result: Any = None,
                reply_row_bytes: int = 0, seq: int | None = None,
                on_settled: Callable[[], None] | None = None, distinct: bool = False,
                extra_header: dict[str, Any] | None = None, wire: Wire | None = None,
                prepare: Callable[[list[Piece]], list[Piece]] | None = None) -> Future[Any]:
        """Send a pull, push or call as one request per server; the future resolves to
        ``result`` once every piece is answered (see ``scatter.Scatter``).  ``wire``: the
        table's filters this way; ``prepare``: what the pieces become before they go."""
        self.losses.check()
        layout = self.spec(table).layout
        pieces = self.state.routed(kind, keys, extra, layout, distinct, wire is not None and wire.chain.ordered)
        if prepare is not None:
            pieces = prepare(pieces)
        limit = self.config.max_message_bytes - (1 << 20)  # room for the header
        for piece in pieces:  # check every piece before sending any: never half a push
            nbytes = max(piece.keys.nbytes + (piece.extra.nbytes if kind is Op.PUSH else 0),
                         piece.keys.shape[0] * reply_row_bytes)
            if nbytes > limit:
                raise ConfigError(f"{nbytes} bytes for server {piece.server} exceed "
                                  f"max_message_bytes={self.config.max_message_bytes}; split the batch")
        self.state.keys[kind.value] = self.state.keys.get(kind.value, 0) + int(keys.shape[0])
        worker_clock = self.clock if self.role == "worker" else None
        header = call_header(kind, table, node_id=self.node_id, worker_clock=worker_clock, seq=seq,
                             token=self.token, extra=extra_header)
        return Scatter(self.state, kind, header, layout, on_piece, result, on_settled, wire).start(pieces)

    def push(self, spec: TableSpec, keys: np.ndarray, grads: np.ndarray | PackedRows, op: str, distinct: bool,
             flushing: bool = False, seq: int | None = None,
             on_piece: Callable[[Piece, Message], None] | None = None) -> Future[Any]:
        """A push once checked: through the table's filters (what a worker owes added, less
        what sigmod holds back, unless ``flushing``; the rounding owed), numbered (``seq``: a
        number taken already, a step's that went the classic way), scattered.  ``on_piece``:
        a merge's answers wanted (``read_back``: each server's rows as merged, and its version)."""
        filters = self.state.filters
        if seq is None:
            with self.lock:
                seq = self.state.sequencer.take()
        try:  # packed rows go where the filters neither round nor hold back (``takes_packed``)
            prepare = None
            if not isinstance(grads, PackedRows):
                keys, grads, distinct, prepare = filters.push_steps(spec, keys, grads, op, distinct, flushing)
        except BaseException:
            self.settled(seq)
            raise
        try:  # the seq is settled once no request of it is left anywhere, not when the
            # future fails: a server may still apply and forward a piece in flight
            header = push_header(spec, op, self.time, read_back=on_piece is not None)
            rows = grads if isinstance(grads, PackedRows) else np.ascontiguousarray(grads)
            return self.scatter(Op.PUSH, spec.name, keys, rows, on_piece or _ignored,
                                seq=seq, on_settled=lambda: self.settled(seq), distinct=distinct,
                                reply_row_bytes=4 * spec.width if on_piece is not None else 0,
                                extra_header=header, wire=filters.wire(spec, "push", op), prepare=prepare)
        except BaseException:
            self.settled(seq)
            raise

    def settled(self, seq: int) -> None:
        with self.lock:
            self.state.sequencer.settled(seq)


def _ignored(piece: Piece, msg: Message) -> None:
    """A push's answer: an acknowledgement, nothing to keep."""
