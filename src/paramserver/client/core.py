"""The client's decisions, without I/O (sans-IO): what ``Client`` runs through its I/O
thread and the simulation's workers run on the simulated network (``testing/cluster.py``),
so that the chaos campaign exercises the code users run.

* ``View``: the ring and the servers' addresses this client routes with (a view older
  than the one held is ignored: notifications and answers may arrive out of order);
* ``route``: a pull's or push's keys, routed with a ring into one ``Piece`` per server;
* ``Sequencer``: pushes numbered for exactly-once application (a retry keeps its
  number), and the acked watermark that lets servers forget the pushes answered;
* ``call_header``, ``request``: the header and arrays one piece goes out as;
* ``decide``: what a reply means for its piece: done; resent, routed again with the
  newest ring (at once when the ring moved on, after a back-off when it did not, asking
  the scheduler for the ring first when the server knows a newer one); or failed;
* ``Gather``: which pieces of one call are still unanswered;
* ``Wire``, ``pull_rows``: a table's filters on the way out (``request``) and on a pull's
  answer (``paramserver.filters``).  A key list a server no longer holds is resent whole
  (``decide``: a resend never names a key list by its signature).

``Client`` and the simulation call ``request`` and ``decide`` through this module (a
chaos mutation replaces one for a run).  None of it locks: ``Client`` calls it under its
own locks, the simulation from its one thread.  Nothing here reads a clock; times come in
as arguments.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from paramserver.errors import (
    ConfigError,
    KeyCacheMissError,
    NodeLostError,
    ParamServerError,
    ProtocolError,
    StaleRingError,
    raised,
)
from paramserver.filters.base import Context, Link
from paramserver.filters.chain import Chain, pack, unpack, unpack_rows
from paramserver.filters.packed import PackedRows
from paramserver.routing.partition import Routed, route_pull, route_push, scatter_answer
from paramserver.routing.ring import Ring
from paramserver.wire.message import Message, Op
from paramserver.wire.step_arrays import key_type

if TYPE_CHECKING:
    from paramserver.tables.spec import TableSpec

T = TypeVar("T")

MAX_BACKOFF_S = 0.5  # a piece refused with no newer ring to route by waits at most this long
#: a pull or push is answered within this long, plus its bytes (and a pull's reply's) at
#: SLOWEST_LINK_BPS, else it fails with ``NoAnswerError`` and is routed again and resent
#: (``answer_within``); a server's own wait on its backups (``server/peers.py``) is shorter
ANSWER_WITHIN_S = 30.0
SLOWEST_LINK_BPS = 1e6


class NoAnswerError(NodeLostError):
    """A request unanswered for its whole wait (a message lost on the way, a reply the
    server could not send): retried as a lost node's are."""


@dataclass(frozen=True)
class Piece:
    """The part of a pull or push that goes to one server, as routed at ``ring_version`` (the ring's version)."""

    server: int
    ring_version: int
    keys: np.ndarray
    extra: Any  # pull: output row of each key (ndarray); push: gradient rows (ndarray, or PackedRows)
    vnodes: np.ndarray
    counts: np.ndarray


class View:
    """The ring and the servers' addresses a client routes with."""

    def __init__(self) -> None:
        self.ring: Ring | None = None
        self.servers: dict[int, str] = {}

    def apply(self, view: dict[str, Any]) -> bool:
        """Take a view (a registration's welcome, a RING notification, a CLUSTER_INFO
        answer) unless it is older than the one held; whether it was taken."""
        ring = Ring.from_wire(view["ring"])
        if self.ring is not None and ring.version < self.ring.version:
            return False  # an older view that arrived late
        self.ring = ring
        self.servers = {int(k): v for k, v in view["servers"].items()}
        return True


class ByArray(Generic[T]):
    """Values kept for the last ``size`` arrays a caller pulled, found again by the very
    array (identity, not contents): a push of the keys a worker pulled reuses what their
    pull worked out.  No lock: a deque's append and its copy are atomic."""

    def __init__(self, size: int = 8) -> None:
        self._held: collections.deque[tuple[np.ndarray, T]] = collections.deque(maxlen=size)

    def keep(self, arr: np.ndarray, value: T) -> None:
        self._held.append((arr, value))

    def get(self, arr: np.ndarray) -> T | None:
        held: list[tuple[np.ndarray, T]] = list(self._held)
        return next((value for kept, value in reversed(held) if kept is arr), None)


class RouteMemo:
    """The routings of the last few pulls, each with its keys' array: a push of distinct
    keys that were pulled (a worker pushes the gradients of the keys it pulled) takes their
    grouping from its pull, instead of hashing and sorting the same keys again (~35 ns a
    key; half of what a training worker spent routing).  Taken only for the very array
    pulled, on the same ring, layout and order, and once its keys are checked to be the
    ones routed (an array changed in place since is routed afresh): the push goes out as
    it would have, bit for bit."""

    #: a pull of more keys is not kept (what it holds is ~24 bytes a key: the keys, grouped and in order)
    MAX_KEYS = 1 << 18

    def __init__(self, size: int = 8) -> None:
        self._held: ByArray[tuple[Routed, int, bool]] = ByArray(size)

    def keep(self, keys: np.ndarray, routed: Routed, layout: int, ordered: bool) -> None:
        if keys.shape[0] <= self.MAX_KEYS:
            self._held.keep(keys, (routed, layout, ordered))

    def routing(self, ring: Ring, keys: np.ndarray, layout: int, ordered: bool) -> Routed | None:
        """The routing kept for the very array ``keys`` (a pull's, or a prefetch's: a pull of
        the keys named ahead takes it too), if it still holds, or None."""
        held = self._held.get(keys)
        if held is None:
            return None
        routed, held_layout, held_ordered = held
        order = routed.order
        if (order is None or routed.ring_version != ring.version or held_layout != layout
                or held_ordered != ordered or not np.array_equal(keys[order], routed.keys)):
            return None
        return routed

    def push_routing(self, ring: Ring, keys: np.ndarray, grads: np.ndarray, layout: int,
                     ordered: bool) -> Routed | None:
        """The routing of a distinct push of ``keys`` from their pull's, or None."""
        routed = self.routing(ring, keys, layout, ordered)
        if routed is None or routed.order is None:
            return None
        return Routed(routed.keys, routed.parts, ring.version, grads=np.ascontiguousarray(grads[routed.order]))


def route(ring: Ring, kind: Op, keys: np.ndarray, extra: np.ndarray | PackedRows | None, layout: int,
          distinct: bool = False, ordered: bool = False, memo: RouteMemo | None = None) -> list[Piece]:
    """Route ``keys`` with ``ring`` into one piece per server.  ``extra`` rides along: a
    pull's output row of each key (None: the identity), a push's gradients (dense, or
    ``PackedRows`` of distinct keys, moved by their bits and words); ``layout`` is
    the table's (``TableSpec.layout``); ``distinct``: a push's keys need no merging;
    ``ordered``: each vnode's keys by dense position (for a key codec: ``Chain.ordered``);
    ``memo``: pulls' routings, kept, and taken by the pushes of the same keys."""
    index: Any  # a pull's destination rows; a push's summed gradients
    if kind is not Op.PUSH:  # a pull, a prefetch, or a server-side function over keys
        known = memo.routing(ring, keys, layout, ordered) if memo is not None else None
        routed = known or route_pull(ring, keys, layout, ordered)
        assert routed.order is not None
        assert not isinstance(extra, PackedRows), "a pull's extra is the rows its answers go to"
        index = routed.order if extra is None else extra[routed.order]
        if memo is not None:  # (again when known: the latest kept is the last to go)
            memo.keep(keys, routed, layout, ordered)
    elif isinstance(extra, PackedRows):  # distinct keys (``Client.push``): their rows' bits and words in that order
        routed = (memo.routing(ring, keys, layout, ordered) if memo is not None else None) or \
            route_pull(ring, keys, layout, ordered)
        assert routed.order is not None
        index = extra.take(routed.order)
    else:
        assert extra is not None, "a push carries its gradients"
        known = memo.push_routing(ring, keys, extra, layout, ordered) if memo is not None and distinct else None
        routed = known or route_push(ring, keys, extra, layout, distinct, ordered)
        assert routed.grads is not None
        index = routed.grads
    return [Piece(part.server, ring.version, routed.keys[part.start:part.stop], index[part.start:part.stop],
                  part.vnodes, part.counts) for part in routed.parts]


def answer_within(header: dict[str, Any], arrays: list[np.ndarray] | tuple[np.ndarray, ...],
                  spec: TableSpec | None) -> float | None:
    """How long a request may wait for its answer before it is resent (None: as long as
    its server lives).  A pull, a push or a step: ``ANSWER_WITHIN_S`` and its bytes at
    ``SLOWEST_LINK_BPS`` (a request or answer lost on a link that stays up, a reply a
    server dropped for a slow peer, would otherwise hold the call for ever; a resent push
    keeps its seq).  Not a pull of a BSP or SSP table (the gate may hold it for as long as
    the slowest worker takes), nor a server function (it may compute for long, and run
    again if resent), nor the rest (answered at once, or waited on by their callers)."""
    op = header.get("op")
    if op not in (Op.PULL.value, Op.PUSH.value, Op.STEP.value):
        return None
    if op == Op.PULL.value and (spec is None or spec.staleness != float("inf")):
        return None
    nbytes = sum(a.nbytes for a in arrays)
    if op == Op.PULL.value and spec is not None and arrays:
        nbytes += arrays[0].shape[0] * 4 * spec.dim  # the rows it is answered with
    if op == Op.STEP.value and arrays:
        nbytes += 4 * arrays[-1].shape[0]  # a float32 score an example: one a label (a label may go as a byte)
    return ANSWER_WITHIN_S + nbytes / SLOWEST_LINK_BPS


def as_keys(keys: Any) -> np.ndarray:
    """``keys`` as a 1-d contiguous uint64 array (signed ints are reinterpreted, not clipped)."""
    arr = np.asarray(keys)
    if arr.ndim != 1:
        raise ConfigError(f"keys must be a 1-d array, got shape {arr.shape}")
    if arr.dtype == np.uint64:
        return np.ascontiguousarray(arr)
    if arr.size == 0:
        return np.zeros(0, np.uint64)
    if arr.dtype.kind == "u":
        return arr.astype(np.uint64)
    if arr.dtype.kind == "i":
        return arr.astype(np.int64).view(np.uint64)
    raise ConfigError(f"keys must be integers (uint64 ideally), got dtype {arr.dtype}; "
                      "hash features to uint64 first")


class Sequencer:
    """Push numbers and the acked watermark of one client."""

    def __init__(self) -> None:
        self.seq = 0  # the last number taken
        self.in_flight: set[int] = set()  # numbers some request of which may still be anywhere

    def take(self) -> int:
        self.seq += 1
        self.in_flight.add(self.seq)
        return self.seq

    def settled(self, seq: int) -> None:
        """No request of push ``seq`` is left anywhere (answered, or failed for good)."""
        self.in_flight.discard(seq)

    def acked(self) -> int:
        """Every push numbered up to this was answered: servers may forget them."""
        return min(self.in_flight) - 1 if self.in_flight else self.seq


def call_header(kind: Op, table: str, *, node_id: int, worker_clock: int | None = None, seq: int | None = None,
                token: str = "", extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The header every piece of one call shares.  A worker's (``worker_clock``: the clock
    it is at) names its clock, which the staleness gate and BSP aggregation key on, and
    itself as the reader (a dead reader's parked pulls go); a push names its sender and
    ``seq`` (and the sender's token when the cluster has keys)."""
    header: dict[str, Any] = {"op": kind.value, "table": table}
    if worker_clock is not None:
        header.update(clock=worker_clock, reader=node_id)
    if seq is not None:
        header.update(sender=node_id, seq=seq)
        if token:
            header["sender_token"] = token
    header.update(extra or {})
    return header


def push_header(spec: TableSpec, op: str, time: float | None, read_back: bool = False) -> dict[str, Any] | None:
    """What a push's header says beyond the call's: its op (unless ``update``), the time
    for a table with a lifecycle, and whether a merge's answer carries the rows it left
    (``read_back``; through the table's lossless reply filters)."""
    header: dict[str, Any] = {"push_op": op} if op != "update" else {}
    if read_back:
        header["read_back"] = True
        if spec.filters:
            header["reply_filters"] = True
    if time is not None and spec.lifecycle:
        header["time"] = time
    return header or None


def tick_fields(node_id: int, clock: int, token: str = "") -> dict[str, Any]:
    """The fields by which a pull or a push carries worker ``node_id``'s finished clock to
    its server (``ClientState.outgoing``): the server takes the tick before the request,
    as the clock message it replaces (with the worker's token when the cluster has keys)."""
    fields: dict[str, Any] = {"tick": clock, "tick_worker": node_id}
    if token:
        fields["tick_token"] = token
    return fields


def clock_request(node_id: int, clock: int, token: str = "") -> dict[str, Any]:
    """The request that tells a server worker ``node_id`` finished clock ``clock`` (with the
    worker's token when the cluster has keys)."""
    header: dict[str, Any] = {"op": Op.CLOCK.value, "worker": node_id, "clock": clock}
    if token:
        header["worker_token"] = token
    return header


@dataclass
class Wire:
    """The filters one call's requests go through: its direction's ``chain``, the
    client's ``links`` to each server (what each was sent whole), and ``sizes``, each
    filter's bytes before and after, added up."""

    chain: Chain
    links: dict[int, Link]
    sizes: dict[str, list[int]]
    layout: int = 0  # the table's (TableSpec.layout): a key codec may use its dense positions


#: the requests whose keys go as 4 bytes each where they all fit (``narrow_keys``): those the servers read
#: with ``wire.message.KEY_TYPES``.  A filtered request's keys go as its chain makes them
NARROW_KEYS = frozenset({Op.PULL, Op.PUSH, Op.PREFETCH, Op.CALL})


def narrow_keys(keys: np.ndarray) -> np.ndarray:
    """``keys`` as 4-byte keys where every one is below 2^32 (``step_arrays.key_type``, a step's
    rule; the servers widen them back), else as they are: a pull's or a push's keys were half
    its bytes at 8 each."""
    if keys.dtype != np.uint64:
        return keys
    wanted = key_type(keys)
    return keys if wanted == keys.dtype else keys.astype(wanted)


def request(kind: Op, header: dict[str, Any], piece: Piece, tries: int, sequencer: Sequencer,
            wire: Wire | None = None) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The header and arrays piece ``piece`` goes out as on its ``tries``-th resend: the
    ring it was routed by, and a push's acked watermark (its ``seq`` is the call's, kept
    by every retry: that is what makes a retry safe); through ``wire``'s filters, with
    key lists whole on a resend, or unfiltered with its keys in 4 bytes where they fit (``narrow_keys``)."""
    out = {**header, "ring_version": piece.ring_version}
    if "seq" in out:
        out["acked"] = sequencer.acked()
    filtered = wire is not None and bool(wire.chain)
    keys = piece.keys if filtered or kind not in NARROW_KEYS else narrow_keys(piece.keys)
    arrays = [keys, piece.extra, piece.vnodes, piece.counts] if kind is Op.PUSH else [keys, piece.vnodes, piece.counts]
    if wire is not None and filtered:
        link = wire.links.get(piece.server)
        if link is None:
            link = wire.links[piece.server] = Link()
        fields, arrays = pack(wire.chain.direction, wire.chain, arrays,
                              Context(link=link, whole=tries > 0, layout=wire.layout), wire.sizes)
        out.update(fields)
    return out, arrays


def pull_rows(msg: Message, piece: Piece, dim: int, chain: Chain | None) -> np.ndarray:
    """The rows a pull's answer carries for ``piece`` (through the table's reply filters)."""
    return _rows_of(unpack("reply", chain, msg.header, msg.arrays, Context()) if chain is not None else msg.arrays,
                    piece, dim)


def _rows_of(arrays: list[np.ndarray], piece: Piece, dim: int) -> np.ndarray:
    vals = arrays[0] if arrays else None
    if vals is None or vals.shape != (piece.keys.shape[0], dim) or vals.dtype != np.float32:
        raise ProtocolError(f"pull reply has {None if vals is None else vals.shape}, "
                            f"expected ({piece.keys.shape[0]}, {dim}) float32")
    return vals


def rows_into(out: np.ndarray, dim: int, chain: Chain | None) -> Callable[[Piece, Message], None]:
    """What a pull does with each piece's answer: its rows written into ``out`` (float32, or
    int32 taking each value converted as ``astype`` converts) at the rows the piece's keys
    came from (``Piece.extra``): decoded there by the reply's filters where they can
    (``unpack_rows``: ``sparse``), else decoded and copied over."""
    def on_piece(piece: Piece, msg: Message) -> None:
        arrays = unpack_rows(chain, msg.header, msg.arrays, piece.extra, out) if chain is not None else msg.arrays
        if arrays is not None:
            scatter_answer(_rows_of(arrays, piece, dim), piece.extra, out)
    return on_piece


class Verdict(Enum):
    DONE = "done"  # the piece is answered: use the reply
    RESEND = "resend"  # route it again with the newest ring and send it
    FAIL = "fail"  # the call fails with ``error``


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    delay_s: float = 0.0  # RESEND: after this long
    refresh: bool = False  # RESEND: ask the scheduler for the ring first (the server knows a newer one)
    error: BaseException | None = None  # FAIL: why


@dataclass(frozen=True)
class Scheduler:
    """What a decision needs to know of the scheduler."""

    address: str
    heartbeat_timeout_s: float
    lost: bool = False  # declared lost by this client: silent past the heartbeat timeout
    gone: Callable[[], bool] = lambda: False  # its process is known to be dead (asked only when lost)


def decide(piece: Piece, tries: int, msg: Message | None, exc: BaseException | None, *, ring_version: int,
           now: float, deadline: float, scheduler: Scheduler) -> Decision:
    """What the answer to ``piece`` (sent for the ``tries``-th time) means, with the
    client's ring at ``ring_version``, at ``now``, the call failing at ``deadline``."""
    if exc is None and msg is not None and msg.op is Op.ERROR:
        exc = raised(msg.header.get("code"), str(msg.header.get("error")))
    if isinstance(exc, KeyCacheMissError) and now < deadline:  # nothing applied: again, with the keys
        return Decision(Verdict.RESEND)
    routing = isinstance(exc, (StaleRingError, NodeLostError))
    if routing and scheduler.lost and (now >= deadline or scheduler.gone()):
        # without a scheduler the servers serve no more (their leases ran out) and no ring can change:
        # a scheduler whose process is gone fails the call now, one only silent (stalled?) at the deadline
        return Decision(Verdict.FAIL, error=NodeLostError(
            f"the scheduler at {scheduler.address} stopped answering (declared lost after "
            f"{scheduler.heartbeat_timeout_s:g} s of silence), so the servers serve no more (their leases ran "
            f"out): restart the cluster, and resume from a checkpoint if there is one ({exc})"))
    if routing and now < deadline:  # the ring changed under this piece: once ours is newer, route it again
        newer = ring_version > piece.ring_version
        refresh = not newer and msg is not None and msg.header.get("ring_version", 0) > ring_version
        return Decision(Verdict.RESEND, 0.0 if newer else min(MAX_BACKOFF_S, 0.01 * 2 ** min(tries, 6)), refresh)
    if exc is not None:
        return Decision(Verdict.FAIL, error=exc)
    return Decision(Verdict.DONE)


class Gather:
    """The unanswered pieces of one call, and whether it is over."""

    def __init__(self, pieces: int) -> None:
        self.pending = pieces
        self.over = pieces == 0
        self.error: BaseException | None = None

    def rerouted(self, pieces: int) -> bool:
        """One piece was routed again as ``pieces``; whether that finished the call (none)."""
        self.pending += pieces - 1
        return self._finished()

    def answered(self) -> bool:
        """One piece is done; whether that finished the call."""
        self.pending -= 1
        return self._finished()

    def fail(self, error: BaseException) -> bool:
        """The call fails; whether this is news (it was not over)."""
        if self.over:
            return False
        self.over, self.error = True, error
        return True

    def _finished(self) -> bool:
        if self.over or self.pending:
            return False
        self.over = True
        return True


def remote_error(msg: Message) -> ParamServerError:
    """The exception an ERROR reply stands for (``errors.Code``'s table)."""
    return raised(msg.header.get("code"), str(msg.header.get("error")))
