"""CPU reduce kernels of HFReduce: k input buffers into one output, in one pass.

``reduce_into(out, inputs, op)`` computes, element by element,
``out[i] = op(op(op(in0[i], in1[i]), in2[i]), ...)`` for ops ``sum``, ``avg``,
``max``, ``min`` over 1 <= k <= 16 inputs of one of :data:`SUPPORTED_DTYPES`.

Semantics (the tests hold these bit for bit against a numpy reference):

* **Order is fixed.**  Input order, left to right, for every element, whatever
  the thread count: threads only split the element range.  Results are
  therefore deterministic across runs, thread counts and machines.
* **Floats accumulate in float32.**  float16, bfloat16, float8 e4m3fn / e5m2
  are decoded exactly to float32, combined there, and the result is rounded
  once to the output format with round-to-nearest-even (``_lowp`` documents
  NaN / Inf / overflow handling: it is numpy's ``astype`` for float16 and
  ml_dtypes' for the others).  ``avg`` is the float32 sum divided by k (a
  true division, not a multiply by 1/k), rounded once.
* **max / min** follow numpy's ``np.maximum`` / ``np.minimum`` as measured on
  this stack: NaN propagates (the earliest NaN in input order wins) and on a
  tie (``-0.0`` vs ``+0.0``) the later operand wins:
  ``acc = acc if (acc > x or isnan(acc)) else x``.
* **Integers** (int32, int64) wrap on overflow like numpy; ``avg`` is the
  wrapped sum floor-divided by k (``np.floor_divide``: rounds toward -inf).
* **Mixed float formats.**  ``out`` may have a different float dtype than the
  inputs: low-precision inputs into a float32 ``out`` keep float32 partials,
  float32 partials into a low-precision ``out`` round once at the end.  The
  allreduce worker uses this: for low-precision types it reduces the local
  ranks into float32 partials, keeps float32 across nodes when it can, and
  casts the final float32 result with :func:`cast_into` (RNE) — one rounding in
  total instead of one per tree level.
* ``out`` may be the same buffer as any input (the worker reduces in place
  into ``inputs[0]``); a partial overlap is rejected.

Layout: the kernels get the inputs as an array of addresses and work through
the range in blocks of :data:`BLOCK` elements.  Per block the first four inputs
are decoded and combined in one pass into a float32 accumulator that stays in
L1, each further group of four is folded in with one more pass (max / min: one
input per pass), and the last pass writes ``out`` (float32) directly; other
output formats are encoded from the accumulator.  Each input streams through
once and ``out`` is written once.  Passes never write in place (two
accumulators alternate): an exact overlap of source and destination makes
LLVM's runtime alias check fall back to scalar code.  A float32 sum into a big
float32 ``out`` (``_STREAM_MIN_BYTES``) sums up to eight inputs in its last pass and
writes ``out`` with non-temporal stores, in longer blocks whose accumulators (for
the inputs beyond eight) sit in L2 (:func:`stream_block`).

Specializations: the input format is carried by the element type of the views
(``_VIEW_TYPE``), so the decode is chosen at compile time and the loops
vectorize; op, k and the output format are runtime integers.  That is one
specialization per input format, compiled on first use of that format (the
dispatch is in Python) and cached (``cache=True``): compile time matters on
2-core CI.

Threading: :func:`reduce_into` runs the range on a private thread pool (the
kernels are ``nogil``) as cache-line aligned chunks that the threads, the
calling one included, take from a shared counter.  :func:`reduce_range` runs
one slice on the calling thread with no fan-out: the allreduce worker calls it
from its own threads on its own chunks.  Numba's ``parallel=True`` is not used
because its default workqueue threading layer is not safe to enter from
several Python threads at once.
"""

from __future__ import annotations

import itertools
import os
import platform
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload
from numba.np.numpy_support import as_dtype

from fireflyer.core.errors import InvalidArgument
from fireflyer.hfreduce import _lowp
from fireflyer.hfreduce._lowp import (
    BF16,
    E4M3,
    E5M2,
    F16,
    F32,
    I32,
    I64,
    dec_bf16,
    dec_e4m3,
    dec_e5m2,
    dec_f16,
    enc_bf16,
    enc_e4m3,
    enc_e5m2,
    enc_f16,
)
from fireflyer.hfreduce.caches import cache_bytes
from fireflyer.hfreduce.jitcache import drop_stale

__all__ = [
    "BLOCK",
    "MAX_INPUTS",
    "OPS",
    "SUPPORTED_DTYPES",
    "cast_into",
    "default_threads",
    "dtype_from_name",
    "dtype_name",
    "NARROW_FLOATS",
    "carried_dtype",
    "reduce_into",
    "reduce_range",
    "warm_up",
]

#: elements per accumulator block (16 KiB of float32: stays in L1 beside the input lines)
BLOCK = 4096
MAX_INPUTS = 16
OPS: tuple[str, ...] = ("sum", "avg", "max", "min")
_SUM, _AVG, _MAX, _MIN = 0, 1, 2, 3
_OP_CODE = {name: i for i, name in enumerate(OPS)}

_FORMATS: dict[np.dtype, int] = {
    np.dtype(np.float32): F32,
    np.dtype(np.float16): F16,
    np.dtype(ml_dtypes.bfloat16): BF16,
    np.dtype(ml_dtypes.float8_e4m3fn): E4M3,
    np.dtype(ml_dtypes.float8_e5m2): E5M2,
    np.dtype(np.int32): I32,
    np.dtype(np.int64): I64,
}
SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(_FORMATS)

_NAMES: dict[str, np.dtype] = {}
for _dt, _aliases in [
    (np.float32, ("fp32", "float32", "f32", "float")),
    (np.float16, ("fp16", "float16", "f16", "half")),
    (ml_dtypes.bfloat16, ("bf16", "bfloat16")),
    (ml_dtypes.float8_e4m3fn, ("fp8_e4m3", "fp8_e4m3fn", "float8_e4m3fn", "e4m3", "e4m3fn")),
    (ml_dtypes.float8_e5m2, ("fp8_e5m2", "float8_e5m2", "e5m2")),
    (np.int32, ("int32", "i32")),
    (np.int64, ("int64", "i64")),
]:
    for _a in _aliases:
        _NAMES[_a] = np.dtype(_dt)

#: below this many bytes moved, threading costs more than it saves
_MIN_PARALLEL_BYTES = 1 << 20
#: sum / max / min calls of at most this many elements whose inputs and ``out`` share a float32 /
#: int32 / int64 dtype run in numpy (:func:`_reduce_small`): a kernel call costs ~15 µs of
#: argument checks and dispatch, most of a small allreduce's reduce step, against 2-5 µs
SMALL_ELEMS = 1024
_SMALL_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64)})
#: bytes moved (read + written) per chunk that :func:`reduce_into`'s threads take
#: from a shared counter: small enough to even out a descheduled thread, big
#: enough that the per-chunk call (a few microseconds) stays below 1%
_CHUNK_BYTES = 16 << 20
#: a float32 sum into an ``out`` at least this big is written with non-temporal stores: it
#: would not stay in the cache anyway (half the 32 MiB L3 of the CI machine), and
#: they save the read of every ``out`` line that a plain store does first.  Smaller
#: calls (the allreduce worker's chunks, sent right after) keep ``out`` cached.
_STREAM_MIN_BYTES = 16 << 20
#: the non-temporal path ends with an x86 ``sfence``; elsewhere big sums take the plain loop
_NT_STORES = platform.machine().lower() in ("x86_64", "amd64")
#: inputs summed by the last, non-temporal pass of a big float32 sum (:func:`_reduce_stream`)
_NT_INPUTS = 8
#: bounds of :func:`stream_block`, in float32 elements (64 KiB and 256 KiB per accumulator)
_STREAM_BLOCK_MIN, _STREAM_BLOCK_MAX, _STREAM_BLOCK_DEFAULT = 1 << 14, 1 << 16, 1 << 14
#: slice boundaries are multiples of this many elements (>= one cache line for every dtype)
_ALIGN = 1024


def dtype_from_name(name: str | np.dtype | type) -> np.dtype:
    """Map ``"fp32"``, ``"bf16"``, ``"fp8_e4m3"``, ``"float8_e5m2"``, ... (or a dtype) to a supported dtype."""
    if isinstance(name, np.dtype) and name in _DTYPE_NAMES:
        return name
    if isinstance(name, str):
        dt = _NAMES.get(name.strip().lower())
        if dt is None:
            raise InvalidArgument(
                f"unknown dtype name {name!r}; known: {', '.join(sorted(_NAMES))}", argument="dtype", value=name
            )
        return dt
    try:
        dt = np.dtype(name)
    except TypeError as exc:
        raise InvalidArgument(f"not a dtype: {name!r}", argument="dtype", value=str(name)) from exc
    if dt not in _FORMATS:
        raise InvalidArgument(f"unsupported dtype {dt}", argument="dtype", value=str(dt))
    return dt


#: the canonical name of each supported dtype (``np.dtype.name`` costs ~2 µs, a dict hit 20 ns)
_DTYPE_NAMES: dict[np.dtype, str] = {dt: dt.name for dt in _FORMATS}


#: float formats narrower than float32: reduced, carried between nodes and rounded once as float32
NARROW_FLOATS = frozenset(dt for dt, fmt in _FORMATS.items() if fmt in (F16, BF16, E4M3, E5M2))
_F32_DTYPE = np.dtype(np.float32)


def carried_dtype(dt: np.dtype) -> np.dtype:
    """The dtype an allreduce of ``dt`` carries between nodes: float32 for narrower floats."""
    return _F32_DTYPE if dt in NARROW_FLOATS else dt


def dtype_name(dt: np.dtype) -> str:
    """``dt.name``, fast for the supported dtypes (the per-op paths name their dtype several times)."""
    name = _DTYPE_NAMES.get(dt)
    return name if name is not None else np.dtype(dt).name


def stream_block(l2_bytes: int | None) -> int:
    """float32 elements per block of the non-temporal sum: its two accumulators fill half of L2.

    That path reads each input in runs of one block before the next pass moves on to
    the next four inputs.  Long runs mean fewer switches between sets of memory streams
    and less per-block work (views, unaligned edges).  On an AMD EPYC VM (1 MiB L2),
    64 Ki-element blocks against the 4 Ki of the other paths (which keep theirs in L1),
    ``ff bench kernels``, 28 interleaved runs per side (medians): k = 16 2.38x numpy
    against 2.10x, k = 2 1.50x against 1.37x; k = 8 level at the median (2.09x against
    2.10x, 34.5 against 33.4 GB/s) but at least 2x in 22 runs against 16.  In one
    process, where the VM's level moves less between the two, k = 8 gained 10-20%.
    A power of two between 16 Ki and 64 Ki elements; 16 Ki where the L2 size is unknown.
    """
    if not l2_bytes or l2_bytes <= 0:
        return _STREAM_BLOCK_DEFAULT
    fit = 1 << (max(1, l2_bytes // 16).bit_length() - 1)  # two float32 accumulators in half of it
    return max(_STREAM_BLOCK_MIN, min(_STREAM_BLOCK_MAX, fit))


#: elements per block of :func:`_reduce_stream`, for this machine's L2
STREAM_BLOCK = stream_block(cache_bytes(2))


def default_threads() -> int:
    """Threads :func:`reduce_into` uses when not told: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


# ------------------------------------------------------------------ numba side


@intrinsic
def _voidptr(typingctx, addr):  # type: ignore[no-untyped-def]
    """An integer address as a ``void*`` so ``carray`` can view it (inputs arrive as addresses)."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

    return types.voidptr(addr), codegen


@intrinsic
def _sum_nt(typingctx, dst, acc, p0, p1, p2, p3, p4, p5, p6, p7, lo, nvec, g,  # type: ignore[no-untyped-def]
            has_acc):
    """float32 ``dst[i] = (((acc[i] + x0[i]) + x1[i]) + ...)`` for ``i < 16 * nvec``, the
    first ``g`` (1 to 8) of the float32 inputs at p0..p7 (``acc[lo:]`` first only if
    ``has_acc``), stored with non-temporal 64-byte stores: ``dst`` must be 64-byte aligned.

    A non-temporal store sends the line to memory without reading it first, which
    a plain store does: one stream of memory traffic less.  LLVM's vectorizer does
    not emit aligned ones from a scalar loop, hence the explicit <16 x float> loop.
    ``g`` is a literal (the loop is generated for each); ``has_acc`` picks one of the two
    loops generated for it, outside them.
    """
    if not (isinstance(g, types.IntegerLiteral) and isinstance(has_acc, (types.Integer, types.Boolean))
            and isinstance(acc, types.Array) and acc.dtype == types.float32):
        return None
    ng = g.literal_value

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        dst_v, acc_v, *ps, lo_v, nvec_v, _, has_acc_v = args
        vec = ir.VectorType(ir.FloatType(), 16).as_pointer()
        data = context.make_array(signature.args[1])(context, builder, acc_v).data
        acc_p = builder.bitcast(builder.gep(data, [lo_v]), vec)
        in_p = [builder.inttoptr(p, vec) for p in ps[:ng]]
        dst_p = builder.inttoptr(dst_v, vec)
        nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])

        def loop_over(with_acc: bool) -> None:
            with cgutils.for_range(builder, nvec_v) as loop:
                i = loop.index
                xs = [builder.load(builder.gep(p, [i]), align=4) for p in in_p]
                v = builder.load(builder.gep(acc_p, [i]), align=4) if with_acc else xs.pop(0)
                for x in xs:
                    v = builder.fadd(v, x)
                st = builder.store(v, builder.gep(dst_p, [i]), align=64)
                st.set_metadata("nontemporal", nontemporal)

        flag = context.cast(builder, has_acc_v, signature.args[-1], types.boolean)
        with builder.if_else(flag) as (then, otherwise):
            with then:
                loop_over(True)
            with otherwise:
                loop_over(False)
        return context.get_dummy_value()

    return types.none(dst, acc, p0, p1, p2, p3, p4, p5, p6, p7, lo, nvec, g, has_acc), codegen


@intrinsic
def _sfence(typingctx):  # type: ignore[no-untyped-def]
    """Order the non-temporal stores before whatever follows (they are weakly ordered)."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence")
        builder.call(fn, [])
        return context.get_dummy_value()

    return types.none(), codegen


@njit(nogil=True, cache=True)
def _max(a, b):  # type: ignore[no-untyped-def]
    return a if (a > b or a != a) else b


@njit(nogil=True, cache=True)
def _min(a, b):  # type: ignore[no-untyped-def]
    return a if (a < b or a != a) else b


@njit(nogil=True, cache=True)
def _combine(acc, x, m, op):  # type: ignore[no-untyped-def]
    """``acc[:m] = op(acc[:m], x[:m])`` (integers)."""
    if op == _MAX:
        for j in range(m):
            acc[j] = _max(acc[j], x[j])
    elif op == _MIN:
        for j in range(m):
            acc[j] = _min(acc[j], x[j])
    else:
        for j in range(m):
            acc[j] = acc[j] + x[j]


# Float inputs are viewed with an element type that names their format, so the
# decode is picked when numba types the kernel (one specialization per input
# format, no format test inside the loops): float32 -> F32, int16 -> F16,
# uint16 -> BF16, uint8 -> E4M3, int8 -> E5M2.  The decoders mask their input,
# so the sign extension of the signed views is harmless.
_VIEW_TYPE = {F32: np.float32, F16: np.int16, BF16: np.uint16, E4M3: np.uint8, E5M2: np.int8}


def _view(addr, m, tag):  # type: ignore[no-untyped-def]  # pragma: no cover - jit only
    """``m`` elements at ``addr`` viewed with the element type of the scalar ``tag``."""
    raise NotImplementedError


@overload(_view, jit_options={"nogil": True}, prefer_literal=False)
def _view_impl(addr, m, tag):  # type: ignore[no-untyped-def]
    elem = as_dtype(tag).type

    def impl(addr, m, tag):  # type: ignore[no-untyped-def]
        return carray(_voidptr(addr), m, elem)

    return impl


def _ld(x, j):  # type: ignore[no-untyped-def]  # pragma: no cover - jit only
    """Element ``j`` of the input view ``x`` decoded to float32 (exact)."""
    raise NotImplementedError


@overload(_ld, jit_options={"nogil": True})
def _ld_impl(x, j):  # type: ignore[no-untyped-def]
    dec = {types.float32: None, types.int16: dec_f16, types.uint16: dec_bf16,
           types.uint8: dec_e4m3, types.int8: dec_e5m2}[x.dtype]
    if dec is None:
        return lambda x, j: x[j]
    return lambda x, j: dec(x[j])


@njit(nogil=True, cache=True)
def _start(dst, a, b, c, d, g, m, op):  # type: ignore[no-untyped-def]
    """``dst[:m]`` = the first ``g`` of a, b, c, d combined left to right, in one pass.

    ``g`` is 1 to 4 for sum / avg and 1 for max / min: those are rarer, and one
    input per pass keeps the compile time (one set of loops per input format) down.
    """
    if g == 1:
        for j in range(m):
            dst[j] = _ld(a, j)
    elif g == 2:
        for j in range(m):
            dst[j] = _ld(a, j) + _ld(b, j)
    elif g == 3:
        for j in range(m):
            dst[j] = (_ld(a, j) + _ld(b, j)) + _ld(c, j)
    else:
        for j in range(m):
            dst[j] = ((_ld(a, j) + _ld(b, j)) + _ld(c, j)) + _ld(d, j)


@njit(nogil=True, cache=True)
def _fold(dst, acc, a, b, c, d, g, m, op):  # type: ignore[no-untyped-def]
    """``dst[:m]`` = ``acc[:m]`` combined with the first ``g`` of a, b, c, d (see ``_start``).

    ``dst`` is float32 and never ``acc`` nor one of the inputs: an exact overlap
    makes LLVM's runtime alias check pick the scalar loop (4x slower here).
    """
    if op == _MAX:
        for j in range(m):
            dst[j] = _max(acc[j], _ld(a, j))
    elif op == _MIN:
        for j in range(m):
            dst[j] = _min(acc[j], _ld(a, j))
    elif g == 1:
        for j in range(m):
            dst[j] = acc[j] + _ld(a, j)
    elif g == 2:
        for j in range(m):
            dst[j] = (acc[j] + _ld(a, j)) + _ld(b, j)
    elif g == 3:
        for j in range(m):
            dst[j] = ((acc[j] + _ld(a, j)) + _ld(b, j)) + _ld(c, j)
    else:
        for j in range(m):
            dst[j] = (((acc[j] + _ld(a, j)) + _ld(b, j)) + _ld(c, j)) + _ld(d, j)


@njit(nogil=True, cache=True)
def _encode(addr, fmt, src, m):  # type: ignore[no-untyped-def]
    """The m elements of format ``fmt`` at ``addr`` <- float32 ``src[:m]``, rounded to nearest even."""
    p = _voidptr(addr)
    if fmt == F32:
        yf = carray(p, m, np.float32)
        for j in range(m):
            yf[j] = src[j]
    elif fmt == F16:
        yh = carray(p, m, np.uint16)
        for j in range(m):
            yh[j] = enc_f16(src[j])
    elif fmt == BF16:
        yb = carray(p, m, np.uint16)
        for j in range(m):
            yb[j] = enc_bf16(src[j])
    elif fmt == E4M3:
        y4 = carray(p, m, np.uint8)
        for j in range(m):
            y4[j] = enc_e4m3(src[j])
    else:
        y5 = carray(p, m, np.uint8)
        for j in range(m):
            y5[j] = enc_e5m2(src[j])


_ITEMSIZE = np.array([4, 2, 2, 1, 1, 4, 8], dtype=np.int64)


@njit(nogil=True, cache=True)
def _reduce_typed(tag, out_addr, out_fmt, in_addrs, isz, start, stop, op):  # type: ignore[no-untyped-def]
    """The float kernel for inputs viewed as ``typeof(tag)`` (see ``_VIEW_TYPE``).

    Per block: the first (up to) four inputs go to the float32 accumulator in one
    pass, each further group of (up to) four is folded in with one more pass, and
    the last pass writes ``out`` directly when it is float32 (sum / max / min),
    so ``out`` is written once and the accumulators stay in L1.
    """
    acc = np.empty(BLOCK, np.float32)
    acc2 = np.empty(BLOCK, np.float32)  # folds go acc -> acc2 -> acc ...: never in place (see _fold)
    _reduce_typed_acc(tag, out_addr, out_fmt, in_addrs, isz, start, stop, op, acc, acc2)


@njit(nogil=True, cache=True)
def _reduce_typed_acc(tag, out_addr, out_fmt, in_addrs, isz, start, stop, op, acc, acc2):  # type: ignore[no-untyped-def]
    """``_reduce_typed`` with the caller's accumulators (float32, equal lengths: the block).

    A caller that reduces many short ranges (a block loop's sub-blocks, a few hundred
    elements each) passes its own and saves two allocations per call.
    """
    block = acc.shape[0]
    k = in_addrs.shape[0]
    kf = np.float32(k)
    osz = _ITEMSIZE[out_fmt]
    gmax = 1 if op == _MAX or op == _MIN else 4  # inputs per pass (see _start)
    g0 = min(k, gmax)
    last = k - 1 - (k - 1 - g0) % gmax if k > g0 else 0  # first input of the last pass
    direct = out_fmt == F32 and op != _AVG
    for q in range(last, k):
        if in_addrs[q] == out_addr:
            direct = False
    for b0 in range(start, stop, block):
        m = min(block, stop - b0)
        off = b0 * isz
        out_view = _view(out_addr + b0 * osz, m, np.float32(0))
        src = acc
        in_acc = True  # src is acc (else acc2)
        a = _view(in_addrs[0] + off, m, tag)
        b = _view(in_addrs[min(1, k - 1)] + off, m, tag)
        c = _view(in_addrs[min(2, k - 1)] + off, m, tag)
        d = _view(in_addrs[min(3, k - 1)] + off, m, tag)
        _start(out_view if direct and k == g0 else src, a, b, c, d, g0, m, op)
        r = g0
        while r < k:
            g = min(gmax, k - r)
            a = _view(in_addrs[r] + off, m, tag)
            b = _view(in_addrs[min(r + 1, k - 1)] + off, m, tag)
            c = _view(in_addrs[min(r + 2, k - 1)] + off, m, tag)
            d = _view(in_addrs[min(r + 3, k - 1)] + off, m, tag)
            dst = acc2 if in_acc else acc
            if direct and r + g == k:
                dst = out_view
            _fold(dst, src, a, b, c, d, g, m, op)
            src = dst
            in_acc = not in_acc
            r += g
        if direct:
            continue
        if op == _AVG:
            dst = acc2 if in_acc else acc
            for j in range(m):
                dst[j] = src[j] / kf
            src = dst
        _encode(out_addr + b0 * osz, out_fmt, src, m)


@njit(nogil=True, cache=True)
def _sum_edge(out, acc, xs, g, has_acc, lo, hi):  # type: ignore[no-untyped-def]
    """``out[lo:hi]`` of one ``_sum_nt`` pass, with plain stores (the unaligned ends of a block);
    ``xs`` holds the pass's eight input views, of which the first ``g`` count."""
    for j in range(lo, hi):
        v = acc[j] + xs[0][j] if has_acc else xs[0][j]
        for t in range(1, g):
            v = v + xs[t][j]
        out[j] = v


@njit(nogil=True, cache=True)
def _nt_pass(y, src, a, lo, nvec, g, has_acc):  # type: ignore[no-untyped-def]
    """``_sum_nt`` over the addresses ``a`` (eight; the first ``g`` count), ``g`` turned into the
    literal it is generated for."""
    if g == 1:
        _sum_nt(y, src, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], lo, nvec, 1, has_acc)
    elif g == 2:
        _sum_nt(y, src, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], lo, nvec, 2, has_acc)
    elif g == 3:
        _sum_nt(y, src, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], lo, nvec, 3, has_acc)
    elif g == 4:
        _sum_nt(y, src, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], lo, nvec, 4, has_acc)
    elif g == 5:
        _sum_nt(y, src, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], lo, nvec, 5, has_acc)
    elif g == 6:
        _sum_nt(y, src, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], lo, nvec, 6, has_acc)
    elif g == 7:
        _sum_nt(y, src, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], lo, nvec, 7, has_acc)
    else:
        _sum_nt(y, src, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], lo, nvec, 8, has_acc)


@njit(nogil=True, cache=True)
def _reduce_stream(out_addr, in_addrs, start, stop, acc, acc2):  # type: ignore[no-untyped-def]
    """float32 sum into a big float32 ``out``: up to eight inputs in one pass that writes
    ``out`` with non-temporal stores (``_sum_nt``); beyond eight, the first ones are summed
    four at a time into the L2-resident accumulators first (``_start`` / ``_fold``), in
    blocks of ``acc``'s length (:data:`STREAM_BLOCK`).

    Why eight in the last pass: on an AMD Zen 5 VM, k = 8 in one pass took 0.97x the time of
    four into the accumulator and four more into ``out`` (three runs of eight interleaved
    rounds in one process, 12.26-12.42 against 12.63-12.78 ms): 96-97% of the speed of only
    reading the eight inputs (:mod:`fireflyer.bench._read_floor`), against 93%.  On a Zen 4 VM the two were
    level.  Summation order is the same either way: left to right.

    The caller owns the accumulators (one pair per thread, :func:`_stream_acc`): 256 KiB
    allocated per call would be mapped and faulted in anew each time.
    """
    block = acc.shape[0]
    k = in_addrs.shape[0]
    tag = np.float32(0)
    for b0 in range(start, stop, block):
        m = min(block, stop - b0)
        off = b0 * 4
        y = out_addr + off
        h = min(m, ((-y) & 63) >> 2)  # plain stores up to the first 64-byte boundary
        nvec = (m - h) >> 4
        src = acc
        in_acc = True
        r = 0
        while k - r > _NT_INPUTS:  # fold the first inputs in until eight or fewer are left
            g = min(4, k - r - _NT_INPUTS)
            a = _view(in_addrs[r] + off, m, tag)
            b = _view(in_addrs[min(r + 1, k - 1)] + off, m, tag)
            c = _view(in_addrs[min(r + 2, k - 1)] + off, m, tag)
            d = _view(in_addrs[min(r + 3, k - 1)] + off, m, tag)
            if r == 0:
                _start(acc, a, b, c, d, g, m, _SUM)
            else:
                dst = acc2 if in_acc else acc
                _fold(dst, src, a, b, c, d, g, m, _SUM)
                src = dst
                in_acc = not in_acc
            r += g
        g = k - r
        has_acc = r > 0
        ps = (in_addrs[r] + off, in_addrs[min(r + 1, k - 1)] + off, in_addrs[min(r + 2, k - 1)] + off,
              in_addrs[min(r + 3, k - 1)] + off, in_addrs[min(r + 4, k - 1)] + off,
              in_addrs[min(r + 5, k - 1)] + off, in_addrs[min(r + 6, k - 1)] + off,
              in_addrs[min(r + 7, k - 1)] + off)
        xs = (_view(ps[0], m, tag), _view(ps[1], m, tag), _view(ps[2], m, tag), _view(ps[3], m, tag),
              _view(ps[4], m, tag), _view(ps[5], m, tag), _view(ps[6], m, tag), _view(ps[7], m, tag))
        out = _view(y, m, tag)
        _sum_edge(out, src, xs, g, has_acc, 0, h)
        _sum_edge(out, src, xs, g, has_acc, h + nvec * 16, m)
        q = h * 4
        qs = (ps[0] + q, ps[1] + q, ps[2] + q, ps[3] + q, ps[4] + q, ps[5] + q, ps[6] + q, ps[7] + q)
        _nt_pass(y + q, src, qs, h, nvec, g, has_acc)
    _sfence()


#: the ``tag`` argument of ``_reduce_typed`` per input format.  Dispatching from
#: Python compiles only the formats a process uses (each is one specialization).
_TAGS = {fmt: np.dtype(t).type(0) for fmt, t in _VIEW_TYPE.items()}


@njit(nogil=True, cache=True)
def _reduce_int(out_addr, in_addrs, fmt, start, stop, op):  # type: ignore[no-untyped-def]
    k = in_addrs.shape[0]
    acc = np.empty(BLOCK, np.int64)
    sz = _ITEMSIZE[fmt]
    for b0 in range(start, stop, BLOCK):
        m = min(BLOCK, stop - b0)
        for r in range(k):
            p = _voidptr(in_addrs[r] + b0 * sz)
            if fmt == I32:
                x32 = carray(p, m, np.int32)
                if r == 0:
                    for j in range(m):
                        acc[j] = x32[j]
                else:
                    _combine(acc, x32, m, op)
            else:
                x64 = carray(p, m, np.int64)
                if r == 0:
                    for j in range(m):
                        acc[j] = x64[j]
                else:
                    _combine(acc, x64, m, op)
        p = _voidptr(out_addr + b0 * sz)
        if fmt == I32:
            y32 = carray(p, m, np.int32)
            for j in range(m):
                v = np.int32(acc[j])  # wrap to int32 before dividing, as numpy would have
                y32[j] = v // k if op == _AVG else v
        else:
            y64 = carray(p, m, np.int64)
            for j in range(m):
                y64[j] = acc[j] // k if op == _AVG else acc[j]


# ------------------------------------------------------------------ python side


def _addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _check_array(a: object, what: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise InvalidArgument(f"{what} must be a numpy array, got {type(a).__name__}", argument=what)
    if a.ndim != 1:
        raise InvalidArgument(f"{what} must be 1-D, got shape {a.shape}", argument=what, ndim=a.ndim)
    if not a.flags.c_contiguous:
        raise InvalidArgument(f"{what} must be contiguous", argument=what)
    if a.dtype not in _FORMATS:
        raise InvalidArgument(f"{what} has unsupported dtype {a.dtype}", argument=what, dtype=str(a.dtype))
    return a


class _Plan:
    """Validated arguments of one call: addresses and format codes for the kernels."""

    __slots__ = ("n", "out_addr", "out_fmt", "in_addrs", "in_fmt", "op", "nbytes", "stream")

    def __init__(self, out: np.ndarray, inputs: Sequence[np.ndarray], op: str, *, widen: bool) -> None:
        _check_array(out, "out")
        if not out.flags.writeable:
            raise InvalidArgument("out is read-only", argument="out")
        if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
            raise InvalidArgument("inputs must be a sequence of arrays", argument="inputs")
        k = len(inputs)
        if not 1 <= k <= MAX_INPUTS:
            raise InvalidArgument(
                f"inputs must hold 1 to {MAX_INPUTS} arrays, got {k}", argument="inputs", k=k
            )
        code = _OP_CODE.get(op) if isinstance(op, str) else None
        if code is None:
            raise InvalidArgument(f"unknown op {op!r}; one of {', '.join(OPS)}", argument="op", value=str(op))
        n = out.shape[0]
        in_dtype = None
        out_lo = _addr(out)
        out_hi = out_lo + out.nbytes
        addrs = np.empty(k, dtype=np.int64)
        for i, a in enumerate(inputs):
            what = f"inputs[{i}]"
            _check_array(a, what)
            if in_dtype is None:
                in_dtype = a.dtype
            elif a.dtype != in_dtype:
                raise InvalidArgument(
                    f"{what} has dtype {a.dtype}, inputs[0] has {in_dtype}",
                    argument=what, dtype=str(a.dtype), expected=str(in_dtype),
                )
            if a.shape[0] != n:
                raise InvalidArgument(
                    f"{what} has {a.shape[0]} elements, out has {n}", argument=what, size=a.shape[0], expected=n
                )
            lo = _addr(a)
            if lo != out_lo and lo < out_hi and out_lo < lo + a.nbytes:
                raise InvalidArgument(f"out partially overlaps {what}", argument="out")
            addrs[i] = lo
        assert in_dtype is not None
        in_fmt, out_fmt = _FORMATS[in_dtype], _FORMATS[out.dtype]
        if in_fmt != out_fmt and not (widen and in_fmt < I32 and out_fmt < I32):
            raise InvalidArgument(
                f"out has dtype {out.dtype} but inputs have {in_dtype}; only float formats may differ",
                argument="out", dtype=str(out.dtype), expected=str(in_dtype),
            )
        self.n = n
        self.out_addr = out_lo
        self.out_fmt = out_fmt
        self.in_addrs = addrs
        self.in_fmt = in_fmt
        self.op = code
        self.nbytes = n * (k * in_dtype.itemsize + out.dtype.itemsize)
        self.stream = (_NT_STORES and in_fmt == out_fmt == F32 and code == _SUM and out.nbytes >= _STREAM_MIN_BYTES
                       and out_lo % 4 == 0 and all(int(a) % 4 == 0 for a in addrs))

    def run(self, start: int, stop: int) -> None:
        if stop <= start:
            return
        if self.in_fmt >= I32:
            _reduce_int(self.out_addr, self.in_addrs, self.in_fmt, start, stop, self.op)
        elif self.stream:
            _reduce_stream(self.out_addr, self.in_addrs, start, stop, *_stream_acc())
        else:
            _reduce_typed(_TAGS[self.in_fmt], self.out_addr, self.out_fmt, self.in_addrs,
                          int(_ITEMSIZE[self.in_fmt]), start, stop, self.op)


_tls = threading.local()


def _stream_acc() -> tuple[np.ndarray, np.ndarray]:
    """This thread's two accumulators of :data:`STREAM_BLOCK` elements for ``_reduce_stream``."""
    pair = getattr(_tls, "stream_acc", None)
    if pair is None or pair[0].shape[0] != STREAM_BLOCK:
        pair = _tls.stream_acc = (np.empty(STREAM_BLOCK, np.float32), np.empty(STREAM_BLOCK, np.float32))
    return pair


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_INPUTS, thread_name_prefix="ff-hfreduce-kernel")
        return _pool


def _run_threaded(plan: _Plan, threads: int) -> None:
    """Run ``plan`` on up to ``threads`` threads that take chunks from a shared counter.

    Chunks rather than one fixed slice per thread: on a shared machine one thread
    is often descheduled for a while, and with fixed slices the call then waits
    for it; here the other threads take its remaining chunks.
    """
    n = plan.n
    parts = min(threads, max(1, plan.nbytes // _MIN_PARALLEL_BYTES), max(1, n // _ALIGN))
    if parts <= 1:
        plan.run(0, n)
        return
    per_thread = -(-n // parts)
    step = min(_CHUNK_BYTES * n // plan.nbytes, per_thread)  # at least one chunk per thread
    step = -(-step // _ALIGN) * _ALIGN

    def run(_worker: int, i: int) -> None:
        lo = i * step
        plan.run(lo, min(lo + step, n))

    _share_chunks(-(-n // step), parts, run)


def _share_chunks(nchunks: int, parts: int, run: Callable[[int, int], None]) -> None:
    """Call ``run(worker, chunk)`` for every chunk in ``range(nchunks)``, on ``parts`` workers
    (the calling thread is worker 0, the others the pool's) that take chunks from a shared
    counter; returns once every worker is done, and a worker's error propagates to the caller."""
    counter = itertools.count()  # next() is atomic under the GIL

    def work(worker: int) -> None:
        while (i := next(counter)) < nchunks:
            run(worker, i)

    futures = [_get_pool().submit(work, w) for w in range(1, parts)]
    try:
        work(0)
    finally:
        for f in futures:
            f.result()


def reduce_into(
    out: np.ndarray, inputs: Sequence[np.ndarray], op: str = "sum", *, threads: int | None = None
) -> np.ndarray:
    """Reduce ``inputs`` element-wise into ``out`` with ``op`` and return ``out``.

    All arrays are 1-D, contiguous and of one length; the inputs share one dtype
    and ``out`` has it too, except that float formats may differ (see the module
    docstring).  ``threads`` (default :func:`default_threads`) caps the slices run
    in parallel; small calls run on the calling thread.  Raises
    :class:`~fireflyer.core.errors.InvalidArgument` naming the bad argument.
    """
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise InvalidArgument(f"threads must be a positive int, got {threads!r}", argument="threads")
    if _reduce_small(out, inputs, op):
        return out
    plan = _Plan(out, inputs, op, widen=True)
    if threads is None:
        threads = default_threads()
    _run_threaded(plan, threads)
    return out


def _reduce_small(out: object, inputs: object, op: object) -> bool:
    """Reduce a small same-dtype call with numpy; False (nothing done) when it is not one.

    Only calls that would pass :class:`_Plan`'s checks qualify (anything unusual takes the
    kernel path, which reports it), so both paths accept and reject the same calls.  The
    result is the kernels' bit for bit: left to right, float32 sums in float32 (``np.add``),
    integers wrapping, and max / min by the kernels' rule ``acc if acc > x or isnan(acc) else x``
    written out (``np.maximum`` leaves ties of -0.0 / +0.0 and two NaNs unspecified).
    """
    if op not in ("sum", "max", "min") or type(out) is not np.ndarray or not isinstance(inputs, list | tuple) \
            or not 1 <= len(inputs) <= MAX_INPUTS:
        return False
    n = out.shape[0] if out.ndim == 1 else -1
    dt = out.dtype
    if not 0 <= n <= SMALL_ELEMS or dt not in _SMALL_DTYPES or not out.flags.writeable \
            or not out.flags.c_contiguous:
        return False
    aliased = False
    for a in inputs:
        if type(a) is not np.ndarray or a.dtype != dt or a.shape != out.shape or not a.flags.c_contiguous:
            return False
        if a is out:
            aliased = True
        elif np.may_share_memory(a, out):
            if _addr(a) != _addr(out):
                return False  # a partial overlap: an error, which the kernel path reports
            aliased = True
    # out may be any input: accumulate apart from it, then store once (as the kernels do)
    acc = inputs[0].copy() if aliased or len(inputs) == 1 else np.copyto(out, inputs[0]) or out
    if op == "sum":
        with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf and inf - inf are results, as in the kernels
            for x in inputs[1:]:
                np.add(acc, x, out=acc)
    else:
        for x in inputs[1:]:
            keep = np.greater(acc, x) if op == "max" else np.less(acc, x)
            if dt.kind == "f":
                keep |= np.isnan(acc)
            np.copyto(acc, x, where=~keep)
    if acc is not out:
        np.copyto(out, acc)
    return True


def reduce_range(
    out: np.ndarray, inputs: Sequence[np.ndarray], op: str, start: int, stop: int
) -> np.ndarray:
    """Like :func:`reduce_into` for elements ``[start, stop)`` only, on the calling thread.

    For the allreduce worker, which runs its own threads over its own chunks.
    Elements outside the range are neither read nor written.
    """
    plan = _Plan(out, inputs, op, widen=True)
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop <= plan.n):
        raise InvalidArgument(
            f"range [{start}, {stop}) is not within [0, {plan.n}]", argument="start", start=start, stop=stop
        )
    plan.run(start, stop)
    return out


def cast_into(out: np.ndarray, src: np.ndarray, *, threads: int | None = None) -> np.ndarray:
    """Convert float ``src`` into float ``out`` (e.g. float32 partials -> bfloat16), rounding to nearest even."""
    for a, what in ((out, "out"), (src, "src")):
        if isinstance(a, np.ndarray) and a.dtype in _FORMATS and _FORMATS[a.dtype] >= I32:
            raise InvalidArgument(f"{what} must have a float dtype, got {a.dtype}", argument=what)
    if not isinstance(src, np.ndarray):
        raise InvalidArgument(f"src must be a numpy array, got {type(src).__name__}", argument="src")
    return reduce_into(out, [src], "sum", threads=threads)


def warm_up() -> None:
    """Compile (or load from numba's compile cache) every kernel specialization a process can
    reach: one per input format (:data:`_TAGS`), the integer kernel and, on x86, the streaming
    float32 sum, each on a few elements.

    Why: a cold compile of them all took 24 s on a 2-vCPU VM (2026-11-28), and each process
    that first uses a format compiles it on its own -- a node's first op of that format pays it
    inside its deadline, and three node workers that start together compile the same kernels at
    once.  ``make setup`` runs this once (:mod:`.precompile`); afterwards a process loads each
    specialization from the cache in about 0.1 s.
    """
    n = 64
    for dt in _FORMATS:
        x = np.zeros(n, dt)
        _Plan(x, [x, x], "sum", widen=True).run(0, n)
    if _NT_STORES:
        x = np.zeros(n, np.float32)
        _reduce_stream(_addr(x), np.array([_addr(x), _addr(x)], np.int64), 0, n, *_stream_acc())


#: the sources this module's jitted code is compiled from (:mod:`.jitcache`)
JIT_SOURCES = (__file__, *_lowp.JIT_SOURCES)
drop_stale(__file__, _reduce_typed, JIT_SOURCES)
