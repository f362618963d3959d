"""The seam every filter plugs into: ``Filter``, and the state a filter may keep per link.

A message's data are its *parts*, named arrays: a push has ``keys``, ``values``,
``vnodes`` and ``counts``; a pull request ``keys``, ``vnodes`` and ``counts``; a pull
reply ``values``.  A filter's ``encode`` changes the parts in place (drops one, replaces
one by bytes) and returns its parameters for this message, which travel in the header;
its ``decode`` undoes that from the parts and those parameters alone, so a receiver needs
no side channel.  A chain (``filters/chain.py``) runs the encoders in order and the
decoders in reverse.

What a filter may keep between messages lives in a ``Context``: on the sender, a
``Link`` per server (the key lists that server was sent whole); on a server, its
``KeyStore`` (the key lists it was sent, by signature).  A filter that changes values
(``lossless = False``) also says what the receiver will decode (``roundtrip``), which is
what lets a client keep the difference as a residual and add it to the next push
(error feedback, ``filters/residual.py``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from paramserver.errors import ConfigError, ProtocolError
from paramserver.filters.kernels import digest128

Parts = dict[str, np.ndarray]
#: the parts of each kind of message, in the order its arrays go on the wire
PARTS: dict[str, tuple[str, ...]] = {
    "push": ("keys", "values", "vnodes", "counts"),
    "pull": ("keys", "vnodes", "counts"),
    "reply": ("values",),
}
#: what a filter works on, in the order a chain must list them: value codecs see float32
#: values, byte compressors whatever the others left (``Chain`` checks the order)
STAGES = ("select", "values", "keys", "bytes")


class Filter:
    """A filter of the keys and values of a message; subclass it and name the subclass
    by ``"module:Class"`` (``create_table(filters={"push": ["mypkg.filters:Mine"]})``).

    Class attributes:
        stage: ``"values"`` (changes the float32 ``values``), ``"keys"`` (the keys),
            ``"bytes"`` (any part, as bytes) or ``"select"`` (chooses which keys a
            worker sends; ``select`` runs on the worker, not on the wire).
        lossless: whether ``decode(encode(parts))`` gives the parts back bit for bit.
        directions: the directions it may be listed for (``push``, ``pull``, ``reply``).

    ``__init__`` takes the filter's settings from its spec (``"int8:block=128"`` gives
    ``block=128``, as numbers); they must be plain msgpack values.
    """

    stage: ClassVar[str] = "bytes"
    lossless: ClassVar[bool] = True
    ordered: ClassVar[bool] = False  # it packs keys smaller when each vnode's lie in dense-position order
    takes_packed: ClassVar[bool] = False  # its encode takes a push's values as ``PackedRows`` (filters/packed.py)
    directions: ClassVar[tuple[str, ...]] = ("push", "pull", "reply")
    name: str = ""  # the name it was listed by (set by the chain)

    def __init__(self, **settings: Any) -> None:
        self.settings = settings

    def encode(self, parts: Parts, ctx: Context) -> dict[str, Any]:
        """Change ``parts`` in place; return the parameters ``decode`` needs (msgpack values)."""
        raise NotImplementedError

    def decode(self, parts: Parts, params: dict[str, Any], ctx: Context) -> None:
        """Undo ``encode`` in place; raise ``ProtocolError`` for parts it cannot read."""
        raise NotImplementedError

    def decode_rows(self, parts: Parts, params: dict[str, Any], index: np.ndarray, out: np.ndarray) -> bool:
        """A pull reply's values decoded straight into the puller's rows, where this filter
        was the first to encode them (the last to decode): row ``i`` into ``out[index[i]]``
        (``out`` float32, or int32 taking each value converted as ``astype`` converts), the
        values' parts taken out of ``parts``; True once done.  False (the default), ``parts``
        left as they were: this filter cannot (or it would be no faster), ``decode`` runs and
        the rows are copied over."""
        return False

    def masked(self, parts: Parts, params: dict[str, Any]) -> tuple[tuple[int, ...], np.ndarray, np.ndarray] | None:
        """A push's values as this filter packed them, where it was the first to encode them
        (the last to decode) and packs them as a bit mask of their non-zero values and those
        values (bit ``i & 7`` of byte ``i >> 3`` marks value ``i``, the words a float32 array's
        uint32 view): ``(shape, mask, words)``, the values' parts taken out of ``parts``, for a server
        that adds them where they land (``VnodeStore.add_masked``).  None (the default),
        ``parts`` left as they were: ``decode`` makes them dense."""
        return None

    def roundtrip(self, values: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """What the receiver decodes for ``values`` (a lossy value codec's rounding)."""
        return values

    def __repr__(self) -> str:
        args = ",".join(f"{k}={v}" for k, v in self.settings.items())
        return f"{self.name or type(self).__name__}{':' + args if args else ''}"


def signature(keys: np.ndarray) -> bytes:
    """A 128-bit digest of a key list (``kernels.digest128``): what names it in a cache."""
    a, b = digest128(np.ascontiguousarray(keys, np.uint64), 0x5EED)
    return int(a).to_bytes(8, "little") + int(b).to_bytes(8, "little")


class Link:
    """A sender's state towards one server: the signatures of the key lists it sent that
    server whole (the newest ``capacity``).  Kept only as a guess: the server may have
    dropped any of them, and says so (``KeyCacheMissError``)."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self.sent: OrderedDict[bytes, None] = OrderedDict()

    def knows(self, sig: bytes) -> bool:
        if sig in self.sent:
            self.sent.move_to_end(sig)
            return True
        return False

    def sent_whole(self, sig: bytes) -> None:
        self.sent[sig] = None
        self.sent.move_to_end(sig)
        while len(self.sent) > self.capacity:
            self.sent.popitem(last=False)


class KeyStore:
    """A server's key lists by signature, least recently used dropped past ``max_bytes``.
    Content-addressed: a list is stored under the digest of what arrived, recomputed
    here, so a sender cannot name a list it did not send."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.entries: OrderedDict[bytes, tuple[np.ndarray, ...]] = OrderedDict()
        self.hits = self.misses = 0

    def put(self, sig: bytes, arrays: tuple[np.ndarray, ...]) -> None:
        size = sum(a.nbytes for a in arrays)
        if sig in self.entries or size > self.max_bytes:
            return
        self.entries[sig] = arrays
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= sum(a.nbytes for a in dropped)

    def get(self, sig: bytes) -> tuple[np.ndarray, ...] | None:
        found = self.entries.get(sig)
        if found is None:
            self.misses += 1
            return None
        self.entries.move_to_end(sig)
        self.hits += 1
        return found


@dataclass
class Context:
    """What a filter may use besides the parts: the sender's ``link`` to the receiver and
    whether this is a resend (``whole``: a retry sends key lists whole, which is how a
    miss heals), or the receiver's ``store``."""

    link: Link | None = None
    store: KeyStore | None = None
    whole: bool = False
    layout: int = 0  # the table's layout (``TableSpec.layout``): a dense one gives keys positions
    scratch: dict[str, Any] = field(default_factory=dict)


def blob(parts: Parts, name: str, what: str) -> np.ndarray:
    """Part ``name`` as the bytes a filter wrote, or ``ProtocolError``."""
    a = parts.get(name)
    if a is None or a.dtype != np.uint8 or a.ndim != 1:
        raise ProtocolError(f"{what}: part {name!r} must be a 1-d byte array, got "
                            f"{None if a is None else (a.dtype.str, a.shape)}")
    return a


def shape_param(params: dict[str, Any], what: str) -> tuple[int, ...]:
    shape = params.get("shape")
    if (not isinstance(shape, list) or not shape or len(shape) > 2
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape)):
        raise ProtocolError(f"{what}: parameter 'shape' must be a list of 1 or 2 sizes, got {shape!r}")
    return tuple(shape)


def setting(settings: dict[str, Any], name: str, default: float, low: float, high: float, what: str) -> float:
    """A numeric setting of a filter's spec within [low, high], or ``ConfigError``."""
    value = settings.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(f"filter {what}: {name} must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)
