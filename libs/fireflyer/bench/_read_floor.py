"""The read floor of a reduction: every input read once, and nothing else.

A sum of ``k`` buffers must at least read each of them once, so the time this machine takes
to *only read* them, on the kernel's threads and in the kernel's pattern, is a lower bound on
any implementation's time.  ``ff bench kernels`` measures it beside the fp32 kernel and numpy
in the same run: ``numpy_time / floor`` is then the highest ratio to numpy that any kernel
could have reached there, and ``floor / kernel_time`` how close ours came.  (The floor leaves
out the output's write, so it is generous to the kernel; on a VM whose reads, not writes, are
what is scarce, that is most of the cost.)

The loop mirrors :func:`fireflyer.hfreduce.kernels.reduce_into` on a big float32 sum: threads take byte ranges
from a shared counter, each range is walked in blocks, and each block reads up to four inputs
at a time as 64-byte vector loads (the kernel's four memory streams per pass).  The loads are
folded into a 64-byte XOR digest so the compiler cannot drop them; :func:`read_once` returns
it, which also lets tests check that every byte was read exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from fireflyer.core.errors import InvalidArgument
from fireflyer.hfreduce import kernels
from fireflyer.hfreduce.jitcache import drop_stale
from fireflyer.hfreduce.kernels import _share_chunks, _voidptr

__all__ = ["read_once", "BLOCK_BYTES", "CHUNK_BYTES"]

#: bytes of each input per block: the kernel's stream block (64 Ki float32 elements)
BLOCK_BYTES = 256 << 10
#: bytes read per chunk taken from the shared counter, over all inputs (the kernel's chunk)
CHUNK_BYTES = 16 << 20
_VEC = 64


@intrinsic
def _xor_read(typingctx, p0, p1, p2, p3, nvec, g, sink):  # type: ignore[no-untyped-def]
    """Fold ``nvec`` 64-byte vectors from each of the first ``g`` addresses p0..p3 (any
    alignment) into the 64-byte digest ``sink`` (uint64[8]) with XOR.  ``g`` is a literal."""
    if not (isinstance(g, types.IntegerLiteral) and isinstance(sink, types.Array) and sink.dtype == types.uint64):
        return None
    ng = g.literal_value

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        *ps, nvec_v, _, sink_v = args
        vt = ir.VectorType(ir.IntType(64), 8)
        ptrs = [builder.inttoptr(p, vt.as_pointer()) for p in ps[:ng]]
        data = context.make_array(signature.args[6])(context, builder, sink_v).data
        digest = builder.bitcast(data, vt.as_pointer())
        acc = cgutils.alloca_once(builder, vt)  # promoted to a register by LLVM
        builder.store(builder.load(digest, align=8), acc)
        with cgutils.for_range(builder, nvec_v) as loop:
            v = builder.load(acc)
            for p in ptrs:
                v = builder.xor(v, builder.load(builder.gep(p, [loop.index]), align=1))
            builder.store(v, acc)
        builder.store(builder.load(acc), digest, align=8)
        return context.get_dummy_value()

    return types.none(p0, p1, p2, p3, nvec, g, sink), codegen


@njit(nogil=True, cache=True)
def _read_range(addrs, lo, hi, block, sink):  # type: ignore[no-untyped-def]
    """Read bytes ``[lo, hi)`` of every buffer at ``addrs`` into ``sink``; ``lo`` and ``block``
    are multiples of 64, so a byte's digest lane is its offset modulo 64."""
    k = addrs.shape[0]
    tail_sink = sink.view(np.uint8)
    for b0 in range(lo, hi, block):
        m = min(block, hi - b0)
        nvec = m >> 6
        r = 0
        while r < k:
            g = min(4, k - r)
            p0 = addrs[r] + b0
            p1 = addrs[min(r + 1, k - 1)] + b0
            p2 = addrs[min(r + 2, k - 1)] + b0
            p3 = addrs[min(r + 3, k - 1)] + b0
            if g == 4:
                _xor_read(p0, p1, p2, p3, nvec, 4, sink)
            elif g == 3:
                _xor_read(p0, p1, p2, p3, nvec, 3, sink)
            elif g == 2:
                _xor_read(p0, p1, p2, p3, nvec, 2, sink)
            else:
                _xor_read(p0, p1, p2, p3, nvec, 1, sink)
            r += g
        tail = m - (nvec << 6)
        for r in range(k):  # the buffers' last bytes past the final whole vector
            src = carray(_voidptr(addrs[r] + b0 + (nvec << 6)), tail, np.uint8)
            for j in range(tail):
                tail_sink[j] ^= src[j]


def read_once(bufs: Sequence[np.ndarray], threads: int = 1, *, block: int = BLOCK_BYTES,
              chunk: int = CHUNK_BYTES) -> np.ndarray:
    """Read every byte of the equally sized, C-contiguous ``bufs`` once over ``threads``
    threads; returns their 64-byte XOR digest (uint64[8]: byte ``j`` is the XOR of every
    byte at an offset ``j`` modulo 64 in every buffer).  ``block``: bytes of each buffer per
    block; ``chunk``: bytes per chunk over all buffers; each share is rounded down to a
    multiple of 64 (at least 64)."""
    if threads < 1:
        raise InvalidArgument(f"threads must be at least 1, got {threads}", argument="threads", value=threads)
    views = []
    for i, b in enumerate(bufs):
        if not isinstance(b, np.ndarray) or not b.flags.c_contiguous:
            raise InvalidArgument(f"buffer {i} is not a C-contiguous numpy array", argument="bufs", index=i)
        views.append(b.reshape(-1).view(np.uint8))
    digest = np.zeros(8, np.uint64)
    if not views:
        return digest
    nbytes = views[0].nbytes
    if any(v.nbytes != nbytes for v in views):
        raise InvalidArgument(f"buffers differ in size: {sorted({v.nbytes for v in views})} bytes",
                              argument="bufs")
    block = max(_VEC, block // _VEC * _VEC)
    per_buf = max(_VEC, chunk // len(views) // _VEC * _VEC)  # bytes of each buffer per chunk
    addrs = np.array([v.ctypes.data for v in views], np.int64)
    nchunks = -(-nbytes // per_buf)
    sinks = [np.zeros(8, np.uint64) for _ in range(min(threads, max(1, nchunks)))]  # one per worker

    def run(worker: int, i: int) -> None:
        lo = i * per_buf
        _read_range(addrs, lo, min(lo + per_buf, nbytes), block, sinks[worker])

    _share_chunks(nchunks, len(sinks), run)
    for s in sinks:
        digest ^= s
    return digest


#: the sources this module's jitted code is compiled from (:mod:`fireflyer.hfreduce.jitcache`)
JIT_SOURCES = (__file__, *kernels.JIT_SOURCES)
drop_stale(__file__, _read_range, JIT_SOURCES)
