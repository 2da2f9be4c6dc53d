"""Streamed halves: the byte-moving inner loops of large HFReduce ops, sockets included, in numba.

A large op moves its data through several stages on a node: the children's
partial arrives from a socket, is reduced with the local ranks' buffers, goes on to
the parent (or, at a root, down to the children) and is copied into every local
rank's buffer.  Done a chunk (megabytes) per stage, each stage reads what the
previous one wrote back from memory: the received chunk, the partial, the final
chunk before its fan-out.  Done in *blocks* of :data:`BLOCK_BYTES`, small enough
to stay in the core's L2, every stage after the first finds its input in the
cache, and only the ranks' buffers stream from and to memory.  The kernel's socket
copies get cheaper too: a receiver that keeps up copies from socket buffers that
are still cached.

Measured on the 2-core CI VM with a prototype of these loops (2026-11-25, 2 nodes x
4 ranks and 4 nodes x 1 rank, 64 MiB fp32, interleaved runs): 256 KiB blocks took
67-82 ms and 97-120 ms per op, 4 MiB blocks 96-108 ms and 120-167 ms (the default is now
512 KiB: see :data:`BLOCK_BYTES`).

**One call per half.**  A streamed op sends each tree's half as one frame; one loop
call moves all of it, with the GIL released and no Python per block (a Python step
per 4 MiB chunk cost more CPU than the blocks saved).  The loops call ``sendmsg`` /
``recvmsg`` themselves (libc symbols bound by name, so the compiled code caches like
the kernels).  The framing of the frame itself stays in Python: the caller sends its
head (:meth:`FramedSocket.send_head`) and hands over the bytes the reader already
buffered past the header (``pre``).

**Blocks on the wire.**  Every block is followed by an 8-byte marker,
``_MAGIC | block << 1 | aborted`` (:func:`framed_bytes` is a frame's length).  A loop
that must stop early -- its engine failed (``abort[0]`` nonzero, checked before every
block), a socket failed, a peer aborted -- first ends every frame it is sending with an
*aborted block* (any bytes, then a marker with the abort bit), so its peers keep their
framing: they stop at that block and read the abort frame that follows on the link,
which names the failure, instead of waiting for data that will not come.  A marker
that is not the expected one is a framing error (``BAD_FRAME``).

**Status array** ``io`` (int64, :data:`IO_LEN` + one slot per input socket),
written by the loop, read by Python after it returns (and, racily, by the deadline
thread, to see blocks move and to say whom a stalled op waits for):

- ``io[IO_WAIT_FD]``: the socket of the call the loop is in (-1: none), and
  ``io[IO_WAIT_SEND]`` 1 for a send, 0 for a receive;
- ``io[IO_FAIL_FD]``: the socket whose call failed or that sent an aborted or bad
  block (-1: none), ``io[IO_ERRNO]`` the errno (0: the peer closed the connection);
- ``io[IO_DONE]``: blocks done;
- ``io[IO_GOT + i]``: bytes taken from input socket ``i`` (``pre`` included), so that
  after a failure the rest of a frame can be drained.

**One loop behind another.**  ``sync`` (:func:`new_sync`: two int32 words) lets a loop on
one thread wait, block by block, for a loop of the same process on another: the publisher
counts each block it finishes (``after`` = :data:`PUBLISH`), the waiter (``after >= 0``)
sends its block ``j`` only once the count reaches ``after + j + 1``, sleeping on a futex
meanwhile (no spinning: the VMs have two cores for several nodes) and waking every few
milliseconds to see ``abort``.  The ring's sender waits so on its reader (:mod:`._ring`).

``times`` (float64[4]) accumulates seconds spent reducing, receiving, sending and
copying out.  A loop blocked in a socket call is woken when the engine shuts its
sockets down.
"""

from __future__ import annotations

import functools
import platform
import sys
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from fireflyer.core.errors import ProtocolError

from . import _rootpass, copies, kernels
from ._lowp import F32, I32
from ._rootpass import sum_store
from .caches import SYS_CACHE, cache_bytes
from .copies import _fan_out, _plain
from .jitcache import drop_stale
from .kernels import _SUM, MAX_INPUTS, _reduce_int, _reduce_typed, _reduce_typed_acc, _voidptr

if TYPE_CHECKING:
    from fireflyer.wire.conn import FramedSocket

__all__ = ["BLOCK_BYTES", "MARKER_BYTES", "OK", "FAILED", "ABORTED", "PEER_ABORTED", "BAD_FRAME", "IO_LEN",
           "IO_WAIT_FD", "IO_WAIT_SEND", "IO_FAIL_FD", "IO_ERRNO", "IO_DONE", "IO_GOT", "T_REDUCE", "T_RECV",
           "T_SEND", "T_COPY", "LAND", "NO_SYNC", "PUBLISH", "new_io", "new_sync", "up_chunk", "down_chunk",
           "framed_bytes", "in_place_sub", "l1d_bytes", "drain_frame"]

#: bytes per block of a streamed chunk: the inputs of one block (a child's block, the output
#: block) stay in the core's L2 (1-2 MiB on the VMs measured) while the local ranks' buffers
#: stream past.  512 KiB rather than 256: half the socket calls and wakeups per byte.  On the
#: twelfth VM (2026-11-26, 1 MiB L2) 4 nodes x 1 rank at 64 MiB took 56.5-62.2 ms per op against
#: 60.4-67.9 ms with 256 KiB (four interleaved 100-op launches each), 2 x 4 about 4% less, 2 x 1
#: the same; the ninth and eleventh VMs showed no difference, the tenth ~6% less on 2 x 4 with 1 MiB
BLOCK_BYTES = 512 << 10

#: loop outcomes: done; a socket call failed (``io`` names it); our engine failed (the outgoing
#: frames were ended with an aborted block); a peer ended its frame with an aborted block (its
#: abort frame follows); a block marker was not the expected one (a framing error)
OK, FAILED, ABORTED, PEER_ABORTED, BAD_FRAME = 0, 1, 2, 3, 4
IO_WAIT_FD, IO_WAIT_SEND, IO_FAIL_FD, IO_ERRNO, IO_DONE, IO_GOT = 0, 1, 2, 3, 4, 5
IO_LEN = IO_GOT
#: ``up_chunk``'s ``parent`` for a step whose blocks land in ``work`` (and the mirrors) and go
#: nowhere: the receiving half of a ring's reduce-scatter step
LAND = -2
#: a loop's ``after`` (the last two arguments of :func:`up_chunk` / :func:`down_chunk`):
#: ``after >= 0`` waits before its block ``j`` until ``sync`` counts ``after + j + 1`` blocks
#: (the ring's sender, behind its reader); ``PUBLISH`` counts each of its blocks in ``sync``
#: once done (the ring's reader); ``NO_SYNC`` neither
NO_SYNC, PUBLISH = -1, -2
#: a loop's ``work`` when this node's result is not wanted (a reduce on a node without its root,
#: :class:`._streamed.StreamOp`'s ``discard``): each final block is made in, or received into,
#: ``scratch`` (one block, in the cache), goes on to the children and the mirrors, and is
#: written nowhere else.  Writing them to a scratch ``work`` buffer cost a whole buffer's
#: writes, each line read from memory first (the allreduce writes over the lines of a rank's
#: buffer it has just read): see :mod:`.opexec` for what it saves
DISCARD = 0
#: bytes of the marker after every block: ``_MAGIC | block << 1 | aborted``
MARKER_BYTES = 8
_MAGIC = 0x4646424B << 32  # "FFBK"
T_REDUCE, T_RECV, T_SEND, T_COPY = 0, 1, 2, 3

_MSG_WAITALL = 0x100
_MSG_NOSIGNAL = 0x4000  # a closed peer is an error code, not SIGPIPE
_EINTR = 4
_CLOCK_MONOTONIC = 1
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_PTR = ir.IntType(8).as_pointer()


def new_io(inputs: int) -> np.ndarray:
    """A status array for a loop reading from ``inputs`` sockets."""
    io = np.zeros(IO_LEN + max(1, inputs), dtype=np.int64)
    io[IO_WAIT_FD] = io[IO_FAIL_FD] = -1
    return io


# ------------------------------------------------------------------ libc, by symbol name

@intrinsic
def _errno(typingctx):  # type: ignore[no-untyped-def]
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32.as_pointer(), []),
                                            "__errno_location")
        return builder.sext(builder.load(builder.call(fn, [])), _I64)

    return types.int64(), codegen


@intrinsic
def _monotonic_ns(typingctx):  # type: ignore[no-untyped-def]
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ts = cgutils.alloca_once(builder, ir.ArrayType(_I64, 2))
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [_I32, _PTR]), "clock_gettime")
        builder.call(fn, [ir.Constant(_I32, _CLOCK_MONOTONIC), builder.bitcast(ts, _PTR)])
        sec = builder.load(builder.gep(ts, [ir.Constant(_I32, 0), ir.Constant(_I32, 0)]))
        nsec = builder.load(builder.gep(ts, [ir.Constant(_I32, 0), ir.Constant(_I32, 1)]))
        return builder.add(builder.mul(sec, ir.Constant(_I64, 1_000_000_000)), nsec)

    return types.int64(), codegen


# ------------------------------------------------------------------ progress between two loops

#: ``futex(2)``'s system call number where we know it (elsewhere a gated loop naps instead)
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower(), -1)
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129
#: how long a gated loop sleeps at most before it looks at ``abort`` again
_GATE_NAP_NS = 5_000_000


@intrinsic
def _load_i32(typingctx, addr):  # type: ignore[no-untyped-def]
    """The int32 at ``addr``, a sequentially consistent atomic load."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ptr = builder.inttoptr(args[0], _I32.as_pointer())
        return builder.sext(builder.load_atomic(ptr, "seq_cst", 4), _I64)

    return types.int64(types.int64), codegen


@intrinsic
def _store_i32(typingctx, addr, value):  # type: ignore[no-untyped-def]
    """``value`` to the int32 at ``addr``, a sequentially consistent atomic store."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ptr = builder.inttoptr(args[0], _I32.as_pointer())
        builder.store_atomic(builder.trunc(args[1], _I32), ptr, "seq_cst", 4)
        return context.get_dummy_value()

    return types.none(types.int64, types.int64), codegen


@intrinsic
def _futex(typingctx, addr, op, val, nap_ns):  # type: ignore[no-untyped-def]
    """``futex(addr, op, val, {nap_ns})`` through libc's ``syscall`` (a wait's timeout is relative)."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        addr_v, op_v, val_v, nap_v = args
        ts = cgutils.alloca_once(builder, ir.ArrayType(_I64, 2))
        builder.store(builder.sdiv(nap_v, ir.Constant(_I64, 1_000_000_000)),
                      builder.gep(ts, [ir.Constant(_I32, 0), ir.Constant(_I32, 0)]))
        builder.store(builder.srem(nap_v, ir.Constant(_I64, 1_000_000_000)),
                      builder.gep(ts, [ir.Constant(_I32, 0), ir.Constant(_I32, 1)]))
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, [_I64], var_arg=True), "syscall")
        return builder.call(fn, [ir.Constant(_I64, _SYS_FUTEX), addr_v, op_v, val_v,
                                 builder.ptrtoint(ts, _I64), ir.Constant(_I64, 0), ir.Constant(_I64, 0)])

    return types.int64(types.int64, types.int64, types.int64, types.int64), codegen


@intrinsic
def _usleep(typingctx, us):  # type: ignore[no-untyped-def]
    """libc's ``usleep(us)``: the gate's nap where the futex is not known."""
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [_I32]), "usleep")
        builder.call(fn, [builder.trunc(args[0], _I32)])
        return context.get_dummy_value()

    return types.none(types.int64), codegen


def new_sync() -> np.ndarray:
    """Room for one loop's progress that another loop of the same process waits on (``sync``
    of :func:`up_chunk` / :func:`down_chunk`): blocks done, and whether a loop sleeps on it."""
    return np.zeros(2, dtype=np.int32)


@njit(nogil=True, cache=True)
def _publish(sync):  # type: ignore[no-untyped-def]
    """One more block done in ``sync``; wakes the loop that waits for it, if one sleeps."""
    addr = sync.ctypes.data
    _store_i32(addr, _load_i32(addr) + 1)
    if _load_i32(addr + 4) != 0 and _SYS_FUTEX >= 0:
        _futex(addr, _FUTEX_WAKE_PRIVATE, 1, 0)


@njit(nogil=True, cache=True)
def _gate(sync, need, abort):  # type: ignore[no-untyped-def]
    """Wait until ``sync`` counts ``need`` blocks (False: our engine failed meanwhile).

    The waiter says it sleeps, then looks at the count again before it sleeps on it (both
    sequentially consistent, so a publisher either sees the flag or the waiter sees the new
    count), and the futex sleeps only while the count is still the one it saw: no wakeup is
    lost.  The nap bounds how long an abort goes unseen."""
    addr = sync.ctypes.data
    if _load_i32(addr) >= need:
        return True
    ok = True
    while True:
        if abort[0] != 0:
            ok = False
            break
        _store_i32(addr + 4, 1)
        seen = _load_i32(addr)
        if seen >= need:
            break
        if _SYS_FUTEX >= 0:
            _futex(addr, _FUTEX_WAIT_PRIVATE, seen, _GATE_NAP_NS)
        else:
            _usleep(50)
    _store_i32(addr + 4, 0)
    return ok


# ------------------------------------------------------------------ framed blocks

@intrinsic
def _msg_call(typingctx, name, fd, msghdr, flags):  # type: ignore[no-untyped-def]
    """``sendmsg`` or ``recvmsg`` (``name`` a literal) with a ``struct msghdr`` at address ``msghdr``."""
    if not isinstance(name, types.StringLiteral):
        return None
    sym = name.literal_value

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        _, fd_v, msg_v, fl_v = args
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, [_I32, _PTR, _I32]), sym)
        return builder.call(fn, [builder.trunc(fd_v, _I32), builder.inttoptr(msg_v, _PTR), builder.trunc(fl_v, _I32)])

    return types.int64(name, types.int64, types.int64, types.int64), codegen


@njit(nogil=True, cache=True)
def _xfer(fd, is_send, iov, msg, pre, pre_pos, slot, io):  # type: ignore[no-untyped-def]
    """Move exactly the bytes of the segments ``iov`` = [addr0, len0, addr1, len1] (an int64
    array laid out as two ``struct iovec``, advanced in place) over ``fd`` with one
    ``sendmsg`` / ``recvmsg(MSG_WAITALL)`` per attempt; ``msg`` is room for a ``struct
    msghdr``.  A receive first takes the unread bytes of ``pre`` (from ``pre_pos[slot]``).
    False (and ``io`` says why) on failure."""
    if not is_send:
        for s in range(2):
            k = min(iov[2 * s + 1], pre.shape[0] - pre_pos[slot])
            if k > 0:
                d = carray(_voidptr(iov[2 * s]), k, np.uint8)
                p0 = pre_pos[slot]
                for j in range(k):
                    d[j] = pre[p0 + j]
                pre_pos[slot] += k
                io[IO_GOT + slot] += k
                iov[2 * s] += k
                iov[2 * s + 1] -= k
    io[IO_WAIT_FD] = fd
    io[IO_WAIT_SEND] = 1 if is_send else 0
    base = iov.ctypes.data
    while True:
        first = 0 if iov[1] > 0 else 1
        if iov[2 * first + 1] == 0:
            break
        msg[2] = base + first * 16
        msg[3] = 2 - first
        if is_send:
            r = _msg_call("sendmsg", fd, msg.ctypes.data, _MSG_NOSIGNAL)
        else:
            r = _msg_call("recvmsg", fd, msg.ctypes.data, _MSG_WAITALL)
        if r > 0:
            if not is_send:
                io[IO_GOT + slot] += r
            for s in range(first, 2):
                take = min(r, iov[2 * s + 1])
                iov[2 * s] += take
                iov[2 * s + 1] -= take
                r -= take
            continue
        e = 0 if r == 0 else _errno()
        if e == _EINTR:
            continue
        io[IO_FAIL_FD] = fd
        io[IO_ERRNO] = e
        io[IO_WAIT_FD] = -1
        return False
    io[IO_WAIT_FD] = -1
    return True


@njit(nogil=True, cache=True)
def _send_block(fd, addr, nb, marker, st):  # type: ignore[no-untyped-def]
    """One block and its trailing marker to ``fd`` (``st``: the loop's :class:`_State` arrays)."""
    iov, msg, mk_out = st[0], st[1], st[2]
    mk_out[0] = marker
    iov[0] = addr
    iov[1] = nb
    iov[2] = mk_out.ctypes.data
    iov[3] = 8
    return _xfer(fd, True, iov, msg, st[4][:0], st[3], 0, st[5])


@njit(nogil=True, cache=True)
def _recv_block(fd, addr, nb, pre, slot, st):  # type: ignore[no-untyped-def]
    """One block from ``fd`` into ``addr`` and its marker into ``st[4][slot]``."""
    iov, msg, mk_in = st[0], st[1], st[4]
    iov[0] = addr
    iov[1] = nb
    iov[2] = mk_in.ctypes.data + slot * 8
    iov[3] = 8
    return _xfer(fd, False, iov, msg, pre, st[3], slot, st[5])


@njit(nogil=True, cache=True)
def _marker(block, abort):  # type: ignore[no-untyped-def]
    return _MAGIC | (block << 1) | abort


@njit(nogil=True, cache=True)
def _check_marker(st, slot, block, fd):  # type: ignore[no-untyped-def]
    """OK, PEER_ABORTED (the sender stopped: this block is not data) or BAD_FRAME."""
    mk = st[4][slot]
    io = st[5]
    if mk == _marker(block, 0):
        return OK
    io[IO_FAIL_FD] = fd
    if mk == _marker(block, 1):
        return PEER_ABORTED
    io[IO_ERRNO] = 0
    return BAD_FRAME


@njit(nogil=True, cache=True)
def _end_outputs(rc, outs, sent, src, work, isz, a, b, blk, st):  # type: ignore[no-untyped-def]
    """A loop stops early with ``rc``: end every outgoing frame with an aborted block (any bytes
    -- from ``src`` if nonzero, else from ``work`` at the block's place -- then the abort
    marker) at the block it is at, so the peers keep their framing and read the abort frame
    that follows instead of waiting for a payload that will not come.  An output whose send
    failed is left alone: that connection is broken.  Returns ``rc``."""
    io = st[5]
    why = (io[IO_FAIL_FD], io[IO_ERRNO], io[IO_WAIT_FD], io[IO_WAIT_SEND])
    for i in range(outs.shape[0]):
        lo = a + sent[i] * blk
        if (rc == FAILED and why[3] == 1 and outs[i] == why[0]) or lo >= b:
            continue
        nb = (min(b, lo + blk) - lo) * isz
        _send_block(outs[i], src if src else work + lo * isz, nb, _marker(sent[i], 1), st)  # best effort
    io[IO_FAIL_FD], io[IO_ERRNO], io[IO_WAIT_FD], io[IO_WAIT_SEND] = why  # (the sends may have changed them)
    return rc


def framed_bytes(count: int, blk: int, isz: int) -> int:
    """Wire length of a streamed frame of ``count`` elements in blocks of ``blk``: each block of
    ``isz``-byte elements is followed by its marker."""
    return count * isz + MARKER_BYTES * -(-count // blk)


def drain_frame(fs: FramedSocket, plen: int, got: int, block_bytes: int) -> bool:
    """Read and drop the rest of a streamed frame of ``plen`` bytes on ``fs`` of which a loop
    took the first ``got``, block by block (``block_bytes`` of data each, the last shorter).

    A frame can end early: its sender stopped and ended it with an aborted block, and the
    abort frame that says why follows at once.  Draining ``plen - got`` bytes blindly would
    swallow that frame and block on bytes that never come; so every marker is read, and the
    drain stops after an aborted block.  Returns True if the frame ended there (the next frame
    is the sender's abort), False if it was whole.  A marker the loop had started to read
    cannot be checked and is skipped (a loop stops inside a block only when that socket
    failed, and then the drain fails too); a wrong one raises ``ProtocolError`` (framing lost)."""
    stride = block_bytes + MARKER_BYTES
    mark = memoryview(bytearray(MARKER_BYTES))
    pos = got
    while pos < plen:
        j = pos // stride
        at = j * stride + min(block_bytes, plen - j * stride - MARKER_BYTES)  # where block j's marker starts
        if pos > at:  # the loop read part of this marker
            fs.discard(at + MARKER_BYTES - pos)
            pos = at + MARKER_BYTES
            continue
        if pos < at:
            fs.discard(at - pos)
        fs.recv_into(mark)
        pos = at + MARKER_BYTES
        mk = int.from_bytes(mark, sys.byteorder)  # the loops write it as a native int64
        if mk == _marker(j, 1):
            return True
        if mk != _marker(j, 0):
            raise ProtocolError(f"{fs.peer}: block {j} of a streamed frame had a wrong marker ({mk:#x})",
                                reason="bad_frame", peer=fs.peer)
    return False


# ------------------------------------------------------------------ block steps

@njit(nogil=True, cache=True)
def _add_in_place(out_base, src_base, a, b):  # type: ignore[no-untyped-def]
    """``out[i] += src[i]`` for float32 elements [a, b): one pass through one view of ``out``.

    The general kernel sees the output as another view of its first input, so it goes through
    its accumulator and copies back (LLVM's alias check would otherwise take the scalar loop):
    on the twenty-ninth VM 16M elements took 6.8-7.0 ms that way against 3.8 ms here and 3.6 ms
    for numpy's ``np.add(x, y, out=x)``, in 512K blocks on one thread.  The bits are the same:
    ``ins[0] + ins[1]``, one IEEE addition per element, as the kernel's left-to-right order."""
    m = b - a
    x = carray(_voidptr(out_base + a * 4), m, np.float32)
    y = carray(_voidptr(src_base + a * 4), m, np.float32)
    for j in range(m):
        x[j] = x[j] + y[j]


@njit(nogil=True, cache=True)
def _reduce(fmt, op, isz, out_base, ins, a, b):  # type: ignore[no-untyped-def]
    """Elements [a, b) of ``reduce(ins)`` (left to right) at ``out_base + i * isz``."""
    if fmt == F32 and op == _SUM and ins.shape[0] == 2 and ins[0] == out_base:
        _add_in_place(out_base, ins[1], a, b)  # (a ring's reduce-scatter with one rank, a 2-node root)
    elif fmt == F32:
        _reduce_typed(np.float32(0), out_base, fmt, ins, isz, a, b, op)
    else:
        _reduce_int(out_base, ins, fmt, a, b, op)


@njit(nogil=True, cache=True)
def _divide(fmt, addr, m, divisor):  # type: ignore[no-untyped-def]
    """``x /= divisor`` for ``m`` elements at ``addr``: float32 true division, integer floor
    division (``divide_inplace``'s semantics, so streamed and threaded ops agree bit for bit)."""
    p = _voidptr(addr)
    if fmt == F32:
        x = carray(p, m, np.float32)
        d = np.float32(divisor)
        for j in range(m):
            x[j] = x[j] / d
    elif fmt == I32:
        y = carray(p, m, np.int32)
        d32 = np.int32(divisor)
        for j in range(m):
            y[j] = y[j] // d32
    else:
        z = carray(p, m, np.int64)
        d64 = np.int64(divisor)
        for j in range(m):
            z[j] = z[j] // d64


#: elements per sub-block of a root's in-place step (:func:`_reduce_in_place`) when the caller
#: does not choose (:func:`in_place_sub` does, from the machine's L1d): the sub-block's lines of
#: every input, the accumulators and the result (~7 KiB for 4 ranks and a child) stay in L1
#: between the reduce and the stores
_SUB = 256
#: :func:`in_place_sub`'s range, and the share of L1d its sub-blocks may fill: the rest is the
#: stack, the loop's state and lines a set-associative cache places badly
_SUB_MIN, _SUB_MAX = 64, 4096
_L1D_SHARE = 0.75
_L1D_DEFAULT = 32 << 10  # where sysfs does not say: the smallest L1d of the x86 cores measured


def l1d_bytes(base: str = SYS_CACHE) -> int:
    """The level-1 data cache of a core, in bytes, from sysfs (:data:`_L1D_DEFAULT` where it
    cannot be read)."""
    return cache_bytes(1, base) or _L1D_DEFAULT


@functools.cache
def in_place_sub(inputs: int, l1d: int | None = None) -> int:
    """Elements per sub-block of a root's in-place step over ``inputs`` float32 streams (the
    local ranks and the children): the largest power of two whose lines of every input and
    of the two accumulators fill at most :data:`_L1D_SHARE` of L1d (``l1d``; default: this
    machine's).  Bigger sub-blocks mean fewer kernel calls and longer runs of each stream
    for the prefetchers; one that spills L1 reads its lines twice.

    On the sixteenth VM (Intel family 6 model 207, 48 KiB L1d) 2 nodes x 4 ranks at 64 MiB,
    the sub-block switched between ops in one launch (two launches, eight alternating
    rounds): 512 elements took 0.92-0.95x the time of 256, 1024 0.88-0.95x, 2048 0.88x; this
    rule picks 1024 there (5 streams and 2 accumulators of 4 KiB: 28 KiB) and 512 on a
    32 KiB L1d.  The thirteenth VM, the same model, had measured 4096 at ~1.5x."""
    budget = (l1d_bytes() if l1d is None else l1d) * _L1D_SHARE
    per_element = 4 * (max(1, inputs) + 2)
    sub = _SUB_MIN
    while sub < _SUB_MAX and 2 * sub * per_element <= budget:
        sub *= 2
    return sub


@njit(nogil=True, cache=True)
def _reduce_in_place(out_base, ins, own, lo, hi, op, divisor, acc, acc2):  # type: ignore[no-untyped-def]
    """Elements [lo, hi) of the float32 ``reduce(ins)`` (left to right), divided by ``divisor``
    (> 1: ``avg``), at ``out_base + 4 * i`` *and* over every buffer in ``own`` (the local
    ranks', which are inputs too), one sub-block of ``acc.shape[0]`` elements at a time.

    The stores find the ranks' lines still in L1, read a moment before: no line is fetched to
    be written (as a plain store to memory would) and none bypasses the cache (as the
    non-temporal copies of the staged root do, which write the ranks' lines after the whole
    block was read); the dirty lines go back to memory when they are evicted.  On the
    thirteenth VM (one core's memory bandwidth ~20 GB/s each way) 4 ranks and a child over
    64 MiB took 22-24 ms this way against 37-47 ms reduce-then-copy.  ``acc``/``acc2``: float32
    room of one sub-block each (:func:`in_place_sub` elements).
    """
    tag = np.float32(0)
    k = own.shape[0]
    sub = acc.shape[0]
    for a in range(lo, hi, sub):
        b = min(hi, a + sub)
        m = b - a
        _reduce_typed_acc(tag, out_base, F32, ins, 4, a, b, op, acc, acc2)
        src = out_base + a * 4
        if divisor > 1:
            _divide(F32, src, m, divisor)
        for i in range(k):
            _plain(own[i] + a * 4, src, m * 4)


@njit(nogil=True, cache=True)
def _is_own(own, work, mirrors):  # type: ignore[no-untyped-def]
    """Are the outputs (``work``, then the ``mirrors``) exactly the inputs ``own``, in order?"""
    if own.shape[0] != mirrors.shape[0] + 1 or own[0] != work:
        return False
    for i in range(mirrors.shape[0]):
        if own[i + 1] != mirrors[i]:
            return False
    return True


@njit(nogil=True, cache=True)
def _plain_fan_out(dsts, src, nbytes, block):  # type: ignore[no-untyped-def]
    for i in range(dsts.shape[0]):
        _plain(dsts[i], src, nbytes)


#: the write-back of a block into the mirrors: the source is in the cache, the mirrors are
#: not read again soon, so non-temporal stores where the machine has them (x86; chosen here,
#: not in the loop, because the other machines cannot compile the x86 fence)
_fan_out_block = _fan_out if platform.machine().lower() in ("x86_64", "amd64") else _plain_fan_out


@njit(nogil=True, cache=True)
def _copy_out(work, mirrors, off, dsts, src, nbytes):  # type: ignore[no-untyped-def]
    """``nbytes`` at ``src`` to ``off`` bytes into ``work`` (unless it is :data:`DISCARD`) and every
    mirror (``dsts``: room for the addresses)."""
    n = 0
    if work != DISCARD:
        dsts[0] = work + off
        n = 1
    for i in range(mirrors.shape[0]):
        dsts[n + i] = mirrors[i] + off
    n += mirrors.shape[0]
    if nbytes and n:
        _fan_out_block(dsts[:n], src, nbytes, nbytes)


@njit(nogil=True, cache=True)
def _pass_on(outs, sent, src, nb, block, stage, work, mirrors, off, dsts, st, times):  # type: ignore[no-untyped-def]
    """Block ``block`` (``nb`` bytes at ``src``) to every output socket (``sent`` counts them),
    then, with ``stage``, into ``work`` and the mirrors at ``off``.  False if a send failed."""
    t0 = _monotonic_ns()
    for i in range(outs.shape[0]):
        if not _send_block(outs[i], src, nb, _marker(block, 0), st):
            return False
        sent[i] += 1
    t1 = _monotonic_ns()
    times[T_SEND] += (t1 - t0) * 1e-9
    if stage:
        _copy_out(work, mirrors, off, dsts, src, nb)
        times[T_COPY] += (_monotonic_ns() - t1) * 1e-9
    return True


@njit(nogil=True, cache=True)
def _new_state(inputs, io):  # type: ignore[no-untyped-def]
    """A loop's scratch: iovecs, msghdr, outgoing marker, prefix positions, incoming markers, ``io``."""
    n = max(1, inputs)
    return (np.zeros(4, np.int64), np.zeros(7, np.int64), np.zeros(1, np.int64), np.zeros(n, np.int64),
            np.zeros(n, np.int64), io)


@njit(nogil=True, cache=True)
def up_chunk(fmt, op, isz, own, fds, pre, pre_len, slots, scratch, work, parent, mirrors, divisor,
             a, b, blk, io, abort, times, sub, sync, after):  # type: ignore[no-untyped-def]
    """Elements [a, b) of one tree's up step, block by block (see the module docs).

    ``own``: base addresses of the local inputs (element ``i`` of input ``r`` at
    ``own[r] + i * isz``); ``fds``: the children's sockets in tree order, whose
    frames start with ``pre[i, :pre_len[i]]``; ``slots``: one block of room per
    child.  Each block is reduced left to right over ``own`` then the children.
    ``parent >= 0``: the block goes from ``scratch`` (one block of room) to the
    parent.  ``parent < 0`` (the root): it lands in ``work`` (element ``i`` at
    ``work + i * isz``; nowhere when ``work`` is :data:`DISCARD`), is divided by ``divisor``
    (> 1: ``avg``), sent down to every child and copied into every ``mirrors`` address.  ``parent == LAND``: as at the
    root, but sent nowhere (a ring's reduce-scatter step, :mod:`._ring`).  ``sub``: elements per sub-block of
    a root's in-place step (the engine passes :func:`in_place_sub`; 0: :data:`_SUB`).
    ``sync``, ``after``: another loop's progress to wait for, or this one's to publish
    (:data:`PUBLISH`; see :data:`NO_SYNC`).  Returns OK, FAILED, ABORTED, PEER_ABORTED or BAD_FRAME; on all but OK every outgoing
    frame is ended first.
    """
    k = own.shape[0]
    m = fds.shape[0]
    st = _new_state(m, io)
    ins = np.empty(k + m, np.int64)
    for r in range(k):
        ins[r] = own[r]
    wide = k + m > MAX_INPUTS  # more inputs than one kernel call takes: several passes
    ins2 = np.empty(MAX_INPUTS, np.int64)
    dsts = np.empty(mirrors.shape[0] + 1, np.int64)
    # a root with mirrors makes each final block in ``scratch`` (in the cache) and writes it to
    # work and the mirrors with non-temporal stores: work's lines are never read just to be
    # overwritten, and the sends down read the block from the cache
    stage = parent < 0 and (mirrors.shape[0] > 0 or work == DISCARD)
    # ... unless the outputs are the inputs (an allreduce over the ranks' own buffers, the usual
    # case): then each sub-block's result is stored over the ranks' lines just read (see
    # _reduce_in_place), and only the sends down read the block from ``scratch``
    in_place = stage and fmt == F32 and not wide and _is_own(own, work, mirrors)
    # ... and a sum (avg: a sum, divided) over a child or more goes through one pass per vector
    # (_rootpass.sum_store) whose result lands over the first child's block, just received, in
    # the cache, from which it goes down: no scratch block written, nothing stored twice (a
    # ring's landing step sends nothing down, so its result goes to the ranks' buffers only)
    one_pass = in_place and op == _SUM and m > 0
    to_slot = 1 if one_pass and parent != LAND else 0
    finals = np.empty(to_slot + k if one_pass else 0, np.int64)  # where the result goes: the slot, own
    if one_pass:
        finals[to_slot:] = own
    ins_at = np.empty(k + m if one_pass else 0, np.int64)  # sum_store's room for the addresses
    finals_at = np.empty(finals.shape[0], np.int64)
    n_sub = sub if sub > 0 else _SUB
    acc = np.empty(n_sub if in_place and not one_pass else 0, np.float32)
    acc2 = np.empty(n_sub if in_place and not one_pass else 0, np.float32)
    if parent >= 0:
        outs = np.full(1, parent, np.int64)
        spare = scratch  # an aborted block's bytes: any block-sized room of ours
    else:
        outs = fds.copy() if parent != LAND else np.zeros(0, np.int64)
        spare = scratch if work == DISCARD else 0
    sent = np.zeros(outs.shape[0], np.int64)
    block = 0
    for lo in range(a, b, blk):
        hi = min(b, lo + blk)
        n = hi - lo
        nb = n * isz
        if abort[0] != 0 or (after >= 0 and not _gate(sync, after + block + 1, abort)):
            return _end_outputs(ABORTED, outs, sent, spare, work, isz, a, b, blk, st)
        t0 = _monotonic_ns()
        for i in range(m):
            if not _recv_block(fds[i], slots[i], nb, pre[i, :pre_len[i]], i, st):
                return _end_outputs(FAILED, outs, sent, spare, work, isz, a, b, blk, st)
            rc = _check_marker(st, i, block, fds[i])
            if rc != OK:
                return _end_outputs(rc, outs, sent, spare, work, isz, a, b, blk, st)
            ins[k + i] = slots[i] - lo * isz  # so that element lo is the slot's first
        t1 = _monotonic_ns()
        times[T_RECV] += (t1 - t0) * 1e-9
        out_base = scratch - lo * isz if parent >= 0 or stage else work
        if parent >= 0 and k + m == 1:
            src = own[0] + lo * isz  # a leaf with one local input sends it as it is
        elif one_pass:
            if to_slot:
                finals[0] = ins[k]
            sum_store(ins, finals, lo, hi, divisor, ins_at, finals_at)
            src = slots[0]
        else:
            src = out_base + lo * isz
            if wide:  # left to right all the same: the first inputs, then the rest in groups
                r = min(k, MAX_INPUTS)
                _reduce(fmt, op, isz, out_base, ins[:r], lo, hi)
                while r < k + m:
                    g = min(MAX_INPUTS - 1, k + m - r)
                    ins2[0] = out_base
                    ins2[1:g + 1] = ins[r:r + g]
                    _reduce(fmt, op, isz, out_base, ins2[:g + 1], lo, hi)
                    r += g
            elif in_place:
                _reduce_in_place(out_base, ins, own, lo, hi, op, divisor, acc, acc2)
            elif parent >= 0 or stage or k + m > 1 or own[0] != work:
                _reduce(fmt, op, isz, out_base, ins, lo, hi)
            if parent < 0 and divisor > 1 and not in_place:
                _divide(fmt, src, n, divisor)
        times[T_REDUCE] += (_monotonic_ns() - t1) * 1e-9
        if not _pass_on(outs, sent, src, nb, block, stage and not in_place, work, mirrors, lo * isz, dsts, st,
                        times):
            return _end_outputs(FAILED, outs, sent, spare, work, isz, a, b, blk, st)
        block += 1
        io[IO_DONE] = block
        if after == PUBLISH:
            _publish(sync)
    return OK


@njit(nogil=True, cache=True)
def down_chunk(fd, pre, work, scratch, fds, mirrors, isz, a, b, blk, io, abort, times, sync,
               after):  # type: ignore[no-untyped-def]
    """Elements [a, b) of a final chunk from the parent (``fd``, frame starting with ``pre``),
    block by block: into ``work``, on to every child in ``fds``, into every ``mirrors``
    address (with mirrors, each block lands in ``scratch``, one block of room, and goes to
    work and the mirrors with non-temporal stores; with ``work`` :data:`DISCARD` it lands in
    ``scratch`` and goes to the children and the mirrors only).  ``sync``, ``after``: as for
    :func:`up_chunk`.  Returns OK, FAILED, ABORTED,
    PEER_ABORTED or BAD_FRAME; on all but OK the frames to the children are ended first."""
    st = _new_state(1, io)
    dsts = np.empty(mirrors.shape[0] + 1, np.int64)
    stage = mirrors.shape[0] > 0 or work == DISCARD
    spare = scratch if work == DISCARD else 0
    sent = np.zeros(fds.shape[0], np.int64)
    block = 0
    for lo in range(a, b, blk):
        hi = min(b, lo + blk)
        nb = (hi - lo) * isz
        dst = scratch if stage else work + lo * isz
        if abort[0] != 0 or (after >= 0 and not _gate(sync, after + block + 1, abort)):
            return _end_outputs(ABORTED, fds, sent, spare, work, isz, a, b, blk, st)
        t0 = _monotonic_ns()
        if not _recv_block(fd, dst, nb, pre, 0, st):
            return _end_outputs(FAILED, fds, sent, spare, work, isz, a, b, blk, st)
        rc = _check_marker(st, 0, block, fd)
        if rc != OK:
            return _end_outputs(rc, fds, sent, spare, work, isz, a, b, blk, st)
        times[T_RECV] += (_monotonic_ns() - t0) * 1e-9
        if not _pass_on(fds, sent, dst, nb, block, stage, work, mirrors, lo * isz, dsts, st, times):
            return _end_outputs(FAILED, fds, sent, spare, work, isz, a, b, blk, st)
        block += 1
        io[IO_DONE] = block
        if after == PUBLISH:
            _publish(sync)
    return OK


def warm_up() -> None:
    """Compile (or load from numba's cache) both loops with the argument types the engine
    passes, on empty ranges: a cold compile takes ~20 s on a 2-core VM, which must not land
    inside a node's first large op (its deadline counts).  The worker runs this in the
    background at start-up; ``make setup`` runs it once to fill the cache (:mod:`.precompile`)."""
    io, abort, times = new_io(1), np.zeros(1, np.int64), np.zeros(4)
    none = np.zeros(0, np.int64)
    sync = new_sync()
    up_chunk(F32, 0, 4, np.zeros(1, np.int64), none, np.zeros((1, 0), np.uint8), np.zeros(1, np.int64), none,
             0, 0, -1, none, 1, 0, 0, 1, io, abort, times, in_place_sub(1), sync, NO_SYNC)
    down_chunk(-1, np.zeros(0, np.uint8), 0, 0, none, none, 4, 0, 0, 1, io, abort, times, sync, NO_SYNC)


#: the sources this module's jitted code is compiled from (:mod:`.jitcache`)
JIT_SOURCES = (__file__, *kernels.JIT_SOURCES, *copies.JIT_SOURCES, *_rootpass.JIT_SOURCES)
drop_stale(__file__, up_chunk, JIT_SOURCES)
