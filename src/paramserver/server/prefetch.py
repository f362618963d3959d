"""``prefetch_row(arr, r)``: a numba intrinsic that asks the CPU to fetch row ``r`` of a
1-d or 2-d array into cache (LLVM's ``llvm.prefetch``, for writing, high locality).

A table kernel touches one random row per key; each is a cache miss (~100 ns from
DRAM).  The loop body of an optimiser update is long enough that the CPU keeps only a
few of those misses in flight by itself; issuing the fetch for the row needed
``PREFETCH_AHEAD`` keys later overlaps them.  A prefetch never faults: an address out of
the array is harmless, but callers pass rows in range anyway.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


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
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(1), i32(3), i32(1)])  # write, keep, data
        return context.get_dummy_value()

    return sig, codegen
