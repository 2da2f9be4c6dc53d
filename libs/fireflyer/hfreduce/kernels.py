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
the range in blocks of :data:`BLOCK` elements held in a float32 (or int64)
accumulator that stays in L1: each input streams through once, ``out`` is
written once.  Format and op are runtime integers, so there is exactly one
compiled specialization for floats and one for integers (``cache=True``),
whatever k, dtype or op — compile time matters on 2-core CI.

Threading: :func:`reduce_into` splits the range into ``threads`` disjoint,
cache-line aligned slices run on a private thread pool (the kernels are
``nogil``), the calling thread taking the last one.  :func:`reduce_range` runs
one slice on the calling thread with no fan-out: the allreduce worker calls it
from its own threads on its own chunks.  Numba's ``parallel=True`` is not used
because its default workqueue threading layer is not safe to enter from
several Python threads at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from fireflyer.core.errors import InvalidArgument
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

__all__ = [
    "BLOCK",
    "MAX_INPUTS",
    "OPS",
    "SUPPORTED_DTYPES",
    "cast_into",
    "default_threads",
    "dtype_from_name",
    "reduce_into",
    "reduce_range",
]

#: elements per accumulator block (16 KiB of float32: two of them fit in L1)
BLOCK = 16384
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
#: slice boundaries are multiples of this many elements (>= one cache line for every dtype)
_ALIGN = 1024


def dtype_from_name(name: str | np.dtype | type) -> np.dtype:
    """Map ``"fp32"``, ``"bf16"``, ``"fp8_e4m3"``, ``"float8_e5m2"``, ... (or a dtype) to a supported dtype."""
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


@njit(nogil=True, cache=True)
def _max(a, b):  # type: ignore[no-untyped-def]
    return a if (a > b or a != a) else b


@njit(nogil=True, cache=True)
def _min(a, b):  # type: ignore[no-untyped-def]
    return a if (a < b or a != a) else b


@njit(nogil=True, cache=True)
def _combine(acc, x, m, op):  # type: ignore[no-untyped-def]
    """``acc[:m] = op(acc[:m], x[:m])`` for integer or float32 x."""
    if op == _MAX:
        for j in range(m):
            acc[j] = _max(acc[j], x[j])
    elif op == _MIN:
        for j in range(m):
            acc[j] = _min(acc[j], x[j])
    else:
        for j in range(m):
            acc[j] = acc[j] + x[j]


@njit(nogil=True, cache=True)
def _combine4(acc, a, b, c, d, m, op):  # type: ignore[no-untyped-def]
    """Four float32 inputs in one pass over acc; same left-to-right order as four ``_combine`` calls."""
    if op == _MAX:
        for j in range(m):
            acc[j] = _max(_max(_max(_max(acc[j], a[j]), b[j]), c[j]), d[j])
    elif op == _MIN:
        for j in range(m):
            acc[j] = _min(_min(_min(_min(acc[j], a[j]), b[j]), c[j]), d[j])
    else:
        for j in range(m):
            acc[j] = (((acc[j] + a[j]) + b[j]) + c[j]) + d[j]


@njit(nogil=True, cache=True)
def _combine4_into(y, acc, a, b, c, d, m, op):  # type: ignore[no-untyped-def]
    """Like ``_combine4`` but the result goes to ``y`` (``out``): saves a pass over acc."""
    if op == _MAX:
        for j in range(m):
            y[j] = _max(_max(_max(_max(acc[j], a[j]), b[j]), c[j]), d[j])
    elif op == _MIN:
        for j in range(m):
            y[j] = _min(_min(_min(_min(acc[j], a[j]), b[j]), c[j]), d[j])
    else:
        for j in range(m):
            y[j] = (((acc[j] + a[j]) + b[j]) + c[j]) + d[j]


@njit(nogil=True, cache=True)
def _start4(acc, a, b, c, d, m, op):  # type: ignore[no-untyped-def]
    """``acc = op(op(op(a, b), c), d)``: the first four float32 inputs in one pass."""
    if op == _MAX:
        for j in range(m):
            acc[j] = _max(_max(_max(a[j], b[j]), c[j]), d[j])
    elif op == _MIN:
        for j in range(m):
            acc[j] = _min(_min(_min(a[j], b[j]), c[j]), d[j])
    else:
        for j in range(m):
            acc[j] = ((a[j] + b[j]) + c[j]) + d[j]


@njit(nogil=True, cache=True)
def _f32(addr, m):  # type: ignore[no-untyped-def]
    return carray(_voidptr(addr), m, np.float32)


@njit(nogil=True, cache=True)
def _accumulate(acc, addr, fmt, m, op):  # type: ignore[no-untyped-def]
    """``acc[:m] = op(acc[:m], decode(x[:m]))``: decode fused into the combine loop (no temporary)."""
    p = _voidptr(addr)
    if fmt == F32:
        _combine(acc, carray(p, m, np.float32), m, op)
    elif fmt == F16:
        xh = carray(p, m, np.uint16)
        if op == _MAX:
            for j in range(m):
                acc[j] = _max(acc[j], dec_f16(xh[j]))
        elif op == _MIN:
            for j in range(m):
                acc[j] = _min(acc[j], dec_f16(xh[j]))
        else:
            for j in range(m):
                acc[j] = acc[j] + dec_f16(xh[j])
    elif fmt == BF16:
        xb = carray(p, m, np.uint16)
        if op == _MAX:
            for j in range(m):
                acc[j] = _max(acc[j], dec_bf16(xb[j]))
        elif op == _MIN:
            for j in range(m):
                acc[j] = _min(acc[j], dec_bf16(xb[j]))
        else:
            for j in range(m):
                acc[j] = acc[j] + dec_bf16(xb[j])
    elif fmt == E4M3:
        x4 = carray(p, m, np.uint8)
        if op == _MAX:
            for j in range(m):
                acc[j] = _max(acc[j], dec_e4m3(x4[j]))
        elif op == _MIN:
            for j in range(m):
                acc[j] = _min(acc[j], dec_e4m3(x4[j]))
        else:
            for j in range(m):
                acc[j] = acc[j] + dec_e4m3(x4[j])
    else:
        x5 = carray(p, m, np.uint8)
        if op == _MAX:
            for j in range(m):
                acc[j] = _max(acc[j], dec_e5m2(x5[j]))
        elif op == _MIN:
            for j in range(m):
                acc[j] = _min(acc[j], dec_e5m2(x5[j]))
        else:
            for j in range(m):
                acc[j] = acc[j] + dec_e5m2(x5[j])


@njit(nogil=True, cache=True)
def _decode(dst, addr, fmt, m):  # type: ignore[no-untyped-def]
    """float32 ``dst[:m]`` <- the m elements of format ``fmt`` at ``addr``."""
    p = _voidptr(addr)
    if fmt == F32:
        xf = carray(p, m, np.float32)
        for j in range(m):
            dst[j] = xf[j]
    elif fmt == F16:
        xh = carray(p, m, np.uint16)
        for j in range(m):
            dst[j] = dec_f16(xh[j])
    elif fmt == BF16:
        xb = carray(p, m, np.uint16)
        for j in range(m):
            dst[j] = dec_bf16(xb[j])
    elif fmt == E4M3:
        x4 = carray(p, m, np.uint8)
        for j in range(m):
            dst[j] = dec_e4m3(x4[j])
    else:
        x5 = carray(p, m, np.uint8)
        for j in range(m):
            dst[j] = dec_e5m2(x5[j])


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
def _reduce_float(out_addr, out_fmt, in_addrs, in_fmt, start, stop, op):  # type: ignore[no-untyped-def]
    k = in_addrs.shape[0]
    acc = np.empty(BLOCK, np.float32)
    kf = np.float32(k)
    isz = _ITEMSIZE[in_fmt]
    osz = _ITEMSIZE[out_fmt]
    for b0 in range(start, stop, BLOCK):
        m = min(BLOCK, stop - b0)
        off = b0 * isz
        if in_fmt == F32 and k >= 4:
            _start4(acc, _f32(in_addrs[0] + off, m), _f32(in_addrs[1] + off, m),
                    _f32(in_addrs[2] + off, m), _f32(in_addrs[3] + off, m), m, op)
            r = 4
            while r + 4 <= k:
                if r + 4 == k and out_fmt == F32 and op != _AVG:
                    _combine4_into(_f32(out_addr + b0 * osz, m), acc, _f32(in_addrs[r] + off, m),
                                   _f32(in_addrs[r + 1] + off, m), _f32(in_addrs[r + 2] + off, m),
                                   _f32(in_addrs[r + 3] + off, m), m, op)
                    r = k + 1  # done: out written
                    break
                _combine4(acc, _f32(in_addrs[r] + off, m), _f32(in_addrs[r + 1] + off, m),
                          _f32(in_addrs[r + 2] + off, m), _f32(in_addrs[r + 3] + off, m), m, op)
                r += 4
        else:
            _decode(acc, in_addrs[0] + off, in_fmt, m)
            r = 1
        if r > k:
            continue
        for q in range(r, k):
            _accumulate(acc, in_addrs[q] + off, in_fmt, m, op)
        if op == _AVG:
            for j in range(m):
                acc[j] = acc[j] / kf
        _encode(out_addr + b0 * osz, out_fmt, acc, m)


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

    __slots__ = ("n", "out_addr", "out_fmt", "in_addrs", "in_fmt", "op", "nbytes")

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

    def run(self, start: int, stop: int) -> None:
        if stop <= start:
            return
        if self.in_fmt >= I32:
            _reduce_int(self.out_addr, self.in_addrs, self.in_fmt, start, stop, self.op)
        else:
            _reduce_float(self.out_addr, self.out_fmt, self.in_addrs, self.in_fmt, start, stop, self.op)


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_INPUTS, thread_name_prefix="ff-hfreduce-kernel")
        return _pool


def _run_threaded(plan: _Plan, threads: int) -> None:
    n = plan.n
    parts = min(threads, max(1, plan.nbytes // _MIN_PARALLEL_BYTES), max(1, n // _ALIGN))
    if parts <= 1:
        plan.run(0, n)
        return
    step = -(-n // parts)
    step = -(-step // _ALIGN) * _ALIGN
    bounds = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
    pool = _get_pool()
    futures = [pool.submit(plan.run, lo, hi) for lo, hi in bounds[:-1]]
    try:
        plan.run(*bounds[-1])
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
    plan = _Plan(out, inputs, op, widen=True)
    if threads is None:
        threads = default_threads()
    elif not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise InvalidArgument(f"threads must be a positive int, got {threads!r}", argument="threads")
    _run_threaded(plan, threads)
    return out


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
