"""The built-in filters, named in a table's spec as ``keycache``, ``delta``, ``zstd``,
``sparse``, ``fp16``, ``bf16``, ``int8`` and ``sigmod`` (docs/filters.md has what each buys).

Lossless: ``keycache`` (a key list the server holds goes as its signature), ``delta``
(keys as variable-length differences), ``zstd`` (each big part compressed), ``sparse``
(values mostly zero as a mask and the rest).  Lossy
value codecs for pushes (with error feedback, on the worker) and pull replies:
``fp16``, ``bf16``, ``int8`` (a power-of-two scale per block of rows).  ``sigmod`` (the
significantly-modified filter) picks which keys a worker pushes at all.
"""

from __future__ import annotations

import math
import threading
from typing import Any, ClassVar

import numpy as np
import zstandard

from paramserver.errors import KeyCacheMissError, ProtocolError
from paramserver.filters.base import Context, Filter, Parts, blob, setting, shape_param, signature
from paramserver.filters.kernels import (
    bf16_decode,
    bf16_encode,
    int8_decode,
    int8_encode,
    int8_roundtrip,
    sparse_decode,
    sparse_decode_rows,
    sparse_encode,
    varint_decode,
    varint_encode,
)
from paramserver.filters.packed import PackedRows
from paramserver.routing.hashing import from_positions, to_positions
from paramserver.routing.partition import positioned
from paramserver.wire.message import DTYPES, MAX_MESSAGE_BYTES

FP16_MAX = 65504.0


class KeyCache(Filter):
    """A key list the server was sent whole before goes as its 16-byte signature.  The
    server keeps the lists it was sent in a bounded store (``KeyStore``); one it no longer
    holds is refused with ``KeyCacheMissError`` before anything is applied, and the
    client resends the request whole (a resend never uses a signature).  Lists shorter
    than ``min_keys`` (default 16) always go whole."""

    stage = "keys"
    directions = ("push", "pull")

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.min_keys = int(setting(settings, "min_keys", 16, 1, 1 << 40, "keycache"))

    def encode(self, parts: Parts, ctx: Context) -> dict[str, Any]:
        keys = parts.get("keys")
        if keys is None or ctx.link is None or keys.shape[0] < self.min_keys:
            return {}
        sig = signature(keys)
        if not ctx.whole and ctx.link.knows(sig):
            del parts["keys"]
            return {"sig": sig, "n": int(keys.shape[0])}
        ctx.link.sent_whole(sig)
        return {"sig": sig, "keep": True}

    def decode(self, parts: Parts, params: dict[str, Any], ctx: Context) -> None:
        sig = params.get("sig")
        if not params:
            return
        if not isinstance(sig, bytes) or len(sig) != 16:
            raise ProtocolError(f"keycache: parameter 'sig' must be 16 bytes, got {sig!r}")
        if ctx.store is None:
            raise ProtocolError("keycache: this receiver keeps no key lists")
        if "keys" in parts:
            keys = parts["keys"]
            if signature(keys) != sig:
                raise ProtocolError("keycache: the keys sent do not have the signature named")
            ctx.store.put(sig, (keys,))
            return
        found = ctx.store.get(sig)
        n = params.get("n")
        if found is None:
            raise KeyCacheMissError(f"key list {sig.hex()[:12]}... ({n} keys) is not held here (evicted, or "
                                    "this server restarted): send it whole")
        if found[0].shape[0] != n:
            raise ProtocolError(f"keycache: key list {sig.hex()[:12]}... holds {found[0].shape[0]} keys, not {n}")
        parts["keys"] = found[0]


class Delta(Filter):
    """Keys as the zigzag of each difference from the key before, in a variable-length
    code: a batch's sorted keys take 1–3 bytes each instead of 8 (any order round-trips).
    A dense table's keys go as their dense positions, which the client routes in order
    within each vnode (``ordered``): they lie close together, and take 1–2 bytes."""

    stage = "keys"
    directions = ("push", "pull")
    ordered = True

    def encode(self, parts: Parts, ctx: Context) -> dict[str, Any]:
        keys = parts.get("keys")
        if keys is None:
            return {}
        if positioned(ctx.layout):
            parts["keys"] = varint_encode(to_positions(keys, ctx.layout))
            return {"n": int(keys.shape[0]), "pos": True}
        parts["keys"] = varint_encode(keys)
        return {"n": int(keys.shape[0])}

    def decode(self, parts: Parts, params: dict[str, Any], ctx: Context) -> None:
        if not params:
            return
        n = params.get("n")
        coded = blob(parts, "keys", "delta")
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= coded.nbytes:  # a key takes a byte at least
            raise ProtocolError(f"delta: parameter 'n' must be the count of keys coded in {coded.nbytes} bytes, "
                                f"got {n!r}")
        keys, status = varint_decode(coded, n)
        if status:
            why = ("", "truncated", "longer than its keys", "corrupt")[status]
            raise ProtocolError(f"delta: the key code is {why}")
        if params.get("pos"):
            if not positioned(ctx.layout):
                raise ProtocolError("delta: keys sent as dense positions to a table without them")
            keys = from_positions(keys, ctx.layout)
        parts["keys"] = keys


class Zstd(Filter):
    """Each part of at least ``min_bytes`` (default 4096) compressed with zstd at ``level``
    (default 1), when that makes it smaller."""

    stage = "bytes"
    _local = threading.local()

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.level = int(setting(settings, "level", 1, -7, 22, "zstd"))
        self.min_bytes = int(setting(settings, "min_bytes", 4096, 0, 1 << 30, "zstd"))

    def _codec(self) -> tuple[Any, Any]:
        cached = getattr(self._local, "codecs", None)
        if cached is None or cached[0] != self.level:
            cached = (self.level, zstandard.ZstdCompressor(level=self.level), zstandard.ZstdDecompressor())
            self._local.codecs = cached
        return cached[1], cached[2]

    def encode(self, parts: Parts, ctx: Context) -> dict[str, Any]:
        packer, _ = self._codec()
        done: dict[str, Any] = {}
        for name, a in list(parts.items()):
            if a.nbytes < max(self.min_bytes, 1):
                continue
            packed = packer.compress(np.ascontiguousarray(a).view(np.uint8).data)
            if len(packed) < a.nbytes:
                parts[name] = np.frombuffer(packed, np.uint8)
                done[name] = [a.dtype.str, list(a.shape)]
        return {"parts": done} if done else {}

    def decode(self, parts: Parts, params: dict[str, Any], ctx: Context) -> None:
        packed = params.get("parts", {})
        if not isinstance(packed, dict):
            raise ProtocolError(f"zstd: parameter 'parts' must be a map, got {packed!r}")
        _, unpacker = self._codec()
        for name, spec in packed.items():
            dtype = _wire_dtype(spec, name)
            shape = shape_param({"shape": spec[1]}, f"zstd part {name!r}")
            size = math.prod(shape) * dtype.itemsize  # Python ints: no wrap-around
            if size > MAX_MESSAGE_BYTES:  # a claimed size is checked before anything is allocated
                raise ProtocolError(f"zstd: part {name!r} would decompress to {size} bytes, over the limit of "
                                    f"{MAX_MESSAGE_BYTES}")
            try:
                raw = unpacker.decompress(blob(parts, name, "zstd").data, max_output_size=size)
            except zstandard.ZstdError as exc:
                raise ProtocolError(f"zstd: part {name!r} does not decompress: {exc}") from None
            if len(raw) != size:
                raise ProtocolError(f"zstd: part {name!r} decompresses to {len(raw)} bytes, not {size}")
            parts[name] = np.frombuffer(raw, dtype).reshape(shape)


def _wire_dtype(spec: Any, name: str) -> np.dtype:
    ok = isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], str) and spec[0] in DTYPES
    if not ok:
        raise ProtocolError(f"zstd: part {name!r} must be described as [dtype, shape], got {spec!r}")
    return DTYPES[spec[0]]


#: values a row from which ``sparse`` decodes a reply straight into the puller's rows: below,
#: decoding whole and copying the rows over is as fast or faster (1 536 rows, ms, in place
#: against copied, converted to int32: 50 values at 30 % non-zero 0.115 against 0.079, at 5 %
#: 0.046 against 0.048; 128 at 10 % 0.19 against 0.25; 1 000 at 2 % 0.70 against 1.66)
ROWS_IN_PLACE = 128


class Sparse(Filter):
    """Values that are mostly zero (counts a topic model moves, the rows of a wide and
    sparse table) as a mask of one bit a value and the non-zero values, bit for bit (a
    value is zero when all its bits are: -0.0 travels).  Used only where it takes at least
    ``1 - keep`` (default 1/8) off the values' bytes; denser values go as they are, for a
    pass over them."""

    stage = "values"
    directions = ("push", "reply")
    takes_packed = True

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.keep = setting(settings, "keep", 0.875, 0.0, 1.0, "sparse")

    def encode(self, parts: Parts, ctx: Context) -> dict[str, Any]:
        values: Any = parts.get("values")
        if isinstance(values, PackedRows):  # packed by its producer: on the wire as it is
            if values.packed_nbytes <= self.keep * values.nbytes:
                parts["values"], parts["values.mask"] = values.words.view(np.uint8), values.mask
                return {"shape": list(values.shape)}
            values = parts["values"] = values.dense()  # denser than packing pays for: as it is
        if values is None or values.dtype != np.float32 or values.ndim != 2 or not values.size:
            return {}
        mask, words = sparse_encode(np.ascontiguousarray(values).reshape(-1).view(np.uint32))
        if mask.nbytes + words.nbytes > self.keep * values.nbytes:
            return {}
        parts["values"], parts["values.mask"] = words.view(np.uint8), mask
        return {"shape": list(values.shape)}

    def decode(self, parts: Parts, params: dict[str, Any], ctx: Context) -> None:
        shape, mask, packed = self._packed(parts, params)
        words, status = sparse_decode(mask, packed, math.prod(shape))
        if status:
            raise self._unfit(mask, packed, shape)
        del parts["values.mask"]
        parts["values"] = words.view(np.float32).reshape(shape)

    def decode_rows(self, parts: Parts, params: dict[str, Any], index: np.ndarray, out: np.ndarray) -> bool:
        if out.shape[1] < ROWS_IN_PLACE:
            return False
        shape, mask, packed = self._packed(parts, params)
        if shape != (index.shape[0], out.shape[1]):
            raise ProtocolError(f"sparse: values of shape {shape} answer {index.shape[0]} rows of "
                                f"{out.shape[1]} values")
        exact = out.dtype == np.float32  # bit for bit; int32 rows take each value converted
        if sparse_decode_rows(mask, packed if exact else packed.view(np.float32), index,
                              out.view(np.uint32) if exact else out):
            raise self._unfit(mask, packed, shape)
        del parts["values.mask"], parts["values"]
        return True

    def masked(self, parts: Parts, params: dict[str, Any]) -> tuple[tuple[int, ...], np.ndarray, np.ndarray] | None:
        shape, mask, packed = self._packed(parts, params)
        del parts["values.mask"], parts["values"]
        return shape, mask, packed

    @staticmethod
    def _packed(parts: Parts, params: dict[str, Any]) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
        """A message's sparse values checked: their shape, the mask and the words (uint32, aligned)."""
        shape = shape_param(params, "sparse")
        if len(shape) != 2:
            raise ProtocolError(f"sparse: values must be 2-d, got shape {shape}")
        packed, mask = blob(parts, "values", "sparse"), blob(parts, "values.mask", "sparse")
        if packed.nbytes % 4:
            raise ProtocolError(f"sparse: {packed.nbytes} bytes of values are not whole float32s")
        if math.prod(shape) * 4 > MAX_MESSAGE_BYTES:  # a claimed size is checked before anything is allocated
            raise ProtocolError(f"sparse: values of shape {shape} would take {math.prod(shape) * 4} bytes, over "
                                f"the limit of {MAX_MESSAGE_BYTES}")
        if not packed.flags.aligned or packed.ctypes.data % 4:
            packed = packed.copy()  # a frame's bytes at any address: numpy's copy is aligned
        return shape, mask, packed.view(np.uint32)

    @staticmethod
    def _unfit(mask: np.ndarray, packed: np.ndarray, shape: tuple[int, ...]) -> ProtocolError:
        return ProtocolError(f"sparse: a mask of {mask.nbytes} bytes and {packed.shape[0]} values do not "
                             f"make values of shape {shape}")


class _ValueCodec(Filter):
    """A lossy codec of the float32 ``values`` part (a push's, or a pull reply's)."""

    stage = "values"
    lossless = False
    directions = ("push", "reply")
    width: ClassVar[int] = 2  # bytes a value

    def encode(self, parts: Parts, ctx: Context) -> dict[str, Any]:
        values = parts.get("values")
        if values is None or values.dtype != np.float32:
            return {}
        parts["values"] = self._pack(np.ascontiguousarray(values), parts)
        return {"shape": list(values.shape)}

    def decode(self, parts: Parts, params: dict[str, Any], ctx: Context) -> None:
        if not params:
            return
        shape = shape_param(params, self.name)
        packed = blob(parts, "values", self.name)
        if packed.nbytes != math.prod(shape) * self.width:
            raise ProtocolError(f"{self.name}: {packed.nbytes} bytes cannot hold values of shape {shape}")
        parts["values"] = self._unpack(packed, shape, parts)

    def _pack(self, values: np.ndarray, parts: Parts) -> np.ndarray:
        raise NotImplementedError

    def _unpack(self, packed: np.ndarray, shape: tuple[int, ...], parts: Parts) -> np.ndarray:
        raise NotImplementedError


class Fp16(_ValueCodec):
    """Values as IEEE half floats (rounded to the nearest, clipped to ±65504)."""

    def _pack(self, values: np.ndarray, parts: Parts) -> np.ndarray:
        half: np.ndarray = np.clip(values, -FP16_MAX, FP16_MAX).astype(np.float16)
        return half.reshape(-1).view(np.uint8)

    def _unpack(self, packed: np.ndarray, shape: tuple[int, ...], parts: Parts) -> np.ndarray:
        return packed.view(np.float16).astype(np.float32).reshape(shape)

    def roundtrip(self, values: np.ndarray, counts: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.clip(values, -FP16_MAX, FP16_MAX).astype(np.float16).astype(np.float32)
        return out


class Bf16(_ValueCodec):
    """Values as bfloat16: float32's exponent, 8 bits of mantissa (rounded to the nearest)."""

    def _pack(self, values: np.ndarray, parts: Parts) -> np.ndarray:
        return bf16_encode(values).reshape(-1).view(np.uint8)

    def _unpack(self, packed: np.ndarray, shape: tuple[int, ...], parts: Parts) -> np.ndarray:
        return bf16_decode(packed.view(np.uint16)).reshape(shape)

    def roundtrip(self, values: np.ndarray, counts: np.ndarray) -> np.ndarray:
        out: np.ndarray = bf16_decode(bf16_encode(values)).reshape(values.shape)
        return out


class Int8(_ValueCodec):
    """Values as int8 with one power-of-two scale per block of at most ``block`` values
    (default 256; a block never spans two vnode segments), 1 byte a value plus 1 a block."""

    width = 1

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.block = int(setting(settings, "block", 256, 1, 1 << 20, "int8"))

    def _rows(self, dim: int) -> int:
        return max(1, self.block // max(dim, 1))

    @staticmethod
    def _counts(parts: Parts, n: int) -> np.ndarray:
        counts = parts.get("counts")
        return np.asarray(counts, np.int64) if counts is not None else np.array([n], np.int64)

    def encode(self, parts: Parts, ctx: Context) -> dict[str, Any]:
        values = parts.get("values")
        if values is None or values.dtype != np.float32 or values.ndim != 2:
            return {}
        q, exps = int8_encode(np.ascontiguousarray(values), self._counts(parts, values.shape[0]),
                              self._rows(values.shape[1]))
        parts["values"], parts["values.scale"] = q.view(np.uint8), exps.view(np.uint8)
        return {"shape": list(values.shape)}

    def decode(self, parts: Parts, params: dict[str, Any], ctx: Context) -> None:
        if not params:
            return
        shape = shape_param(params, "int8")
        if len(shape) != 2:
            raise ProtocolError(f"int8: values must be 2-d, got shape {shape}")
        q, exps = blob(parts, "values", "int8"), blob(parts, "values.scale", "int8")
        values, status = int8_decode(q.view(np.int8), exps.view(np.int8), self._counts(parts, shape[0]),
                                     self._rows(shape[1]), shape[1])
        if status or values.shape != shape:
            raise ProtocolError(f"int8: {q.nbytes} values and {exps.nbytes} block scales do not make values "
                                f"of shape {shape} in the request's segments")
        del parts["values.scale"]
        parts["values"] = values

    def roundtrip(self, values: np.ndarray, counts: np.ndarray) -> np.ndarray:
        out: np.ndarray = int8_roundtrip(np.ascontiguousarray(values, np.float32), counts, self._rows(values.shape[1]))
        return out


class SigMod(Filter):
    """The significantly-modified filter: a worker pushes a key's update only once the
    change it has gathered for it exceeds ``threshold`` (largest |value| of its row; default
    0.01) and keeps the rest; what it kept goes out every ``every`` clocks (default 10)
    and when the job ends (``Client.flush``).  Runs on the worker (``filters/residual.py``)."""

    stage = "select"
    lossless = False
    directions = ("push",)

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.threshold = setting(settings, "threshold", 0.01, 0.0, 1e30, "sigmod")
        self.every = int(setting(settings, "every", 10, 1, 1 << 30, "sigmod"))

    def encode(self, parts: Parts, ctx: Context) -> dict[str, Any]:
        return {}

    def decode(self, parts: Parts, params: dict[str, Any], ctx: Context) -> None:
        return None  # never on the wire


BUILTIN: dict[str, type[Filter]] = {"keycache": KeyCache, "delta": Delta, "zstd": Zstd, "sparse": Sparse,
                                    "fp16": Fp16, "bf16": Bf16, "int8": Int8, "sigmod": SigMod}
