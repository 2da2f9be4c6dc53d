"""Ring ops: a large allreduce over three or more nodes as a ring reduce-scatter, then allgather.

:class:`Ringing` is a mixin of :class:`~fireflyer.hfreduce.engine.NodeEngine` (no state of its
own), used when the engine runs with ``algorithm="ring"``.  The double binary tree moves the
same bytes in all (each node sends and receives ``2(n-1)/n`` of the buffer on average), but in
``4(n-1)`` concurrent flows, half of them between the same pairs as the other tree's; the ring
moves them in ``n`` flows, one per node.  Where the nodes share one host's loopback and a
handful of CPUs, fewer flows carry more: on the twenty-seventh VM (2026-11-27) four ring flows
carried 1.42x what the two trees' twelve did (``ff bench flows``), and a bare ring allreduce
reached 84-88% of the loopback bound where the double tree reached 59-60% (README).  Between
real hosts the trees' ``log n`` depth wins on latency; the ring is a choice per deployment, not
a replacement.

**Which ops.**  Those that would stream (:meth:`~._streamed.Streaming.can_stream`: float32,
int32, int64, without the caller's ``fill``/``fuse``) and are larger than ``inline_bytes``, on
three or more nodes without zones (a ring crosses a zone boundary twice; the zone-aware trees
once).  Every other op takes the trees.  The choice depends only on what the fingerprint
fixes and on settings that every node must share (the links refuse to connect otherwise), so
all nodes make the same one.

**Schedule** (:func:`ring_steps`).  The buffer is cut into ``n`` segments (:func:`segments`).
Node ``i`` sends to ``i+1`` and receives from ``i-1`` over one extra link each (tree index
:data:`RING_TREE` in the handshake).  Reduce-scatter step ``s`` sends segment ``i-s`` and
receives segment ``i-s-1``, which is reduced with this node's inputs (own inputs first, in
order, then the received partial); after ``n-1`` steps segment ``i+1`` is final here (divided
for ``avg``) and the allgather passes final segments around, received straight into ``work``
(and the ``mirrors``; each final segment is reported to ``on_final``, a broadcast's write-back,
as it lands).  Step ``s > 0`` is sent once the reader has finished step ``s-1``: the only
dependency.  Every segment is reduced in one fixed order and finalised on one node, so every
node ends with the same bits, run after run.

**Frames and loops.**  Each segment travels in frames of :data:`RING_PIECE_BYTES` (whole
blocks; by default a segment of a 64 MiB op over four nodes is one frame): ``hfr.r``, ``rid``
the engine's op number, ``meta`` ``{"q": frame index over the whole op, "fp": fingerprint on
q == 0}``, the payload in the streamed ops' blocks (:mod:`._blocks`: ``block_bytes`` of data,
then a marker).  A frame is one block-loop call on each end, with the GIL released and no
Python per block: the sender's ``up_chunk`` with no children (step 0 reduces the inputs block
by block into its scratch block, later steps send ``work`` as it is), the reader's
``up_chunk`` with ``parent=LAND`` (a reduce-scatter frame: received blocks reduced with the
inputs into ``work``; the last step's also divided for ``avg`` and written to the mirrors) or
``down_chunk`` with no children (an allgather frame).  A loop that stops early ends its frame
with an aborted block, so that the next node reads the abort frame behind it
(:meth:`~._streamed.Streaming._loop_stopped`).  Python runs once per frame.

**Blocks, not frames, wait.**  What the sender sends at step ``s > 0`` is what the reader
received at step ``s - 1``, block for block.  The reader's loops count the blocks they finish
in a shared word (:func:`~._blocks.new_sync`, ``PUBLISH``); the sender starts a frame once the
reader has started the same frame of the previous step, and its loop sends block ``j`` once
that frame's block ``j`` is in (``after``: the blocks counted before that frame), sleeping on
the word (a futex) in between.  So every step overlaps the previous one by all but a block,
as in a ring pipelined in blocks, with no Python and no thread hand-off per block.  On the
twenty-ninth VM (2026-11-27, 4 nodes x 1 rank, 64 MiB, launches alternating with the frame-gated
ring before it): through the workers 80.0 against 84.4 ms and 87.2 against 98.2 ms per op (medians
of four and six rounds; faster in 6 of the 10); engines alone slower in one set of three rounds
(72-74 ms against 67-72) and faster in 3 rounds of 4 in another, with less CPU per op and node in
3 of those 4; a bare ring took 62-69 ms.  A small gain at best, within the VM's noise.

Why so few, so long frames (twenty-eighth VM, 2026-11-27, 4 nodes x 1 rank, 64 MiB; the numbers
in :data:`RING_PIECE_BYTES`): a node's two threads share one GIL, and whatever Python one runs
holds up the other's next socket call -- 100 us of Python per 2 MiB frame on a bare ring
made its ops 18% slower -- and each frame also costs a hand-off between the threads.

An allgather step is received into a segment whose partial this node sent at an earlier
reduce-scatter step; no extra wait guards it, because the final segment reaches us only along
the ring, through the node we sent that partial to.  The first frame leaves on posting, with
no dependency, so the next node compares fingerprints at once: a node that runs a ring op
sees its predecessor's first frame and fails with :class:`FingerprintMismatch` if it runs
anything else (some node running a ring op always has a successor running a different one,
if any does).

**Threads**: one sender (``hfr-ring-send``, like an up thread) and the reader of the link
from the previous node.  Deadlines, ``hfr.wait`` / ``hfr.abort`` and the blame rules are the
engine's (moving blocks count as progress): a stall names the previous node (receiving) or
the next (sending), the phase (``reduce-scatter`` / ``allgather``) and the frame.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fireflyer.core.errors import ProtocolError
from fireflyer.core.log import get_logger
from fireflyer.hfreduce import _blocks as B
from fireflyer.hfreduce._pipeline import RING, RING_TREE, _Failed
from fireflyer.hfreduce._streamed import StreamOp
from fireflyer.hfreduce.errors import HFReduceError
from fireflyer.wire.frame import Request

if TYPE_CHECKING:
    from fireflyer.hfreduce._links import Link
    from fireflyer.hfreduce._op import OpState
    from fireflyer.hfreduce.engine import NodeEngine

__all__ = ["RING", "RING_TREE", "ALGORITHMS", "RING_PIECE_BYTES", "RingOp", "Ringing", "ring_steps", "segments"]

_log = get_logger("fireflyer.hfreduce.engine")

#: the engine's ``algorithm`` values: large streamed ops on the trees, or around a ring
ALGORITHMS = ("tree", "ring")
#: bytes per ring frame (rounded down to whole blocks, at least one).  The steps overlap block by
#: block whatever the frame (the sender's loop waits for each block, not for a frame), so a frame
#: only costs: Python and a hand-off on both ends, and the GIL between them.  Measured before the
#: block gate, when a frame of step ``s`` waited for the whole frame of step ``s - 1``, on the
#: twenty-eighth VM (4 x 1, 64 MiB, so 16 MiB segments; engines alone, four rounds alternating
#: with a bare ring at 117 ms): 1M frames took 173 ms, 4M 142, 16M 128; through the workers (six
#: alternating rounds) 16M frames took 122 ms, 8M 129, and the ring before the block loops (2M
#: frames, numpy in Python) 134
RING_PIECE_BYTES = 16 << 20
_RS, _AG = "reduce-scatter", "allgather"
_NONE = np.zeros(0, dtype=np.int64)
_NO_PRE, _NO_PRE_LEN = np.zeros((1, 0), dtype=np.uint8), np.zeros(1, dtype=np.int64)


def ring_steps(node: int, nodes: int) -> list[tuple[int, int, bool]]:
    """``(segment sent, segment received, reduce)`` for each of the ``2(n-1)`` steps of ``node``.

    Reduce-scatter step ``s`` sends segment ``node - s`` and receives ``node - s - 1`` (added to
    the node's own); after ``n - 1`` steps segment ``node + 1`` is final here.  Allgather step
    ``s`` sends segment ``node + 1 - s`` and receives ``node - s`` into place.  What a node sends
    at step ``s > 0`` is what it received at step ``s - 1``: the pipeline's only dependency.
    """
    rs = [((node - s) % nodes, (node - s - 1) % nodes, True) for s in range(nodes - 1)]
    ag = [((node + 1 - s) % nodes, (node - s) % nodes, False) for s in range(nodes - 1)]
    return rs + ag


def segments(count: int, nodes: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each node's segment: ``count`` elements cut as evenly as possible."""
    return [(i * count // nodes, (i + 1) * count // nodes) for i in range(nodes)]


class RingOp:
    """One ring op's plan and progress on this node (counters change under the engine lock).

    Each segment is cut into ``pieces`` frames of ``per`` elements (the last ones of a short
    segment may be empty); frames are numbered ``q = step * pieces + p`` in the order both ends
    handle them: the sender sends them in that order, the reader receives them in it.
    """

    __slots__ = ("node", "nodes", "steps", "segs", "per", "pieces", "total", "so", "work_only", "recv_done",
                 "recv_begun", "landed_before", "sync", "sent", "sending")

    def __init__(self, node: int, nodes: int, work: np.ndarray, inputs: Sequence[np.ndarray],
                 mirrors: Sequence[np.ndarray], redop: str, block_bytes: int, piece_bytes: int) -> None:
        self.node, self.nodes = node, nodes
        self.steps = ring_steps(node, nodes)
        self.segs = segments(work.size, nodes)
        #: the inputs, mirrors and block as the loops take them
        self.so = StreamOp(work, inputs, mirrors, redop, block_bytes)
        # a frame is a whole number of blocks (only a segment's last frame has a short last block)
        self.per = max(1, piece_bytes // work.dtype.itemsize // self.so.blk) * self.so.blk
        longest = max(b - a for a, b in self.segs)
        self.pieces = max(1, -(-longest // self.per))
        self.total = len(self.steps) * self.pieces
        #: step 0 sends our own partial, made from the inputs (``so.own``) block by block (just
        #: ``work``'s bytes when it is the only input); later steps send ``work`` as it is
        self.work_only = np.array([work.ctypes.data], dtype=np.int64)
        #: blocks of the frames received before frame ``q`` (the reader's loops count the blocks
        #: they finish in ``sync``, over the whole op; the sender's block ``j`` of frame ``q``
        #: waits for block ``j`` of received frame ``q - pieces``)
        self.landed_before = [0]
        for q in range(self.total):
            a, b = self.recv_range(q)
            self.landed_before.append(self.landed_before[-1] + -(-(b - a) // self.so.blk))
        self.sync = B.new_sync()
        self.recv_begun = 0  # frames whose loop the reader started
        self.recv_done = 0  # frames the reader finished, in order
        self.sent = 0  # frames the sender finished, in order
        self.sending = False  # the sender is inside a frame's loop

    def _range(self, seg: int, p: int) -> tuple[int, int]:
        a0, b0 = self.segs[seg]
        a = min(b0, a0 + p * self.per)
        return a, min(b0, a + self.per)

    def send_range(self, q: int) -> tuple[int, int]:
        s, p = divmod(q, self.pieces)
        return self._range(self.steps[s][0], p)

    def recv_range(self, q: int) -> tuple[int, int]:
        s, p = divmod(q, self.pieces)
        return self._range(self.steps[s][1], p)

    def reduces(self, q: int) -> bool:
        return q < (self.nodes - 1) * self.pieces

    def finalises(self, q: int) -> bool:
        """Frame ``q`` received is final once reduced: the last reduce-scatter step."""
        return (self.nodes - 2) * self.pieces <= q < (self.nodes - 1) * self.pieces

    def phase(self, q: int) -> str:
        return _RS if self.reduces(q) else _AG

    def frame_bytes(self, a: int, b: int, isz: int) -> int:
        return B.framed_bytes(b - a, self.so.blk, isz)


class Ringing:
    """The ring's sender loop, receive step and blame (mixin; see the module docstring)."""

    def _ring_send_loop(self: NodeEngine, _: object) -> None:
        """Send each ring op's frames to the next node, op after op."""
        last = -1
        try:
            while (st := self._wait_op(last)) is not None:
                last = st.k
                if st.ring is not None:
                    self._ring_send_op(st)
        except _Failed:
            return
        except HFReduceError as e:
            self._fail(e)
        except Exception as e:  # noqa: BLE001 - a bug must fail the op, not hang it
            _log.exception("hfreduce ring sender crashed", node=self.node)
            self._fail(HFReduceError(f"node {self.node}: internal error in the ring sender: {e!r}", node=self.node))

    def _ring_send_op(self: NodeEngine, st: OpState) -> None:
        r: RingOp = st.ring
        so = r.so
        lk = self._ring_next
        assert lk is not None
        i = self._links.index(lk)
        buf = self._ring_bufs[0]
        fd = lk.fs.sock.fileno()
        for s in range(r.total):
            # the same frame of the previous step must be coming in: the loop then sends each
            # block once the reader's loop has that block (``after``), not the whole frame
            with self._mu:
                while self._failure is None and r.recv_begun <= s - r.pieces:
                    self._ring_cv.wait()
                if self._failure is not None:
                    raise _Failed()
                r.sending = buf.busy = True
            a, b = r.send_range(s)
            own, after = (so.own, B.NO_SYNC) if s < r.pieces else (r.work_only, r.landed_before[s - r.pieces])
            head = Request(rid=st.k, op=RING, meta={"q": s, "fp": st.wire_fp} if s == 0 else {"q": s})
            buf.reset()
            t0 = time.perf_counter()
            rc = B.ABORTED
            try:
                rc = self._locked_loop([(lk, head)], r.frame_bytes(a, b, st.isz), functools.partial(
                    B.up_chunk, so.fmt, so.opcode, st.isz, own, _NONE, _NO_PRE, _NO_PRE_LEN, _NONE,
                    buf.scratch.ctypes.data, st.work.ctypes.data, fd, _NONE, 1, a, b, so.blk, buf.io, self._abort,
                    buf.times, B.in_place_sub(len(own)), r.sync, after))
            finally:
                with self._mu:
                    r.sending = buf.busy = False
            if rc != B.OK:
                self._loop_stopped(rc, buf)
                raise _Failed()
            st.sent_b[i] += (b - a) * st.isz
            st.io_s[i] += time.perf_counter() - t0
            st.reduce_s += float(buf.times[B.T_REDUCE])
            with self._mu:
                r.sent = s + 1
                self._progress_at = time.monotonic()
        self._count_down(st)

    def _ring_recv(self: NodeEngine, lk: Link, hdr: Request, plen: int) -> None:
        """A frame from the previous node (on its link's reader): reduced in, or taken as final."""
        fp = hdr.meta.get("fp")
        st = self._op_of_frame(lk, hdr.rid, fp)  # (the previous node may be ahead of our own call)
        r: RingOp | None = st.ring
        if st.k != hdr.rid or r is None or (hdr.meta.get("q") == 0 and fp != st.wire_fp):
            raise self.peer_mismatch(lk.peer, str(st.fp), fp)
        q = hdr.meta.get("q", -1)
        a, b = r.recv_range(r.recv_done) if r.recv_done < r.total else (0, 0)
        want = r.frame_bytes(a, b, st.isz)
        if q != r.recv_done or plen != want:
            raise HFReduceError(
                f"{st.fp} on {self.who(self.node)}: {self.who(lk.peer)} sent ring frame {q} of {plen} bytes, "
                f"expected frame {r.recv_done} of {want} (same block size everywhere?)",
                node=self.node, peer=lk.peer, tree=RING_TREE, chunk=r.recv_done)
        so, buf, fd = r.so, self._ring_bufs[1], lk.fs.sock.fileno()
        final = not r.reduces(q) or r.finalises(q)
        buf.reset()
        pre = np.frombuffer(lk.fs.take_buffered(plen), dtype=np.uint8).copy()
        with self._mu:
            buf.busy = True
            r.recv_begun = q + 1
            self._ring_cv.notify_all()
        t0 = time.perf_counter()
        rc = B.ABORTED
        try:
            if r.reduces(q):
                rc = B.up_chunk(so.fmt, so.opcode, st.isz, so.own, np.array([fd], dtype=np.int64),
                                pre.reshape(1, -1), np.array([len(pre)], dtype=np.int64), buf.slot_addrs,
                                buf.scratch.ctypes.data, st.work.ctypes.data, B.LAND,
                                so.mirrors if final else _NONE, st.avg_divisor if final else 1, a, b, so.blk,
                                buf.io, self._abort, buf.times, B.in_place_sub(len(so.own) + 1), r.sync, B.PUBLISH)
            else:
                rc = B.down_chunk(fd, pre, st.work.ctypes.data, buf.scratch.ctypes.data, _NONE, so.mirrors,
                                  st.isz, a, b, so.blk, buf.io, self._abort, buf.times, r.sync, B.PUBLISH)
        finally:
            with self._mu:
                buf.busy = False
        if rc != B.OK:
            broken = rc == B.BAD_FRAME or (rc == B.FAILED and int(buf.io[B.IO_FAIL_FD]) == fd)
            self._loop_stopped(rc, buf, wait=False)
            if broken:
                raise ProtocolError(f"{lk.name()}: ring frame {q} broke off", reason="truncated")
            if rc != B.PEER_ABORTED:  # (an aborted block ended the frame: the abort frame is next)
                B.drain_frame(lk.fs, plen, max(int(buf.io[B.IO_GOT]), len(pre)), so.blk * st.isz)
            return
        i = self._links.index(lk)
        st.io_s[i] += time.perf_counter() - t0
        st.recv_b[i] += (b - a) * st.isz
        st.reduce_s += float(buf.times[B.T_REDUCE])
        st.copyout_s += float(buf.times[B.T_COPY])
        if final and st.on_final is not None and b > a:  # (the worker's write-back, e.g. a broadcast's)
            try:
                st.on_final(a, b)
            except Exception as e:  # noqa: BLE001 - the caller's callback failed: the op fails
                self._fail(HFReduceError(f"{st.fp} on node {self.node}: on_final({a}, {b}) raised {e!r}",
                                         node=self.node, seq=st.fp.seq))
        now = time.monotonic()
        with self._mu:
            r.recv_done = q + 1
            self._progress_at = now
            self._ring_cv.notify_all()
        if q == (r.nodes - 1) * r.pieces - 1:  # telemetry: the reduce-scatter as tree 0's up phase
            st.up_end[0] = now
        if q == r.total - 1:  # and the allgather as its down phase
            st.down_end[0] = now
            self._count_down(st)

    def _ring_blame(self: NodeEngine, st: OpState) -> list[tuple[int, int, str, int, str]]:
        """(peer, tree, phase, frame, how) for a ring op: the previous node we wait to receive from,
        and the next one if our sender's loop is blocked sending to it (under the lock; a loop
        that waits for its reader's blocks waits for the previous node too)."""
        r: RingOp = st.ring
        out: list[tuple[int, int, str, int, str]] = []
        prev, nxt = self._ring_prev, self._ring_next
        if r.recv_done < r.total and prev is not None:
            out.append((prev.peer, RING_TREE, r.phase(r.recv_done), r.recv_done, "recv"))
        sender = self._ring_bufs[0].io
        if (r.sending and nxt is not None and int(sender[B.IO_WAIT_FD]) == nxt.fs.sock.fileno()
                and sender[B.IO_WAIT_SEND]):
            out.append((nxt.peer, RING_TREE, r.phase(r.sent), r.sent, "send"))
        return out
