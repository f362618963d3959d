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
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from paramserver.client.core import Piece, as_keys, call_header, push_header, rows_into
from paramserver.errors import Code, ConfigError, ProtocolError
from paramserver.routing.steps import every_value_one, route_steps
from paramserver.tables.steps import STEP_MODELS, fits, step, unsuited
from paramserver.wire.message import Message, Op
from paramserver.wire.step_arrays import NO_VALUES, index_type, step_arrays
from paramserver.wire.step_groups import group_arrays

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
        ``keys[inverse[j]]`` with value ``vals[j]`` (``vals`` empty: every value 1, and none is
        read or sent: ``Batch.values``); ``keys`` distinct.  The future gives each
        example's probability under the rows it was scored with and their summed log loss, once
        the update is applied
        (exactly once).  One request to the server holding the keys; where that cannot be
        (several servers hold them, the table does not suit: ``steppable``), pulled and pushed.

        Raises:
            ConfigError: an unknown model, ``inverse`` not integers, or the table's rows cached here."""
        spec, how = self._checked(table, model, l2)
        return self._take(spec, self._batch(spec, keys, inverse, indptr, vals, labels), how)

    def take_many(self, table: str, batches: Sequence[tuple[Any, Any, Any, Any, Any]], *, model: str = "lr",
                  l2: float = 0.0) -> list[Future[Stepped]]:
        """``take`` for each of ``batches`` (``(keys, inverse, indptr, vals, labels)`` each), in
        order, as one request where that can be (``wire/step_groups.py``: one server holds
        every batch's keys, the table has no copies): the server takes them in turn, each on
        the rows the one before left, as it would take that many steps sent in turn; each
        future as ``take``'s.  Where they cannot go as one, each goes as ``take`` sends it.

        Raises:
            ConfigError: as ``take``, for any of the batches (then none is sent)."""
        spec, how = self._checked(table, model, l2)
        checked = [self._batch(spec, *b) for b in batches]
        if len(checked) < 2 or spec.replicas > 1:
            return [self._take(spec, b, how) for b in checked]
        return self._take_group(spec, checked, how)

    def _checked(self, table: str, model: str, l2: float) -> tuple[TableSpec, tuple[str, float]]:
        """``table``'s spec and the step's ``(model, l2)``, once checked."""
        if model not in STEP_MODELS:
            raise ConfigError(f"steps on {table!r}: model must be one of {sorted(STEP_MODELS)}, got {model!r}")
        if not (isinstance(l2, (int, float)) and l2 >= 0 and math.isfinite(l2)):
            raise ConfigError(f"steps on {table!r}: l2 must be a finite number >= 0, got {l2!r}")
        spec = self.caller.spec(table)
        if not fits(model, spec.dim):
            raise ConfigError(f"steps on {table!r}: model {model!r} reads rows of "
                              f"{'1 float' if model == 'lr' else '2 floats or more'}; the table's have {spec.dim}")
        if table in self.caller.state.row_caches:
            raise ConfigError(f"steps on {table!r}: the table's rows are cached here; pull and push instead")
        return spec, (model, float(l2))

    @staticmethod
    def _batch(spec: TableSpec, keys: Any, inverse: Any, indptr: Any, vals: Any,
               labels: Any) -> tuple[np.ndarray, ...]:
        """A batch's arrays at the types a step takes them, its keys and indices checked."""
        keys = as_keys(keys)
        spec.check_keys(keys)
        inverse = np.asarray(inverse)
        if inverse.dtype.kind not in "iu" or inverse.ndim != 1:
            raise ConfigError(f"steps on {spec.name!r}: inverse must be a 1-D integer array, got {inverse.dtype} "
                              f"of shape {inverse.shape}")
        return keys, inverse, np.asarray(indptr, np.int64), np.asarray(vals, np.float32), np.asarray(labels, np.float32)

    def _take(self, spec: TableSpec, batch: tuple[np.ndarray, ...], how: tuple[str, float],
              seq: int | None = None, out: Future[Stepped] | None = None) -> Future[Stepped]:
        """``batch`` as one step (the classic way where no one server can take it), numbered
        ``seq`` (a new number by default); ``out`` (a new future by default) gets its answer."""
        c = self.caller
        if seq is None:
            c.losses.check()
            with c.lock:
                seq = c.state.sequencer.take()
        out = Future() if out is None else out
        try:
            routed = self._routed(spec, [batch], how)
            if routed is None:  # several servers, or none can step:
                self._classic(spec, batch, seq, how, out)  # pulled and pushed, as one step
                return out
            self._send(spec, routed[0], batch, seq, how, out)
        except BaseException:
            c.settled(seq)
            raise
        return out

    def _take_group(self, spec: TableSpec, batches: list[tuple[np.ndarray, ...]],
                    how: tuple[str, float]) -> list[Future[Stepped]]:
        """``batches`` as one step of several (``wire/step_groups.py``) to the server that holds
        all their keys, numbered ``seq`` to ``seq + n - 1``; where no one server does, each
        alone (under its number)."""
        c = self.caller
        c.losses.check()
        group = self._routed(spec, batches, how)
        with c.lock:
            seqs = [c.state.sequencer.take() for _ in batches]
        outs: list[Future[Stepped]] = [Future() for _ in batches]
        if group is None:
            for batch, seq, out in zip(batches, seqs, outs, strict=True):
                self._take(spec, batch, how, seq, out)
            return outs
        self._send_group(spec, *group, batches, seqs, how, outs)
        return outs

    def _routed(self, spec: TableSpec, batches: list[tuple[np.ndarray, ...]],
                how: tuple[str, float]) -> tuple[Piece, np.ndarray] | None:
        """``batches``' keys as a step carries them (one batch, or several end to end): each
        batch's grouped by vnode as a pull's and its occurrences' places among them (the
        piece's ``extra``), as narrow as they go; and the batches' sizes (``wire/step_groups.py``).
        None where one server cannot step them (several hold them, or none can step)."""
        ring = self.caller.state.ring()
        keys = [b[0] for b in batches]
        # the keys go as narrow as the widest batch's allow (None: route_steps looks)
        routed = route_steps(ring, keys, [b[1] for b in batches], spec.layout, None,
                             index_type(max(k.shape[0] for k in keys)))
        if isinstance(routed, int):
            m = batches[routed][0].shape[0]
            raise ConfigError(f"steps on {spec.name!r}: inverse must index the {m} keys, got values outside [0, {m})"
                              + (f" (batch {routed} of {len(batches)})" if len(batches) > 1 else ""))
        grouped, rank, vnodes, counts, seg_ends = routed
        owners = ring.owners[vnodes]
        if not owners.size or (owners != owners[0]).any() or not steppable(spec, how[0]):
            return None
        sizes = np.column_stack([[k.shape[0] for k in keys], np.diff(seg_ends, prepend=0),
                                 [b[4].shape[0] for b in batches]]).astype(np.int64).reshape(-1)
        return Piece(int(owners[0]), ring.version, grouped, rank, vnodes, counts), sizes

    def _send(self, spec: TableSpec, piece: Piece, batch: tuple[np.ndarray, ...], seq: int, how: tuple[str, float],
              out: Future[Stepped]) -> None:
        """``batch`` as one step to ``piece``'s server: ``piece`` holds the keys as they go
        and, as its ``extra``, each occurrence's place among them (``route_steps``)."""
        c = self.caller
        _, _, indptr, vals, labels = batch
        address, header = self._outgoing(spec, piece, seq, how)
        arrays = step_arrays(piece.keys, piece.vnodes, piece.counts, piece.extra, indptr, vals, labels)  # narrow

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

    def _outgoing(self, spec: TableSpec, piece: Piece, seq: int, how: tuple[str, float],
                  batches: int = 1) -> tuple[str | None, dict[str, Any]]:
        """Where a step of ``batches`` (``piece``: their keys) goes (None: its server left the
        ring) and its header, numbered ``seq`` (its first batch's), counted in the client's stats."""
        c = self.caller
        model, l2 = how
        extra = {"model": model, **({"l2": l2} if model == "fm" else {}), **(push_header(spec, "update", c.time) or {})}
        if batches > 1:
            extra["steps"] = batches
            c.state.count("step_groups")
        header = call_header(Op.STEP, spec.name, node_id=c.node_id, seq=seq, token=c.token, extra=extra,
                             worker_clock=c.clock if c.role == "worker" else None)
        c.state.counts[Op.STEP.value] = c.state.counts.get(Op.STEP.value, 0) + batches
        c.state.keys[Op.STEP.value] = c.state.keys.get(Op.STEP.value, 0) + int(piece.keys.shape[0])
        address, header, _ = c.state.outgoing(Op.STEP, header, piece, 0)
        return address, header

    def _send_group(self, spec: TableSpec, piece: Piece, sizes: np.ndarray, batches: list[tuple[np.ndarray, ...]],
                    seqs: list[int], how: tuple[str, float], outs: list[Future[Stepped]]) -> None:
        """``batches`` (routed as ``piece``, to one server; ``sizes``: ``_routed_group``'s) as one
        step of several."""
        c = self.caller
        address, header = self._outgoing(spec, piece, seqs[0], how, len(batches))
        indptr, labels = (np.concatenate([b[i] for b in batches]) for i in (2, 4))
        ones = every_value_one([b[3] for b in batches])  # a CTR row's features: no values go, none copied
        vals = NO_VALUES if ones else np.concatenate([b[3] for b in batches])
        arrays = group_arrays(piece.keys, piece.vnodes, piece.counts, piece.extra, indptr, vals, labels, sizes)
        examples = [b[4].shape[0] for b in batches]

        def answered(msg: Message | None, exc: BaseException | None) -> None:
            got = _stepped_group(msg, examples) if exc is None else None
            if got is None:  # refused (a copy under way, an older server), its server gone, the ring moved,
                for batch, seq, out in zip(batches, seqs, outs, strict=True):  # unanswered: each batch alone
                    try:  # under its number (a batch applied is skipped)
                        self._take(spec, batch, how, seq, out)
                    except BaseException as failed:  # (the client closed): its future says so
                        out.set_exception(failed)
                return
            for seq in seqs:
                c.settled(seq)
            for out, preds, loss in zip(outs, *got, strict=True):
                out.set_result((preds, loss))

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


def _stepped_group(msg: Message | None, sizes: list[int]) -> tuple[list[np.ndarray], list[float]] | None:
    """A step of several batches' answer: each batch's probabilities (``sizes`` examples each)
    and summed log loss, or None where it was no answer to use."""
    losses = None if msg is None else msg.header.get("losses")
    preds = _stepped(msg, sum(sizes))
    if preds is None or not isinstance(losses, list) or len(losses) != len(sizes) \
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in losses):
        return None
    cuts = np.cumsum(sizes)[:-1]
    return np.split(preds, cuts), [float(x) for x in losses]

