"""Numba intrinsics for what numba's Python subset cannot say (``prefetch_row``,
``load_u64``, ``view_like``, ...), each a few lines of LLVM IR.

``prefetch_row(arr, r)`` asks the CPU to fetch row ``r`` of a 1-d or 2-d array into
cache (LLVM's ``llvm.prefetch``, for writing, high locality).  A table kernel touches one
random row per key; each is a cache miss (~100 ns from DRAM).  The loop body of an
optimiser update is long enough that the CPU keeps only a few of those misses in flight
by itself; issuing the fetch for the row needed ``PREFETCH_AHEAD`` keys later overlaps
them.  A prefetch never faults: an address out of the array is harmless, but callers
pass rows in range anyway.

``load_u64(buf, i)`` reads the 8 bytes ``buf[i:i+8]`` of a contiguous uint8 array as one
little-endian uint64 (an unaligned load, one instruction on x86-64 and arm64), so a
parser can look at 8 characters at once.  It does not check bounds: the caller keeps
``i + 8 <= buf.shape[0]``.

``f32_bits(x)`` and ``bits_f32(u)`` reinterpret a float32 as its uint32 bits and back
(``store/loops/compact.py``'s 16-bit row formats: numba has no float16 on the CPU).

``view_like(like, address, rows, stride)`` is an array of ``like``'s type over memory
given by address (``store/loops/views.py``: a vnode's arrays read from a directory of
addresses, without unboxing a list or counting a reference).

``frozen(a)`` is ``a`` as a read-only array, for the kernels' arguments that they only read.

``uncounted(fn)`` compiles a helper without numba's reference counts: one that a kernel
calls a token (or a key) with arrays, and that allocates none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

_I8P = ir.IntType(8).as_pointer()


def _prefetch(builder, address):
    """LLVM's prefetch of the line at ``address`` (an i8*): for writing, high locality, data."""
    i32 = ir.IntType(32)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [_I8P, i32, i32, i32]),
                                        "llvm.prefetch.p0")
    builder.call(fn, [address, i32(1), i32(3), i32(1)])  # write, keep, data


@intrinsic
def prefetch_row(typingctx, arr, row):
    sig = types.void(arr, row)

    def codegen(context, builder, signature, args):
        aryty, rowty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        index = [context.cast(builder, args[1], rowty, types.intp)]
        index += [context.get_constant(types.intp, 0)] * (aryty.ndim - 1)
        ptr = cgutils.get_item_pointer2(context, builder, data=ary.data, shape=cgutils.unpack_tuple(builder, ary.shape),
                                        strides=cgutils.unpack_tuple(builder, ary.strides), layout=aryty.layout,
                                        inds=index, wraparound=False)
        _prefetch(builder, builder.bitcast(ptr, _I8P))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def load_u64(typingctx, buf, i):
    if not (isinstance(buf, types.Array) and buf.ndim == 1 and buf.dtype == types.uint8 and buf.layout == "C"):
        return None  # numba reports "no matching definition" at compile time
    sig = types.uint64(buf, i)

    def codegen(context, builder, signature, args):
        aryty, ity = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = builder.gep(ary.data, [context.cast(builder, args[1], ity, types.intp)])
        return builder.load(builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)

    return sig, codegen


def frozen(a: np.ndarray) -> np.ndarray:
    """``a`` as a read-only array.  numba compiles a kernel once per argument type, and a
    writable array is another type than a read-only one: requests bring read-only frames,
    but a retried push's fresh part, a backup's held part, a BSP aggregate or an install
    are new (writable) arrays.  Each such call compiled a second specialisation inside the
    serving loop on a fresh install (10-25 s, long enough to be declared dead mid-repair):
    every array a kernel only reads goes in read-only, so the warm-up's are the only ones."""
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


def uncounted(fn: Callable[..., Any]) -> Any:
    """``fn`` compiled (nogil, cached) without reference counts (numba's ``_nrt=False``).  A
    numba function counts a reference to each array it is given, in and out (``NRT_incref``
    and ``NRT_decref``, an atomic add each), and LLVM's pruning of those pairs does not reach
    across a helper's loops and branches, inlined or not: four such helpers cost the LDA word
    draw's kernel 15 % of its time (``apps/rounds/lda_words``).  Such a helper must allocate
    nothing (no arrays made, none returned)."""
    options: dict[str, Any] = {"_nrt": False, "nogil": True, "cache": True}  # _nrt: not in numba's stubs
    return njit(**options)(fn)


def _bitcast(name, kind, result, llvm_result, doc):
    """An intrinsic that reads the bits of a 32-bit ``kind`` value as a ``result`` (an LLVM
    bitcast: no instruction)."""
    def reinterpret(typingctx, x):
        if not isinstance(x, kind) or x.bitwidth != 32:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], llvm_result)

        return result(x), codegen

    reinterpret.__name__ = reinterpret.__qualname__ = name
    reinterpret.__doc__ = doc
    return intrinsic(reinterpret)


f32_bits = _bitcast("f32_bits", types.Float, types.uint32, ir.IntType(32), "The bits of float32 ``x`` as a uint32.")
bits_f32 = _bitcast("bits_f32", types.Integer, types.float32, ir.FloatType(), "The float32 with uint32 ``x``'s bits.")


@intrinsic
def prefetch_address(typingctx, address):
    """Prefetch (for writing, high locality) the line at ``address``, an integer such as
    ``arr.ctypes.data + offset``: a loop that fetches ahead across many arrays keeps
    addresses, not the arrays (``store/loops/slots.py``)."""
    if not isinstance(address, types.Integer):
        return None
    sig = types.void(address)

    def codegen(context, builder, signature, args):
        _prefetch(builder, builder.inttoptr(args[0], _I8P))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def view_like(typingctx, like, address, rows, stride):
    """An array of ``like``'s type over the memory at ``address``: ``rows`` rows ``stride``
    bytes apart, its other dimensions and strides ``like``'s.  It owns nothing: whoever
    calls keeps the memory alive (``store/directory.py``: a directory of arrays by address,
    which a compiled call reads without unboxing a list or counting references)."""
    if not (isinstance(like, types.Array) and all(isinstance(t, types.Integer) for t in (address, rows, stride))):
        return None
    sig = like(like, address, rows, stride)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        src = context.make_array(aryty)(context, builder, args[0])
        out = context.make_array(aryty)(context, builder)
        shape = cgutils.unpack_tuple(builder, src.shape)
        strides = cgutils.unpack_tuple(builder, src.strides)
        shape[0] = context.cast(builder, args[2], signature.args[2], types.intp)
        strides[0] = context.cast(builder, args[3], signature.args[3], types.intp)
        data = builder.inttoptr(context.cast(builder, args[1], signature.args[1], types.intp), src.data.type)
        populate_array(out, data=data, shape=shape, strides=strides, itemsize=src.itemsize, meminfo=None)
        return out._getvalue()

    return sig, codegen


@intrinsic
def _sqrt_pair(typingctx, a, b):
    """``(sqrt(a), sqrt(b))`` of two float64s in one vector instruction (LLVM's
    ``llvm.sqrt.v2f64``): the same bits as two ``math.sqrt`` (IEEE square roots are
    exact to the rounding), half the square-root unit's work.  FTRL takes two a key
    (``tables/update_rules._ftrl``), which bound its arithmetic: 6.7 -> 5.6 ns a key alone."""
    if not (isinstance(a, types.Float) and isinstance(b, types.Float)):
        return None
    sig = types.UniTuple(types.float64, 2)(types.float64, types.float64)

    def codegen(context, builder, signature, args):
        pair = ir.VectorType(ir.DoubleType(), 2)
        at = [ir.Constant(ir.IntType(32), k) for k in (0, 1)]
        xs = [context.cast(builder, x, t, types.float64) for x, t in zip(args, signature.args)]
        v = builder.insert_element(builder.insert_element(ir.Constant(pair, ir.Undefined), xs[0], at[0]), xs[1], at[1])
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(pair, [pair]), "llvm.sqrt.v2f64")
        r = builder.call(fn, [v])
        return context.make_tuple(builder, signature.return_type, tuple(builder.extract_element(r, k) for k in at))

    return sig, codegen


#: ``_sqrt_pair`` as compiled code calls it (the type checker sees the intrinsic's ``typingctx``)
sqrt_pair = cast(Callable[[float, float], tuple[float, float]], _sqrt_pair)
