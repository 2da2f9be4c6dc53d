"""A tree root's block in one pass: sum the inputs, store the result over every output.

At a tree's root a streamed float32 allreduce reduces, for each block, its local ranks'
buffers and its children's blocks, and the result is final: it goes down to the children
and over each local rank's buffer.  :func:`._blocks._reduce_in_place` does that a sub-block
at a time through the general kernel: the first four inputs into an accumulator, the rest
folded into the scratch block (from which the sends down read it), then one copy per rank
out of the scratch block; every step reads what the previous one wrote, out of L1.

:func:`sum_store` does all of it per 64-byte vector instead: it loads the vector of each
input, adds them left to right in registers (the general kernel's order, so the bits are
the same), divides by the ``avg`` divisor if there is one (float32 true division, as
:func:`._blocks._divide`), and stores the vector to every output: the ranks' buffers,
whose lines the loads have just brought into L1, and the first child's block, which the
engine then sends down (:func:`._blocks.up_chunk`), so no scratch block is written.

Measured on the forty-first VM (Intel family 6 model 207), one process per vCPU at once,
a 2-node root's half of 4 x 64 MiB float32 (4 ranks and a child, 512 KiB blocks), eight
runs: the sub-block path 16.7-21.8 ms, this pass (its result landing in the child's block)
11.3-13.2 ms, a C loop of the same shape (gcc -O2, AVX-512 intrinsics) 11.7-13.6 ms.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import kernels
from .jitcache import drop_stale
from .kernels import _voidptr

__all__ = ["VEC_ELEMENTS", "sum_store"]

#: float32 elements per vector of the pass (one 64-byte line)
VEC_ELEMENTS = 16
_I64 = ir.IntType(64)
_I32 = ir.IntType(32)

#: (inputs, outputs) counts whose loop is generated unrolled: a root's ``k`` ranks (2 to 8) and
#: ``m`` children (1 or 2) are ``k + m`` inputs and ``k + 1`` outputs (the first child's block and
#: the ranks' buffers); a ring's landing step's ``k + 1`` inputs and ``k`` outputs.  Unrolled, a
#: 2-node root's half (4 ranks, a child) took 0.83-0.96x the time of the loop over runtime
#: counts, which serves every other count
_UNROLLED = tuple(sorted({(k + m, k + 1) for k in range(2, 9) for m in (1, 2)}
                         | {(k + 1, k) for k in range(2, 9)}))


@intrinsic
def _sum_store_vectors(typingctx, ins, outs, nvec, divisor, has_div):  # type: ignore[no-untyped-def]
    """For ``i < nvec``: ``v = ((x0[i] + x1[i]) + ...)`` over the float32 <16 x float> vectors
    at the addresses in ``ins`` (an int64 array; at least one), ``v / divisor`` when
    ``has_div``, stored to the same vector of every address in ``outs`` (int64 array).

    Loads and stores assume 4-byte alignment only.  A ``switch`` on the two counts picks a
    loop generated for them (:data:`_UNROLLED`), else the loop over runtime counts; each
    comes with and without the division, chosen outside the loop."""
    if not all(isinstance(a, types.Array) and a.dtype == types.int64 for a in (ins, outs)):
        return None
    if not isinstance(divisor, types.Float) or not isinstance(has_div, (types.Boolean, types.Integer)):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ins_v, outs_v, nvec_v, div_v, has_div_v = args
        ins_a = context.make_array(signature.args[0])(context, builder, ins_v)
        outs_a = context.make_array(signature.args[1])(context, builder, outs_v)
        n_in = builder.extract_value(ins_a.shape, 0)
        n_out = builder.extract_value(outs_a.shape, 0)
        fvec = ir.VectorType(ir.FloatType(), VEC_ELEMENTS)
        vptr = fvec.as_pointer()
        d32 = context.cast(builder, div_v, signature.args[3], types.float32)
        dvec = cgutils.get_null_value(fvec)
        for j in range(VEC_ELEMENTS):
            dvec = builder.insert_element(dvec, d32, ir.Constant(_I32, j))
        flag = context.cast(builder, has_div_v, signature.args[4], types.boolean)
        acc = cgutils.alloca_once(builder, fvec)

        def addr(data: ir.Value, j: ir.Value) -> ir.Value:
            return builder.inttoptr(builder.load(builder.gep(data, [j])), vptr)

        def unrolled(g: int, h: int, div: bool) -> None:
            in_p = [addr(ins_a.data, ir.Constant(_I64, t)) for t in range(g)]
            out_p = [addr(outs_a.data, ir.Constant(_I64, t)) for t in range(h)]
            with cgutils.for_range(builder, nvec_v) as loop:
                xs = [builder.load(builder.gep(p, [loop.index]), align=4) for p in in_p]
                v = xs[0]
                for x in xs[1:]:
                    v = builder.fadd(v, x)
                if div:
                    v = builder.fdiv(v, dvec)
                for q in out_p:
                    builder.store(v, builder.gep(q, [loop.index]), align=4)

        def general(div: bool) -> None:
            with cgutils.for_range(builder, nvec_v) as loop:
                i = loop.index
                builder.store(builder.load(builder.gep(addr(ins_a.data, ir.Constant(_I64, 0)), [i]), align=4), acc)
                with cgutils.for_range_slice(builder, ir.Constant(_I64, 1), n_in, ir.Constant(_I64, 1)) as (j, _):
                    x = builder.load(builder.gep(addr(ins_a.data, j), [i]), align=4)
                    builder.store(builder.fadd(builder.load(acc), x), acc)
                v = builder.load(acc)
                if div:
                    v = builder.fdiv(v, dvec)
                with cgutils.for_range(builder, n_out) as out_loop:
                    builder.store(v, builder.gep(addr(outs_a.data, out_loop.index), [i]), align=4)

        def both(emit) -> None:  # type: ignore[no-untyped-def]
            with builder.if_else(flag) as (then, otherwise):
                with then:
                    emit(True)
                with otherwise:
                    emit(False)

        key = builder.add(builder.mul(n_in, ir.Constant(_I64, 256)), n_out)
        fallback = builder.append_basic_block("sum_store.general")
        done = builder.append_basic_block("sum_store.done")
        sw = builder.switch(key, fallback)
        for g, h in _UNROLLED:
            bb = builder.append_basic_block(f"sum_store.{g}.{h}")
            sw.add_case(ir.Constant(_I64, g * 256 + h), bb)
            builder.position_at_end(bb)
            both(lambda div, g=g, h=h: unrolled(g, h, div))
            builder.branch(done)
        builder.position_at_end(fallback)
        both(general)
        builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return types.none(ins, outs, nvec, divisor, has_div), codegen


@njit(nogil=True, cache=True)
def sum_store(ins, outs, lo, hi, divisor, ins_at, outs_at):  # type: ignore[no-untyped-def]
    """Elements [lo, hi) of the float32 sum of ``ins`` (left to right), divided by
    ``divisor`` when it is above 1, stored into every buffer of ``outs``.

    ``ins`` and ``outs`` are int64 arrays of base addresses (element ``i`` of a buffer at
    ``base + 4 * i``); ``ins_at`` and ``outs_at``, arrays of their sizes, are room in which
    the pass offsets them to the range.  The whole vectors go through
    :func:`_sum_store_vectors`, the last ``(hi - lo) % 16`` elements through a scalar loop
    with the same arithmetic."""
    nvec = (hi - lo) // VEC_ELEMENTS
    if nvec > 0:
        for t in range(ins.shape[0]):
            ins_at[t] = ins[t] + lo * 4
        for o in range(outs.shape[0]):
            outs_at[o] = outs[o] + lo * 4
        _sum_store_vectors(ins_at, outs_at, nvec, np.float32(divisor), divisor > 1)
    _tail(ins, outs, lo + nvec * VEC_ELEMENTS, hi, divisor)


@njit(nogil=True, cache=True)
def _tail(ins, outs, lo, hi, divisor):  # type: ignore[no-untyped-def]
    """The scalar end of :func:`sum_store` (fewer than a vector of elements)."""
    d = np.float32(divisor)
    for j in range(lo, hi):
        v = carray(_voidptr(ins[0] + j * 4), 1, np.float32)[0]
        for t in range(1, ins.shape[0]):
            v = v + carray(_voidptr(ins[t] + j * 4), 1, np.float32)[0]
        if divisor > 1:
            v = v / d
        for o in range(outs.shape[0]):
            carray(_voidptr(outs[o] + j * 4), 1, np.float32)[0] = v


#: the sources this module's jitted code is compiled from (:mod:`.jitcache`)
JIT_SOURCES = (__file__, *kernels.JIT_SOURCES)
drop_stale(__file__, sum_store, JIT_SOURCES)
