"""Streamed ops: threaded allreduces whose data the engine moves in cache-sized blocks.

:class:`Streaming` is a mixin of :class:`~fireflyer.hfreduce.engine.NodeEngine` (no
state of its own).  A threaded op *streams* (:meth:`Streaming.can_stream`) when its
dtype travels as it is (float32, int32, int64) and streaming is on -- the same answer
on every node.  The engine then makes this node's partial itself, from ``inputs`` (the
local ranks' buffers; by default just ``work``), and writes the result into ``work``
and the ``mirrors`` (the other ranks' buffers): no ``fill`` / ``fuse`` / ``on_final``
write-back.  Each tree's half is one frame per link and direction, moved by one
:mod:`._blocks` loop call, block by block:

- **up** (the tree's up thread): the children's blocks are received straight from their
  sockets, reduced with the inputs, and sent to the parent -- or, at the root, written to
  ``work`` (divided for ``avg``), sent down to the children and copied to the mirrors --
  when ``work`` and the mirrors are the inputs themselves (the ranks' buffers, the usual
  case) each result is stored straight over the lines just read (a sum in one pass per
  vector, :func:`._rootpass.sum_store`, landing in the first child's block too, from which
  it goes down; max / min a sub-block at a time, ``_blocks._reduce_in_place``);
- **down** (the reader of the parent link): each block of the final half is received
  into ``work``, forwarded to the children and copied to the mirrors.

A node that does not want the result (a reduce whose root is elsewhere) passes
``discard``: its final blocks are made or received in a cached block, go on to the children
and the mirrors, and ``work`` is left alone (the ring ignores it: its pieces live in ``work``).

The down writers and the fill thread sit those ops out.  The deadline counts moving
blocks as progress (:meth:`Streaming._loops_moved`); a stalled loop names the socket it
is blocked on (:meth:`Streaming._stream_waits`).  A loop that stops early ends its
outgoing frames with an aborted block, so that peers read the abort frame behind it
(:mod:`._blocks`, :meth:`Streaming._loop_stopped`).

**Parked frames.**  An up frame of any threaded op carries ``"p": 1`` in its meta.  The
child link's reader reads its header and *parks* it (:class:`Parked`): it leaves the
payload on the socket and waits until the up thread has taken it -- the streamed loop
reads it block by block, a non-streamed op's up step (:meth:`Streaming._recv_parked`)
into a ring slot.  After a failure the reader drains whatever the up thread left -- a
streamed frame block by block, up to an aborted block if its sender ended it early
(:func:`._blocks.drain_frame`): the sender's abort frame follows that block.
Small (inline) ops keep their ring: their frames carry no ``"p"``.  A parked frame met
by an inline op, or a ring frame met by a threaded op, is a fingerprint mismatch.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import numpy as np

from fireflyer.core.errors import FireFlyerError, InvalidArgument, ProtocolError
from fireflyer.hfreduce import _blocks as B
from fireflyer.hfreduce._links import CHILD, Link
from fireflyer.hfreduce._pipeline import DOWN, UP, _Failed
from fireflyer.hfreduce.errors import CollectiveAborted, HFReduceError
from fireflyer.hfreduce.kernels import _FORMATS, _OP_CODE
from fireflyer.wire.frame import Request

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fireflyer.hfreduce._op import OpState
    from fireflyer.hfreduce.engine import NodeEngine

__all__ = ["Parked", "StreamOp", "Streaming", "STREAM_DTYPES"]

#: work dtypes a streamed op carries (the block loops' kernels take them as they are)
STREAM_DTYPES = frozenset(np.dtype(d) for d in (np.float32, np.int32, np.int64))
_EMPTY = np.zeros(0, dtype=np.int64)
#: the trees' loops neither wait for nor publish progress (``sync`` is unused with ``NO_SYNC``)
_UNSYNCED = B.new_sync()


class Parked:
    """A child's up frame whose header the reader has read; its payload is still on the socket.

    ``taken``: the up thread owns the socket's payload; ``done``: it gave it back, having
    consumed ``got`` bytes of it (the reader drains the rest after a failure).
    """

    __slots__ = ("rid", "c", "plen", "fp", "taken", "done", "got", "block_bytes")

    def __init__(self, rid: int, c: int, plen: int, fp: object) -> None:
        self.rid, self.c, self.plen, self.fp = rid, c, plen, fp
        self.taken = self.done = False
        self.got = 0
        #: a streamed frame's data bytes per block (its rest is drained block by block); 0: plain
        self.block_bytes = 0


class StreamOp:
    """A streamed op's inputs and mirrors as the block loops take them (base addresses), and its
    block (``blk`` elements: the same on every node, checked when the links connect).
    ``discard``: this node does not want the result in ``work`` (only in the mirrors, if any);
    the loops then leave ``work`` alone (:data:`._blocks.DISCARD`)."""

    __slots__ = ("fmt", "opcode", "own", "mirrors", "keep", "blk", "discard")

    def __init__(self, work: np.ndarray, inputs: Sequence[np.ndarray], mirrors: Sequence[np.ndarray],
                 redop: str, block_bytes: int, *, discard: bool = False) -> None:
        self.discard = discard
        self.blk = max(1, block_bytes // work.dtype.itemsize)
        self.fmt = _FORMATS[work.dtype]
        self.opcode = _OP_CODE[redop]
        self.own = np.array([x.ctypes.data for x in inputs], dtype=np.int64)
        self.mirrors = np.array([x.ctypes.data for x in mirrors], dtype=np.int64)
        self.keep = (list(inputs), list(mirrors))  # the addresses stay valid while the op runs


def check_buffers(work: np.ndarray, inputs: Sequence[np.ndarray], mirrors: Sequence[np.ndarray]) -> None:
    """``inputs`` and ``mirrors`` must look exactly like ``work`` (InvalidArgument otherwise)."""
    for what, arrs in (("inputs", inputs), ("mirrors", mirrors)):
        for i, x in enumerate(arrs):
            if not isinstance(x, np.ndarray) or x.dtype != work.dtype or x.shape != work.shape \
                    or not x.flags.c_contiguous:
                raise InvalidArgument(f"{what}[{i}] must be a contiguous {work.dtype}[{work.size}] array like work",
                                      argument=f"{what}[{i}]")
    for i, x in enumerate(mirrors):
        if not x.flags.writeable or np.may_share_memory(x, work):
            raise InvalidArgument(f"mirrors[{i}] must be writable and apart from work", argument=f"mirrors[{i}]")
    if not inputs:
        raise InvalidArgument("inputs must name at least one buffer", argument="inputs")
    # a root reduces more than 16 inputs in several passes into work: it may be the first input only
    if any(np.may_share_memory(x, work) for x in inputs[1:]):
        raise InvalidArgument("work may be inputs[0] but no other input", argument="inputs")


class _LoopBuffers:
    """One engine thread's room for its block loops: status, times, and blocks of scratch."""

    __slots__ = ("io", "times", "scratch", "slots", "slot_addrs", "busy", "calls")

    def __init__(self, inputs: int, block_bytes: int, slots: int = 0) -> None:
        self.io = B.new_io(inputs)
        self.times = np.zeros(4)
        self.scratch = np.empty(block_bytes, dtype=np.uint8)
        self.slots = [np.empty(block_bytes, dtype=np.uint8) for _ in range(slots)]
        self.slot_addrs = np.array([x.ctypes.data for x in self.slots], dtype=np.int64)
        #: a loop runs now (the deadline thread reads ``io`` to say whom it waits for)
        self.busy = False
        #: loops started: with ``io[IO_DONE]`` it tells the deadline thread whether blocks moved
        self.calls = 0

    def reset(self) -> None:
        self.io[:] = 0
        self.io[B.IO_WAIT_FD] = self.io[B.IO_FAIL_FD] = -1
        self.times[:] = 0.0
        self.calls += 1


class Streaming:
    """Streamed steps and parked frames (mixin; see the module docstring)."""

    # ------------------------------------------------------------------ set-up

    def _setup_streaming(self: NodeEngine) -> None:
        """Per-thread loop buffers (after the links exist) and the abort flag the loops poll."""
        self._abort = np.zeros(1, dtype=np.int64)
        self._up_bufs = [_LoopBuffers(len(self._children[t]), self.block_bytes, len(self._children[t]))
                         for t in (0, 1)]
        self._child_fds = [np.array([lk.fs.sock.fileno() for lk in self._children[t]], dtype=np.int64)
                           for t in (0, 1)]
        # (the parent links' down loops; the ring's links, tree 2, have their own below)
        self._down_bufs = {id(lk): _LoopBuffers(1, self.block_bytes) for lk in self._links
                           if lk.role != CHILD and lk.tree in (0, 1)}
        #: the ring's sender and reader (:mod:`._ring`): none without a ring
        self._ring_bufs = ((_LoopBuffers(0, self.block_bytes), _LoopBuffers(1, self.block_bytes, 1))
                           if self._ring_prev is not None else ())
        self._by_fd = {lk.fs.sock.fileno(): lk for lk in self._links}
        self._loops_seen: tuple[int, ...] = ()

    def can_stream(self: NodeEngine, work: np.ndarray) -> bool:
        """Does :meth:`allreduce` stream this op?  Several nodes, a threaded (not inline) op, a
        dtype that travels as it is, streaming on.  The same answer on every node (the dtype and
        size are in the fingerprint, the switch and the block size in the link handshake), as it
        must be: a streamed op's frames carry a whole half of the buffer, in blocks."""
        return (self.nnodes > 1 and self.streaming and work.dtype in STREAM_DTYPES
                and work.nbytes > self.inline_bytes)

    def _loops_moved(self: NodeEngine) -> bool:
        """Under the lock, for the deadline: did any block loop move a block since we last asked?"""
        bufs = [*self._up_bufs, *self._down_bufs.values(), *self._ring_bufs]
        seen = tuple(x for b in bufs for x in (b.calls, int(b.io[B.IO_DONE])))
        moved = seen != self._loops_seen and any(b.busy for b in bufs)
        self._loops_seen = seen
        return moved

    # ------------------------------------------------------------------ parked frames

    def _park(self: NodeEngine, lk: Link, hdr: Request, plen: int) -> None:
        """Reader: hand an up frame's payload to the tree's up thread; drain what it leaves."""
        meta = hdr.meta
        p = Parked(hdr.rid, meta.get("c", -1), plen, meta.get("fp"))
        with self._mu:
            st = self._op
            if st is not None and self._in_op and st.inline and hdr.rid == st.k:
                self._parked_mismatch(st, lk, p)  # a threaded op's frame for the small op we run
            if st is not None and st.bcast is not None and hdr.rid == st.k:
                raise self.peer_mismatch(lk.peer, str(st.fp), p.fp)  # an up chunk for the broadcast we run
            # (a later op's frame -- the child is ahead of us -- waits for that op's up thread)
            lk.park = p
            self._progress_at = time.monotonic()
            self._up_cv[lk.tree].notify()
            while not p.done and (self._failure is None or p.taken):
                lk.cv.wait()  # type: ignore[union-attr]
            lk.park = None
        if p.got < plen:  # the op failed: nobody (else) reads the rest
            if p.block_bytes:
                B.drain_frame(lk.fs, plen, p.got, p.block_bytes)
            else:
                lk.fs.discard(plen - p.got)

    def _parked_mismatch(self: NodeEngine, st: OpState, lk: Link, p: Parked) -> None:
        """Raise the mismatch of a parked (threaded) frame met by small op ``st``."""
        want = st.layouts[0].chunk(0)
        self._check_frame(st, lk, p.rid, p.c, p.fp, 0, p.plen, (want[1] - want[0]) * st.isz)
        raise HFReduceError(f"{st.fp} on {self.who(self.node)}: {self.who(lk.peer)} sent a chunk of a large op",
                            node=self.node, peer=lk.peer, tree=lk.tree)

    def _check_no_park(self: NodeEngine, st: OpState) -> None:
        """Under the lock, posting small op ``st``: a child already parked a threaded op's frame."""
        for lk in self._children[0]:
            if lk.park is not None and not lk.park.taken and lk.park.rid == st.k:
                self._parked_mismatch(st, lk, lk.park)

    def _parks_ready(self: NodeEngine, t: int) -> bool:
        """Under the lock: every child of tree ``t`` parked a frame, or one sent a ring frame
        (a small op's: the up step reports the mismatch)."""
        return all((lk.park is not None and not lk.park.taken) or lk.arrived > lk.consumed
                   for lk in self._children[t])

    def _take_parks(self: NodeEngine, st: OpState, t: int, c: int) -> list[Parked | None]:
        """Under the lock: take the children's parked frames of chunk ``c`` (``None``: a ring frame)."""
        parks: list[Parked | None] = []
        for lk in self._children[t]:
            p = lk.park if lk.park is not None and not lk.park.taken else None
            if p is None:  # a small op's frame in the ring: report it as the mismatch it is
                rid, cc, plen, fp, _ = lk.meta[lk.consumed % self._ring]
                self._check_frame(st, lk, rid, cc, fp, c, plen, -1)
            else:
                p.taken = True
            parks.append(p)
        return parks

    def _release(self: NodeEngine, lk: Link, p: Parked, got: int, block_bytes: int = 0) -> None:
        """Give a parked frame back to its reader, ``got`` bytes of it consumed (``block_bytes``:
        it is a streamed frame, see :attr:`Parked.block_bytes`)."""
        with self._mu:
            p.got = got
            p.block_bytes = block_bytes
            p.done = True
            lk.cv.notify_all()  # type: ignore[union-attr]

    def _recv_parked(self: NodeEngine, st: OpState, t: int, parks: Sequence[Parked | None]) -> None:
        """A non-streamed threaded op's up step: the parked payloads into the ring, as a reader would."""
        for lk, p in zip(self._children[t], parks, strict=True):
            if p is None:
                continue
            i = lk.arrived
            slot = lk.slots[i % self._ring]
            got, dt = 0, 0.0
            try:
                if p.plen <= len(slot):
                    t0 = time.perf_counter()
                    lk.fs.recv_into(slot[:p.plen])
                    dt = time.perf_counter() - t0
                    got = p.plen
            except (OSError, FireFlyerError) as e:
                self._release(lk, p, p.plen)  # the socket is gone: nothing to drain
                self._link_failed(lk, e)
                raise _Failed() from None
            self._release(lk, p, got)  # (a payload too long for us is the up step's mismatch)
            with self._mu:
                lk.meta[i % self._ring] = (p.rid, p.c, p.plen, p.fp, dt)
                lk.arrived = i + 1

    # ------------------------------------------------------------------ streamed steps

    def _stream_up_step(self: NodeEngine, st: OpState, t: int, c: int, parks: Sequence[Parked | None]) -> None:
        """Tree ``t``'s half (chunk ``c`` = 0: a streamed op's frames carry the whole half)
        through :func:`._blocks.up_chunk` (see the module docs)."""
        so = st.stream
        assert so is not None
        children, parent = self._children[t], self._parent[t]
        a, b = st.layouts[t].chunk(c)
        nb = (b - a) * st.isz
        plen = st.frame_bytes(a, b)
        buf = self._up_bufs[t]
        buf.reset()
        m = len(children)
        taken = [0] * m
        rc = B.ABORTED
        try:
            for lk, p in zip(children, parks, strict=True):
                assert p is not None
                self._check_frame(st, lk, p.rid, p.c, p.fp, c, p.plen, plen)
            # the frame bytes each reader read past the header (valid until it reads again)
            ahead = [lk.fs.take_buffered(plen) for lk in children]
            taken = [len(v) for v in ahead]
            pre = np.zeros((max(1, m), max(taken, default=0)), dtype=np.uint8)
            for i, v in enumerate(ahead):
                pre[i, :len(v)] = np.frombuffer(v, dtype=np.uint8)
            pre_len = np.array(taken or [0], dtype=np.int64)
            meta = {"c": c, "fp": st.wire_fp} if c == 0 else {"c": c}
            if parent is not None:
                heads = [(parent, Request(rid=st.k, op=UP, meta={**meta, "p": 1}))]
            else:
                heads = [(lk, Request(rid=st.k, op=DOWN, meta=meta)) for lk in children]
            with self._mu:
                if self._failure is not None:
                    raise _Failed()
                st.up_sending[t] = parent is not None
                buf.busy = True
            t0 = time.perf_counter()
            rc = self._locked_loop(heads, plen, lambda: B.up_chunk(
                so.fmt, so.opcode, st.isz, so.own, self._child_fds[t], pre, pre_len, buf.slot_addrs,
                buf.scratch.ctypes.data, B.DISCARD if so.discard else st.work.ctypes.data,
                parent.fs.sock.fileno() if parent is not None else -1,
                so.mirrors if parent is None else _EMPTY, st.avg_divisor if parent is None else 1,
                a, b, so.blk, buf.io, self._abort, buf.times, B.in_place_sub(len(so.own) + m), _UNSYNCED, B.NO_SYNC))
            dt = time.perf_counter() - t0
        finally:
            ended = int(buf.io[B.IO_FAIL_FD]) if rc in (B.PEER_ABORTED, B.BAD_FRAME) else -1
            for i, (lk, p) in enumerate(zip(children, parks, strict=True)):
                if p is not None:  # a frame that ended early (an aborted block) leaves nothing to drain
                    got = p.plen if lk.fs.sock.fileno() == ended else max(int(buf.io[B.IO_GOT + i]), taken[i])
                    self._release(lk, p, got, so.blk * st.isz)
            with self._mu:
                buf.busy = False
        if rc != B.OK:
            self._loop_stopped(rc, buf)
            raise _Failed()
        last = c == st.layouts[t].nchunks - 1
        st.reduce_s += float(buf.times[B.T_REDUCE])
        st.copyout_s += float(buf.times[B.T_COPY])
        for lk in children:
            i = self._links.index(lk)
            st.recv_b[i] += nb
            st.io_s[i] += dt
        for lk, _ in heads:
            i = self._links.index(lk)
            st.sent_b[i] += nb
            st.io_s[i] += dt if parent is not None else 0.0
        now = time.monotonic()
        if last:
            st.up_end[t] = now
        with self._mu:
            st.up_sending[t] = False
            st.up_done[t] = c + 1
            self._progress_at = now
            if parent is None:
                for lk in children:
                    lk.sent = c + 1
        if parent is None:  # final here: the down sends to every child are done too
            if last:
                st.down_end[t] = now
            self._finalize(st, t, c, a, b, extra=len(children))
        if last:
            self._count_down(st)

    def _stream_down(self: NodeEngine, lk: Link, st: OpState, c: int, a: int, b: int, plen: int) -> None:
        """Reader of the parent link: the final half through :func:`._blocks.down_chunk`."""
        so = st.stream
        assert so is not None
        t = lk.tree
        children = self._children[t]
        buf = self._down_bufs[id(lk)]
        buf.reset()
        pre = np.frombuffer(lk.fs.take_buffered(plen), dtype=np.uint8).copy()
        meta = {"c": c, "fp": st.wire_fp} if c == 0 else {"c": c}
        heads = [(ch, Request(rid=st.k, op=DOWN, meta=meta)) for ch in children]
        with self._mu:
            buf.busy = True
        t0 = time.perf_counter()
        rc = B.ABORTED
        try:
            rc = self._locked_loop(heads, plen, lambda: B.down_chunk(
                lk.fs.sock.fileno(), pre, B.DISCARD if so.discard else st.work.ctypes.data, buf.scratch.ctypes.data,
                self._child_fds[t],
                so.mirrors, st.isz, a, b, so.blk, buf.io, self._abort, buf.times, _UNSYNCED, B.NO_SYNC))
        except _Failed:
            pass  # a child link failed before the loop ran: the frame is still ours to drain
        finally:
            with self._mu:
                buf.busy = False
        dt = time.perf_counter() - t0
        if rc != B.OK:
            own = int(buf.io[B.IO_FAIL_FD]) == lk.fs.sock.fileno()
            self._loop_stopped(rc, buf, wait=False)
            if rc == B.FAILED and own or rc == B.BAD_FRAME:
                raise ProtocolError(f"{lk.name()}: the final half broke off", reason="truncated")
            if rc != B.PEER_ABORTED:  # (an aborted block ended the frame: the abort frame is next)
                B.drain_frame(lk.fs, plen, max(int(buf.io[B.IO_GOT]), len(pre)), so.blk * st.isz)
            return
        st.copyout_s += float(buf.times[B.T_COPY])
        i = self._links.index(lk)
        st.recv_b[i] += (b - a) * st.isz
        st.io_s[i] += dt
        for ch in children:
            j = self._links.index(ch)
            st.sent_b[j] += (b - a) * st.isz
        last = c == st.layouts[t].nchunks - 1
        if last:
            st.down_end[t] = time.monotonic()
        with self._mu:
            for ch in children:
                ch.sent = c + 1
        self._finalize(st, t, c, a, b, extra=len(children))

    def _locked_loop(self: NodeEngine, heads: list[tuple[Link, Request]], nbytes: int, loop: object) -> int:
        """Send every head (one frame of ``nbytes`` per link) and run ``loop`` holding the
        links' send locks: the loop sends those frames' payloads."""
        held = []
        try:
            for lk, _ in heads:
                lk.fs.send_lock.acquire()
                held.append(lk)
            for i, (lk, h) in enumerate(heads):
                try:
                    lk.fs.send_head(h, nbytes)
                except (OSError, FireFlyerError) as e:
                    for done, _ in heads[:i]:  # their frames were promised: nothing else may follow
                        done.fs.shutdown()
                    self._link_failed(lk, e)
                    raise _Failed() from None
            return int(loop())  # type: ignore[operator]
        finally:
            for lk in held:
                lk.fs.send_lock.release()

    def _loop_stopped(self: NodeEngine, rc: int, buf: _LoopBuffers, *, wait: bool = True) -> None:
        """A block loop stopped early (every frame it was sending is ended): record why.

        FAILED: a socket call failed, the link is lost.  BAD_FRAME: a peer's blocks lost
        their framing, the link is given up.  PEER_ABORTED: a peer ended its frame with an
        aborted block; its abort frame follows on that link and fails the engine with the
        peer's reason -- if it does not come soon (``wait``; the reader of that link, which
        reads it, does not wait), we fail naming the peer.  ABORTED: our engine failed already.
        """
        if rc == B.ABORTED:
            return
        fd, err = int(buf.io[B.IO_FAIL_FD]), int(buf.io[B.IO_ERRNO])
        lk = self._by_fd.get(fd)
        if lk is None:  # cannot happen: every socket a loop gets is a link's
            self._fail(HFReduceError(f"node {self.node}: a block loop stopped ({rc}) on fd {fd}", node=self.node))
            return
        if rc == B.PEER_ABORTED:
            if not wait:
                return
            deadline = time.monotonic() + self.grace_s
            with self._mu:
                while self._failure is None and time.monotonic() < deadline:
                    self._done_cv.wait(max(0.001, deadline - time.monotonic()))
                if self._failure is not None:
                    return
            self._fail(CollectiveAborted(
                f"node {self.node}: {self.who(lk.peer)} stopped sending its data in tree {lk.tree} and told "
                f"nobody why", node=self.node, origin=lk.peer, reason="aborted mid-op", culprit=lk.peer))
            return
        if rc == B.BAD_FRAME:
            why: Exception = ProtocolError(f"a block from {lk.name()} had a wrong marker", reason="bad_frame")
            lk.fs.shutdown()
        else:
            why = OSError(err, os.strerror(err)) if err else ConnectionError("the peer closed the connection")
        self._link_failed(lk, why)

    def _stream_waits(self: NodeEngine, st: OpState) -> list[tuple[int, int, str, int, str]]:
        """Under the lock, for :meth:`_blame`: whom a running block loop is blocked on."""
        out = []
        loops = [(t, self._up_bufs[t]) for t in (0, 1)]
        loops += [(lk.tree, self._down_bufs[id(lk)]) for lk in self._links if id(lk) in self._down_bufs]
        for t, buf in loops:
            fd = int(buf.io[B.IO_WAIT_FD]) if buf.busy else -1
            lk = self._by_fd.get(fd)
            if lk is None:
                continue
            phase = "up" if (lk.role == CHILD) != bool(buf.io[B.IO_WAIT_SEND]) else "down"
            chunk = st.up_done[t] if buf is self._up_bufs[t] else st.final[t]
            out.append((lk.peer, t, phase, chunk, "send" if buf.io[B.IO_WAIT_SEND] else "recv"))
        return out
