"""Fan-out copies for the allreduce write-back: one source into several destinations.

The node worker ends every op by writing the result into the local ranks' buffers:
``K - 1`` copies of the whole result per op (``K`` local ranks; rank 0's buffer is the
work buffer).  With ``np.copyto`` each copy is a memcpy below glibc's non-temporal
threshold (the worker copies chunk by chunk), so every destination line is first
*read* into the cache and then written: three streams of memory traffic per copy.
On a memory-bound 2-core machine running two node workers, the write-back was the
largest single share of a 2 x 4 ranks 64 MiB allreduce.

:func:`copy_into` instead walks the source in cache-sized blocks and writes each block
to every destination with non-temporal 64-byte stores (x86 only): the source is read
from memory once for all destinations, each destination is written once and never read,
so ``K - 1`` copies cost ``1 + (K - 1)`` streams instead of ``3 (K - 1)``.  The ends that
are not 64-byte aligned, small calls and other machines use plain copies.  Bytes are
copied as they are (integer vectors), whatever the dtype.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from fireflyer.core.errors import InvalidArgument

from . import kernels
from .jitcache import drop_stale
from .kernels import _sfence, _voidptr

__all__ = ["copy_into", "NT_MIN_BYTES"]

#: non-temporal stores only pay when the destination would not stay cached anyway, and
#: an ``sfence`` per call has a cost; smaller copies use ``np.copyto``
NT_MIN_BYTES = 256 << 10
#: bytes of source per block: well inside L2 (1 MiB on the CI machine), so the second and
#: later destinations read it from the cache
_BLOCK = 128 << 10
_NT = platform.machine().lower() in ("x86_64", "amd64")


@intrinsic
def _copy_nt(typingctx, dst, src, nvec):  # type: ignore[no-untyped-def]
    """``nvec`` 64-byte vectors from address ``src`` (any alignment) to ``dst`` (64-byte
    aligned) with non-temporal stores."""
    if not all(isinstance(a, types.Integer) for a in (dst, src, nvec)):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        dst_v, src_v, nvec_v = args
        vec = ir.VectorType(ir.IntType(64), 8).as_pointer()
        s = builder.inttoptr(src_v, vec)
        d = builder.inttoptr(dst_v, vec)
        nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        with cgutils.for_range(builder, nvec_v) as loop:
            i = loop.index
            v = builder.load(builder.gep(s, [i]), align=1)
            st = builder.store(v, builder.gep(d, [i]), align=64)
            st.set_metadata("nontemporal", nontemporal)
        return context.get_dummy_value()

    return types.none(dst, src, nvec), codegen


@njit(nogil=True, cache=True)
def _plain(dst, src, n):  # type: ignore[no-untyped-def]
    d = carray(_voidptr(dst), n, np.uint8)
    s = carray(_voidptr(src), n, np.uint8)
    for j in range(n):
        d[j] = s[j]


@njit(nogil=True, cache=True)
def _fan_out(dsts, src, nbytes, block):  # type: ignore[no-untyped-def]
    """Copy ``nbytes`` at ``src`` to every address in ``dsts``, block by block."""
    for b0 in range(0, nbytes, block):
        m = min(block, nbytes - b0)
        s = src + b0
        for i in range(dsts.shape[0]):
            d = dsts[i] + b0
            h = min(m, (-d) & 63)  # plain bytes up to the destination's first 64-byte boundary
            nvec = (m - h) >> 6
            if h:
                _plain(d, s, h)
            _copy_nt(d + h, s + h, nvec)
            t = h + (nvec << 6)
            if t < m:
                _plain(d + t, s + t, m - t)
    _sfence()


def _check(a: object, what: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise InvalidArgument(f"{what} must be a numpy array, got {type(a).__name__}", argument=what)
    if a.ndim != 1 or not a.flags.c_contiguous:
        raise InvalidArgument(f"{what} must be 1-D and contiguous", argument=what)
    return a


def copy_into(dsts: Sequence[np.ndarray], src: np.ndarray) -> None:
    """Write ``src``'s bytes into every array of ``dsts`` (same dtype and length, writable,
    not overlapping ``src``); see the module docs for why not ``np.copyto``."""
    _check(src, "src")
    for i, d in enumerate(dsts):
        _check(d, f"dsts[{i}]")
        if d.dtype != src.dtype or d.shape != src.shape:
            raise InvalidArgument(f"dsts[{i}] is {d.dtype}[{d.shape[0]}], src is {src.dtype}[{src.shape[0]}]",
                                  argument=f"dsts[{i}]")
        if not d.flags.writeable:
            raise InvalidArgument(f"dsts[{i}] is read-only", argument=f"dsts[{i}]")
        if np.may_share_memory(d, src):  # exact for 1-D contiguous arrays
            raise InvalidArgument(f"dsts[{i}] overlaps src", argument=f"dsts[{i}]")
    if not dsts or src.nbytes == 0:
        return
    if not _NT or src.nbytes < NT_MIN_BYTES:
        for d in dsts:
            np.copyto(d, src)
        return
    addrs = np.fromiter((d.ctypes.data for d in dsts), dtype=np.int64, count=len(dsts))
    _fan_out(addrs, src.ctypes.data, src.nbytes, _BLOCK)


#: the sources this module's jitted code is compiled from (:mod:`.jitcache`)
JIT_SOURCES = (__file__, *kernels.JIT_SOURCES)
drop_stale(__file__, _fan_out, JIT_SOURCES)
