"""``client.steps.take``: a mini-batch trained where its rows are (``Op.STEP``, ``server/steps.py``).

A step is one request to the one server that holds every key of the batch: the server
reads the rows, computes the gradient (``tables/steps.py``) and applies it as a push, and
answers with each example's probability and the batch's summed log loss.  No round trip
waits between a pull and its push, and a batch in flight never reads rows older than the
batch before it: the server takes one worker's steps in order.

A step is numbered like a push (one ``seq``): a server applies it once, its copies too.
When it cannot go as one request (the batch's keys live on more than one server, or the
table's rows are not the model's: ``steppable``) or when its answer is a failure (its
server died, the ring moved, the request was refused), the same batch is trained the
classic way: its rows pulled, the gradient computed here, and pushed **under the step's
seq**.  A server that had applied the step (a backup it was forwarded to, promoted) skips
that push, so the batch counts once whatever happened to the step.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from paramserver.client.core import Piece, as_keys, call_header, push_header, rows_into
from paramserver.errors import Code, ConfigError, ProtocolError
from paramserver.routing.partition import route_step
from paramserver.tables.steps import STEP_MODELS, fits, step, unsuited
from paramserver.wire.message import Message, Op
from paramserver.wire.step_arrays import index_type, key_type, step_arrays

if TYPE_CHECKING:
    from paramserver.client.caller import Caller
    from paramserver.tables.spec import TableSpec

logger = logging.getLogger(__name__)

#: what a step's future gives: each example's probability under the rows it was scored with, and their summed log loss
Stepped = tuple[np.ndarray, float]


def steppable(spec: TableSpec, model: str) -> bool:
    """Whether ``spec``'s servers can take ``model``'s steps: rows of the model's width, no
    clock gating (a step reads as an ASP pull), no filters (a step's request is not a
    push's), and no admission counting shows and clicks (a step's push carries none)."""
    return unsuited(spec, model) is None and not spec.filters


class StepCalls:
    """``client.steps``: mini-batches trained where their rows are, on the client's ``caller``."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller
        self._refused: set[str] = set()  # tables whose steps a server refused (said once)

    def take(self, table: str, keys: Any, inverse: Any, indptr: Any, vals: Any, labels: Any, *,
             model: str = "lr", l2: float = 0.0) -> Future[Stepped]:
        """Train ``model`` (``"lr"``, or ``"fm"`` with ``l2`` on its factors) on a CSR mini-batch
        where its rows are: occurrence j of example i (``indptr[i] <= j < indptr[i + 1]``) is key
        ``keys[inverse[j]]`` with value ``vals[j]``; ``keys`` distinct.  The future gives each
        example's probability under the rows it was scored with and their summed log loss, once
        the update is applied
        (exactly once).  One request to the server holding the keys; where that cannot be
        (several servers hold them, the table does not suit: ``steppable``), pulled and pushed.

        Raises:
            ConfigError: an unknown model, ``inverse`` not integers, or the table's rows cached here."""
        if model not in STEP_MODELS:
            raise ConfigError(f"steps on {table!r}: model must be one of {sorted(STEP_MODELS)}, got {model!r}")
        if not (isinstance(l2, (int, float)) and l2 >= 0 and math.isfinite(l2)):
            raise ConfigError(f"steps on {table!r}: l2 must be a finite number >= 0, got {l2!r}")
        c = self.caller
        spec = c.spec(table)
        if not fits(model, spec.dim):
            raise ConfigError(f"steps on {table!r}: model {model!r} reads rows of "
                              f"{'1 float' if model == 'lr' else '2 floats or more'}; the table's have {spec.dim}")
        keys = as_keys(keys)
        spec.check_keys(keys)
        if table in c.state.row_caches:
            raise ConfigError(f"steps on {table!r}: the table's rows are cached here; pull and push instead")
        inverse = np.asarray(inverse)
        if inverse.dtype.kind not in "iu" or inverse.ndim != 1:
            raise ConfigError(f"steps on {table!r}: inverse must be a 1-D integer array, got {inverse.dtype} "
                              f"of shape {inverse.shape}")
        return self._take(spec, keys, inverse, np.asarray(indptr, np.int64), np.asarray(vals, np.float32),
                          np.asarray(labels, np.float32), (model, float(l2)))

    def _take(self, spec: TableSpec, keys: np.ndarray, inverse: np.ndarray, indptr: np.ndarray, vals: np.ndarray,
              labels: np.ndarray, how: tuple[str, float]) -> Future[Stepped]:
        c = self.caller
        c.losses.check()
        with c.lock:
            seq = c.state.sequencer.take()
        out: Future[Stepped] = Future()
        batch = (keys, inverse, indptr, vals, labels)
        try:
            # the keys grouped by vnode as a pull's, and each occurrence's place among them, as narrow as they go
            ring = c.state.ring()
            routed = route_step(ring, keys, inverse, spec.layout, key_type(keys), index_type(keys.shape[0]))
            if routed is None:
                raise ConfigError(f"steps on {spec.name!r}: inverse must index the {keys.shape[0]} keys, "
                                  f"got values outside [0, {keys.shape[0]})")
            grouped, rank, parts = routed
            if len(parts) != 1 or not steppable(spec, how[0]):  # several servers, or none can step:
                self._classic(spec, batch, seq, how, out)  # pulled and pushed, as one step
                return out
            part = parts[0]
            self._send(spec, Piece(part.server, ring.version, grouped, rank, part.vnodes, part.counts),
                       batch, seq, how, out)
        except BaseException:
            c.settled(seq)
            raise
        return out

    def _send(self, spec: TableSpec, piece: Piece, batch: tuple[np.ndarray, ...], seq: int, how: tuple[str, float],
              out: Future[Stepped]) -> None:
        """``batch`` as one step to ``piece``'s server: ``piece`` holds the keys as they go
        and, as its ``extra``, each occurrence's place among them (``route_step``)."""
        c = self.caller
        keys, _, indptr, vals, labels = batch
        model, l2 = how
        extra = {"model": model, **({"l2": l2} if model == "fm" else {}), **(push_header(spec, "update", c.time) or {})}
        header = call_header(Op.STEP, spec.name, node_id=c.node_id, seq=seq, token=c.token, extra=extra,
                             worker_clock=c.clock if c.role == "worker" else None)
        c.state.count(Op.STEP.value)
        c.state.keys[Op.STEP.value] = c.state.keys.get(Op.STEP.value, 0) + int(keys.shape[0])
        address, header, (grouped, vnodes, counts) = c.state.outgoing(Op.STEP, header, piece, 0)
        arrays = step_arrays(grouped, vnodes, counts, piece.extra, indptr, vals, labels)  # each as narrow as it goes

        def answered(msg: Message | None, exc: BaseException | None) -> None:
            preds = _stepped(msg, labels.shape[0]) if exc is None else None
            if preds is None:  # refused, its server gone, the ring moved, unanswered: the batch the classic way
                self._went_classic(spec, msg)
                self._classic(spec, batch, seq, how, out)
                return
            c.settled(seq)
            assert msg is not None
            out.set_result((preds, float(msg.header.get("loss", 0.0))))

        if address is None:
            answered(None, ProtocolError(f"server {piece.server} left the ring"))
            return
        c.state.submit(address, header, arrays, answered)

    def _went_classic(self, spec: TableSpec, msg: Message | None) -> None:
        """Say why, the first time a server refused a step of ``spec``'s table."""
        if (msg is not None and msg.op is Op.ERROR and msg.header.get("code") == Code.PROTOCOL.value
                and spec.name not in self._refused):
            self._refused.add(spec.name)
            logger.warning("steps on %r refused by a server (%s): its batches are pulled and pushed", spec.name,
                           msg.header.get("error"))

    def _classic(self, spec: TableSpec, batch: tuple[np.ndarray, ...], seq: int, how: tuple[str, float],
                 out: Future[Stepped]) -> None:
        """The batch pulled, its gradient computed here, pushed under ``seq`` (settled once
        that push is); ``out`` gets what the step would have answered."""
        c = self.caller
        c.state.count("steps_classic")  # client.stats.counts
        keys, inverse, indptr, vals, labels = batch
        rows = np.empty((keys.shape[0], spec.dim), np.float32)
        try:
            pulled = c.scatter(Op.PULL, spec.name, keys, None, rows_into(rows, spec.dim, None), result=rows)
        except BaseException as exc:
            c.settled(seq)
            out.set_exception(exc)
            return

        def push(f: Future[Any]) -> None:
            try:
                grads, loss, preds = step(how[0], indptr, vals, labels, inverse, f.result(), how[1])
            except BaseException as exc:
                c.settled(seq)
                out.set_exception(exc)
                return
            try:
                pushed = c.push(spec, keys, grads, "update", True, seq=seq)  # settles seq, also when it raises
            except BaseException as exc:
                out.set_exception(exc)
                return

            def answered(p: Future[Any]) -> None:
                failed = p.exception()
                if failed is not None:
                    out.set_exception(failed)
                else:
                    out.set_result((preds.astype(np.float32), float(loss)))

            pushed.add_done_callback(answered)

        pulled.add_done_callback(push)


def _stepped(msg: Message | None, n: int) -> np.ndarray | None:
    """A step's answer: the examples' probabilities, or None where it was no answer to use."""
    if msg is None or msg.op is not Op.OK or len(msg.arrays) != 1:
        return None
    preds = msg.arrays[0]
    return preds if preds.shape == (n,) and preds.dtype == np.float32 else None
