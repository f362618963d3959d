"""Messages on the wire: a msgpack header frame followed by raw array frames.

    frame 0   msgpack map {"op": "pull", "id": 17, "arrays": [["<u8", [n]], ...], ...}
    frame 1.. the arrays' bytes, C order, exactly as the header describes them

Arrays that together take less than ``PACK_BELOW`` go as **one** frame, each starting at a
multiple of 8 bytes (zero bytes between them): a frame costs each side a ZeroMQ call, a
``zmq.Frame`` and a release of the GIL, ~5 µs of a step's ~30 on a loaded machine, and a
frame that small is copied by the socket anyway.  ``decode`` tells the forms apart by
the frames that follow: one for two arrays or more is the packed body.

Nothing is ever unpickled: a header is plain msgpack data (maps, lists, str, int,
float, bool, nil), an array is a dtype from ``DTYPES`` and a shape.  ``decode`` checks
everything a peer could get wrong and raises ``ProtocolError`` naming it, so a node can
answer with an error reply and keep serving.  See docs/protocol.md.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from paramserver.errors import Code, ProtocolError, code_of

#: Array dtypes allowed on the wire (little-endian).
DTYPES: dict[str, np.dtype] = {
    np.dtype(t).str: np.dtype(t)
    for t in ("<u8", "<i8", "<u4", "<i4", "<u2", "<f4", "<f8", "|u1")
}

#: Default cap on one message's total size; bigger batches must be split by the sender.
MAX_MESSAGE_BYTES = 1 << 30
#: a message's arrays under this many bytes in all go as one frame (``wire/sockets.COPY_BELOW``:
#: frames that small are copied into ZeroMQ's buffers; bigger ones go out zero-copy, a frame each)
PACK_BELOW = 1 << 20
#: where a packed body's arrays start: a multiple of this
PACK_ALIGN = 8
_PADDING = bytes(PACK_ALIGN)


class Op(str, enum.Enum):  # noqa: UP042 (str(Op.X) stays "Op.X" in logs; StrEnum would print the value)
    """Every operation a node understands (``docs/protocol.md`` has the fields)."""

    # replies
    OK = "ok"
    ERROR = "error"
    # scheduler
    REGISTER = "register"
    HEARTBEAT = "heartbeat"
    LEAVE = "leave"
    CREATE_TABLE = "create_table"
    DROP_TABLE = "drop_table"
    TABLE_INFO = "table_info"
    BARRIER = "barrier"
    SHUTDOWN = "shutdown"
    WAIT_WORKERS = "wait_workers"
    JOB_START = "job_start"
    JOB_ADD = "job_add"
    NEXT_SHARD = "next_shard"
    SHARD_DONE = "shard_done"
    JOB_STATUS = "job_status"
    PROGRESS = "progress"
    # scheduler -> nodes (notifications)
    RING = "ring"
    NODE_LOST = "node_lost"
    WORKERS = "workers"
    STOP = "stop"
    # servers
    PULL = "pull"
    PREFETCH = "prefetch"  # keys a later pull or push will name: a tiered table reads their cold rows ahead
    PUSH = "push"
    STEP = "step"  # a mini-batch's gradient computed and applied by the server (tables/steps.py)
    CLOCK = "clock"
    STATS = "stats"
    PING = "ping"  # a round trip and nothing else: a link's floor (apps/ctr/depth.py)
    EXPORT = "export"
    NAMESPACE = "namespace"  # scheduler -> servers: a namespace's quota
    CREATE_NAMESPACE = "create_namespace"
    DROP_NAMESPACE = "drop_namespace"
    CALL = "call"  # a server-side function (paramserver.tables.functions)
    CHECKPOINT = "checkpoint"
    RESTORE = "restore"
    # server -> server
    REPLICATE = "replicate"  # a push, forwarded by the primary to a backup
    INSTALL = "install"  # a whole vnode, copied to a server that will hold it
    # membership changes (scheduler <-> servers, clients -> scheduler)
    MIGRATE = "migrate"  # scheduler -> source server: copy these vnodes there
    MIGRATED = "migrated"  # source server -> scheduler: copies acknowledged
    REMOVE_SERVER = "remove_server"
    CLUSTER_INFO = "cluster_info"
    WAIT_SERVERS = "wait_servers"
    # a link between two processes of one program (wire/link.py: a pipeline's stages)
    LINK = "link"
    BATCH = "batch"  # an envelope of requests to one server, or of their answers (wire/batch.py)


class Message:
    """A decoded message: ``header`` (dict) and ``arrays`` (list of ndarrays)."""

    __slots__ = ("header", "arrays")

    def __init__(self, header: dict[str, Any], arrays: list[np.ndarray]):
        self.header = header
        self.arrays = arrays

    @property
    def op(self) -> Op:
        value = self.header["op"]
        found = _OP_OF.get(value) if isinstance(value, str) else None
        return Op(value) if found is None else found  # a dict lookup: Op(value) cost ~10 of a request's µs

    @property
    def id(self) -> Any:
        return self.header.get("id")

    def __repr__(self) -> str:
        shapes = [a.shape for a in self.arrays]
        return f"Message({self.header.get('op')}, id={self.id}, arrays={shapes})"


def encode(header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> list[Any]:
    """Frames for ``header`` and ``arrays``: one frame of them all under ``PACK_BELOW``
    bytes, else a frame each (sent zero-copy by the socket)."""
    specs = []
    parts: list[np.ndarray] = []
    packed = 0  # the packed body's bytes
    for a in arrays:
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        name = a.dtype.str
        if name not in DTYPES:
            raise TypeError(f"dtype {a.dtype} cannot go on the wire (allowed: {sorted(DTYPES)})")
        specs.append([name, list(a.shape)])
        parts.append(a)
        packed += _padded(a.nbytes)
    head = msgpack.packb({**header, "arrays": specs}, use_bin_type=True)
    if len(parts) > 1 and packed < PACK_BELOW:  # arrays are buffers: joined as their bytes, each padded
        body: list[Any] = []
        for a in parts:
            body.append(a)
            body.append(_PADDING[:-a.nbytes % PACK_ALIGN])
        return [head, b"".join(body)]
    return [head, *(a.reshape(-1).view(np.uint8).data if a.nbytes else b"" for a in parts)]


def _padded(nbytes: int) -> int:
    return nbytes + -nbytes % PACK_ALIGN


def decode(frames: Sequence[Any], max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Parse and validate frames (``bytes`` or ``zmq.Frame``) into a ``Message``.

    Raises:
        ProtocolError: the header is not a msgpack map, the op is unknown, an array's
            dtype is not allowed, or a frame's size differs from its header entry.
    """
    if not frames:
        raise ProtocolError("empty message")
    buffers = [getattr(f, "buffer", f) for f in frames]
    if memoryview(buffers[0]).nbytes > 1 << 20:
        raise ProtocolError("header frame larger than 1 MiB")
    try:
        header = msgpack.unpackb(buffers[0], raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"header is not valid msgpack: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a msgpack map, got {type(header).__name__}")
    try:
        total = sum(memoryview(b).nbytes for b in buffers)
        if total > max_bytes:
            raise ProtocolError(f"message of {total} bytes exceeds the limit of {max_bytes}; split the batch")
        op = header.get("op")
        if not isinstance(op, str) or op not in _OPS:
            raise ProtocolError(f"unknown op {op!r} (known: {sorted(_OPS)})")
        if op == "batch":  # an envelope: its frames are its parts, each decoded on its own (wire/batch.py)
            return Message(header, [])
        specs = header.get("arrays", [])
        if isinstance(specs, list) and len(specs) > 1 and len(buffers) == 2:
            arrays = _unpacked(specs, buffers[1])
        elif not isinstance(specs, list) or len(specs) != len(buffers) - 1:
            raise ProtocolError(f"header lists {len(specs) if isinstance(specs, list) else specs!r} "
                                f"arrays but {len(buffers) - 1} array frames follow")
        else:
            arrays = [_array(i, spec, buf) for i, (spec, buf) in enumerate(zip(specs, buffers[1:]))]
    except Exception as exc:  # whatever is wrong, the sender gets an error reply with its id
        err = exc if isinstance(exc, ProtocolError) else ProtocolError(f"malformed message: {exc!r}")
        request_id = header.get("id")
        err.request_id = request_id if isinstance(request_id, (int, str)) else None
        raise err from None
    return Message(header, arrays)


_OP_OF = {op.value: op for op in Op}
_MAX_DIM = 1 << 40  # a dimension past this is a malformed header, not an array
_OPS = set(_OP_OF)


def _spec(i: int, spec: Any) -> tuple[np.dtype, list[int], int]:
    """Array ``i``'s dtype, shape and bytes, as its header entry says them.  Exact types
    (``type(x) is``): msgpack gives plain lists, str and int, and a bool is no size."""
    if type(spec) is list and len(spec) == 2:
        name, shape = spec
        dtype = DTYPES.get(name) if type(name) is str else None
        if dtype is not None and type(shape) is list:
            n = dtype.itemsize
            for d in shape:
                if type(d) is not int or not 0 <= d < _MAX_DIM:
                    raise ProtocolError(f"array {i}: shape must be non-negative ints, got {shape!r}")
                n *= d  # Python ints: no wrap-around
            return dtype, shape, n
    raise ProtocolError(f"array {i}: spec must be [dtype, shape] with dtype in {sorted(DTYPES)}, got {spec!r}")


def _array(i: int, spec: Any, buf: Any) -> np.ndarray:
    dtype, shape, expected = _spec(i, spec)
    nbytes = memoryview(buf).nbytes
    if nbytes != expected:
        raise ProtocolError(f"array {i}: frame has {nbytes} bytes but {spec[0]}{tuple(shape)} "
                            f"needs {expected}")
    return _received(np.frombuffer(buf, dtype=dtype).reshape(shape))


def _unpacked(specs: list[Any], buf: Any) -> list[np.ndarray]:
    """The arrays of a packed body (``encode``): each at the next multiple of ``PACK_ALIGN``,
    a read-only view of the body (an unaligned one copied: ``_received``)."""
    found = [_spec(i, spec) for i, spec in enumerate(specs)]
    view = memoryview(buf)
    expected = sum(_padded(n) for _, _, n in found)
    if view.nbytes != expected:
        raise ProtocolError(f"the arrays' frame has {view.nbytes} bytes but the {len(specs)} arrays it packs "
                            f"need {expected} (each padded to {PACK_ALIGN})")
    if not view.readonly:
        view = view.toreadonly()
    arrays, at = [], 0
    for dtype, shape, n in found:
        if n:
            arr = np.frombuffer(view, dtype, n // dtype.itemsize, at)
            if len(shape) != 1:
                arr = arr.reshape(shape)
            arrays.append(arr if arr.flags.aligned else _received(arr))
        else:
            arrays.append(_received(np.empty(shape, dtype)))
        at += _padded(n)
    return arrays


def _received(arr: np.ndarray) -> np.ndarray:
    """``arr`` as every received array is: numba compiles one kernel per (alignment,
    writability), so aligned (ZeroMQ does not promise it: copied) and read-only (a frame
    is writable, bytes not)."""
    if not arr.flags.aligned:
        arr = arr.copy()
    arr.setflags(write=False)
    return arr


def reply(request: Message | None, arrays: Sequence[np.ndarray] = (), **fields: Any) -> list[Any]:
    """Frames of an OK reply to ``request``."""
    return encode({"op": Op.OK.value, "id": request.id if request else None, **fields}, arrays)


def failed_request(exc: BaseException, default: Any = None) -> Any:
    """The id of the request ``exc`` refused: the one ``decode`` read from a malformed
    message, else ``default`` (the id of the message being handled, if any)."""
    found = getattr(exc, "request_id", None)
    return default if found is None else found


def error_code(exc: BaseException) -> Code:
    """The ``code`` of a node's error reply for ``exc`` (the table: ``errors.Code``)."""
    return code_of(exc)


def error_reply(request_id: Any, code: Code, text: str, **fields: Any) -> list[Any]:
    """Frames of an ERROR reply; ``code`` is machine-readable (one of ``errors.Code``), ``text`` for humans."""
    return encode({"op": Op.ERROR.value, "id": request_id, "code": str(code), "error": text, **fields})


#: the types a request's keys may go as (``expect``'s spec for them): 8 bytes, or 4 where every key
#: of the request is below 2^32 (``client.core.request`` narrows them), widened back on arrival
KEY_TYPES = ("<u8", "<u4")


def expect(msg: Message, *specs: tuple[str, str | tuple[str, ...], int]) -> list[np.ndarray]:
    """Check ``msg.arrays`` against ``(name, dtype, ndim)`` specs and return them.  A spec's
    dtype may be a tuple of types (``KEY_TYPES``): an array of a later one is widened to the
    first, in ``msg.arrays`` too, where a request served later (a pull the gate parked) reads it,
    and read-only where it was (numba compiles its kernels apart for writable arrays).

    Raises:
        ProtocolError: wrong count, dtype or number of dimensions.
    """
    if len(msg.arrays) != len(specs):
        raise ProtocolError(f"{msg.header['op']} takes {len(specs)} arrays "
                            f"({', '.join(s[0] for s in specs)}), got {len(msg.arrays)}")
    out, widened = list(msg.arrays), False
    for i, (a, (name, dtype, ndim)) in enumerate(zip(out, specs)):
        types = (dtype,) if isinstance(dtype, str) else dtype
        if a.ndim != ndim or a.dtype.str not in types:  # the specs name types as a dtype's .str does
            said = " or ".join(str(np.dtype(t)) for t in types)
            raise ProtocolError(f"{msg.header['op']}: {name} must be {ndim}-d {said}, got {a.ndim}-d {a.dtype}")
        if a.dtype.str != types[0]:
            wide = out[i] = a.astype(types[0])
            wide.flags.writeable = a.flags.writeable  # a frame's arrays are read-only: the kernels compiled for them
            widened = True
    if widened:
        msg.arrays = out
    return list(out)


def field(msg: Message, name: str, kind: type | tuple[type, ...]) -> Any:
    """A required header field of the given type, or ``ProtocolError``."""
    value = msg.header.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"{msg.header['op']}: field {name!r} must be {kind}, got {value!r}")
    return value
