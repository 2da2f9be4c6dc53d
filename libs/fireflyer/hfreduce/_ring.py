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

**Schedule** (:func:`ring_steps`).  The buffer is cut into ``n`` segments
(:func:`segments`), each into ``pieces`` of ``piece_bytes``.  Node ``i`` sends to ``i+1`` and
receives from ``i-1`` over one extra link each (tree index :data:`RING_TREE` in the
handshake).  Reduce-scatter step ``s`` sends segment ``i-s`` and receives segment ``i-s-1``,
which the reader reduces with this node's inputs (own inputs first, in order, then the
received partial); after ``n-1`` steps segment ``i+1`` is final here (divided for ``avg``) and
the allgather passes final segments around, received straight into ``work``.  Each final piece
is copied to the ``mirrors`` and reported to ``on_final`` (a broadcast's write-back) as it lands.  A piece of step
``s > 0`` is sent once the reader has finished the same piece of step ``s-1``: the only
dependency.  Every segment is reduced in one fixed order and finalised on one node, so every
node ends with the same bits, run after run.

An allgather piece is received into a segment whose partial this node sent at an earlier
reduce-scatter step; no extra wait guards it, because the final piece reaches us only along
the ring, through the node we sent that partial to.

**Frames**: ``hfr.r`` (``rid`` the engine's op number; ``meta`` ``{"q": piece index over
the whole op, "fp": fingerprint on q == 0}``), payload the piece.  The first piece leaves on
posting, with no dependency, so the next node compares fingerprints at once: a node that runs
a ring op sees its predecessor's first piece and fails with :class:`FingerprintMismatch` if it
runs anything else (some node running a ring op always has a successor running a different
one, if any does).

**Threads**: one sender (``hfr-ring-send``, like an up thread) and the reader of the link
from the previous node, which receives and reduces.  Deadlines, ``hfr.wait`` / ``hfr.abort``
and the blame rules are the engine's: a stall names the previous node (receiving) or the next
(sending), the phase (``reduce-scatter`` / ``allgather``) and the piece.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fireflyer.core.errors import FireFlyerError
from fireflyer.core.log import get_logger
from fireflyer.hfreduce import kernels
from fireflyer.hfreduce._op import divide_inplace
from fireflyer.hfreduce._pipeline import RING, RING_TREE, _Failed
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
#: bytes per ring frame.  Each piece costs both ends a few tens of microseconds of Python (a
#: frame header, a wake-up, the bookkeeping), so pieces are larger than the streamed block: on
#: the twenty-seventh VM, 4 nodes x 1 rank at 64 MiB took 79-82 ms per op with 2M pieces against
#: 89-97 with 512K (two launches each, alternating), and 5 x 1 113-127 against 136-148; 4M and
#: 8M did no better than 2M
RING_PIECE_BYTES = 2 << 20
_RS, _AG = "reduce-scatter", "allgather"


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


def reduce_piece(out: np.ndarray, srcs: Sequence[np.ndarray], op: str) -> None:
    """``srcs`` reduced left to right into ``out`` (which may be ``srcs[0]``, and no other).

    A sum is numpy's ``add``, one input after the other: the kernels' bits (float32 sums in
    float32, left to right; integers wrap), and on a piece that stays in the cache about twice
    as fast as one kernel call, whose loop is built for many inputs streaming from memory
    (131072 float32 + 131072 in place: 28 us against 60 us on the twenty-seventh VM).  max and
    min take the kernels (their NaN and signed-zero rule), in passes of at most ``MAX_INPUTS``.
    """
    if op == "sum":
        with np.errstate(over="ignore", invalid="ignore"):  # inf and inf - inf are results, as in the kernels
            if len(srcs) == 1:
                np.copyto(out, srcs[0])
            else:
                np.add(srcs[0], srcs[1], out=out)
            for x in srcs[2:]:
                np.add(out, x, out=out)
        return
    cap = kernels.MAX_INPUTS
    kernels.reduce_into(out, list(srcs[:cap]), op, threads=1)
    rest = list(srcs[cap:])
    while rest:
        kernels.reduce_into(out, [out, *rest[:cap - 1]], op, threads=1)
        rest = rest[cap - 1:]


class RingOp:
    """One ring op's plan and progress on this node (counters change under the engine lock).

    Pieces are numbered ``q = step * pieces + p`` in the order both ends handle them: the
    sender sends them in that order, the reader receives them in it.
    """

    __slots__ = ("node", "nodes", "steps", "segs", "per", "pieces", "total", "inputs", "mirrors", "own",
                 "scratch", "recv_done", "sent", "sending")

    def __init__(self, node: int, nodes: int, work: np.ndarray, inputs: Sequence[np.ndarray],
                 mirrors: Sequence[np.ndarray], piece_bytes: int) -> None:
        self.node, self.nodes = node, nodes
        self.steps = ring_steps(node, nodes)
        self.segs = segments(work.size, nodes)
        self.per = max(1, piece_bytes // work.dtype.itemsize)
        longest = max(b - a for a, b in self.segs)
        #: pieces per segment (the same for every segment; a short one's last pieces may be empty)
        self.pieces = max(1, -(-longest // self.per))
        self.total = len(self.steps) * self.pieces
        self.inputs = list(inputs)
        self.mirrors = list(mirrors)
        #: step 0 sends our own partial: made from the inputs first unless ``work`` is the only one
        self.own = not (len(self.inputs) == 1 and self.inputs[0] is work)
        self.scratch = np.empty(min(self.per, longest) or 1, dtype=work.dtype)
        self.recv_done = 0  # pieces the reader finished, in order
        self.sent = 0  # pieces the sender finished, in order
        self.sending = False  # the sender is inside a socket call

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
        """Piece ``q`` received is final once reduced: the last reduce-scatter step."""
        return (self.nodes - 2) * self.pieces <= q < (self.nodes - 1) * self.pieces

    def phase(self, q: int) -> str:
        return _RS if self.reduces(q) else _AG


class Ringing:
    """The ring's sender loop, receive step and blame (mixin; see the module docstring)."""

    def _ring_send_loop(self: NodeEngine, _: object) -> None:
        """Send each ring op's pieces to the next node, op after op."""
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
        lk = self._ring_next
        assert lk is not None
        i = self._links.index(lk)
        isz = st.isz
        for q in range(r.total):
            if q >= r.pieces:  # the same piece of the previous step must be in first
                with self._mu:
                    while self._failure is None and r.recv_done <= q - r.pieces:
                        self._ring_cv.wait()
                    if self._failure is not None:
                        raise _Failed()
            a, b = r.send_range(q)
            if q < r.pieces and r.own and b > a:
                t0 = time.perf_counter()
                reduce_piece(st.work[a:b], [x[a:b] for x in r.inputs], st.redop)
                st.reduce_s += time.perf_counter() - t0
            meta = {"q": q, "fp": st.wire_fp} if q == 0 else {"q": q}
            with self._mu:
                r.sending = True
            try:
                dt = lk.send(Request(rid=st.k, op=RING, meta=meta), st.wbytes[a * isz:b * isz])
            except (OSError, FireFlyerError) as e:
                self._link_failed(lk, e)
                raise _Failed() from None
            st.sent_b[i] += (b - a) * isz
            st.io_s[i] += dt
            with self._mu:
                r.sending = False
                r.sent = q + 1
                self._progress_at = time.monotonic()
        self._count_down(st)

    def _ring_recv(self: NodeEngine, lk: Link, hdr: Request, plen: int) -> None:
        """A piece from the previous node (on its link's reader): reduce it in, or take it as final."""
        with self._mu:  # the previous node may be ahead of our own call: wait for it
            while self._failure is None and (self._op is None or self._op.k < hdr.rid):
                self._post_cv.wait(0.05)
            if self._failure is not None:
                raise self._reraise()
            st = self._op
            assert st is not None
        fp = hdr.meta.get("fp")
        r: RingOp | None = st.ring
        if st.k != hdr.rid or r is None or (hdr.meta.get("q") == 0 and fp != st.wire_fp):
            raise self.peer_mismatch(lk.peer, str(st.fp), fp)
        q = hdr.meta.get("q", -1)
        a, b = r.recv_range(r.recv_done) if r.recv_done < r.total else (0, 0)
        if q != r.recv_done or plen != (b - a) * st.isz:
            raise HFReduceError(
                f"{st.fp} on {self.who(self.node)}: {self.who(lk.peer)} sent ring piece {q} of {plen} bytes, "
                f"expected piece {r.recv_done} of {(b - a) * st.isz} (same block size everywhere?)",
                node=self.node, peer=lk.peer, tree=RING_TREE, chunk=r.recv_done)
        i = self._links.index(lk)
        t0 = time.perf_counter()
        if r.reduces(q):
            got = r.scratch[:b - a]
            if plen:
                lk.fs.recv_into(memoryview(got.view(np.uint8)))
            t1 = time.perf_counter()
            if b > a:
                reduce_piece(st.work[a:b], [*(x[a:b] for x in r.inputs), got], st.redop)
            st.reduce_s += time.perf_counter() - t1
            final = r.finalises(q)
            if final and st.avg_divisor != 1:
                divide_inplace(st.work[a:b], st.avg_divisor)
        else:
            if plen:
                lk.fs.recv_into(st.wbytes[a * st.isz:b * st.isz])
            t1 = time.perf_counter()
            final = True
        st.io_s[i] += t1 - t0
        st.recv_b[i] += plen
        if final and r.mirrors and b > a:
            t2 = time.perf_counter()
            for m in r.mirrors:
                np.copyto(m[a:b], st.work[a:b])
            st.copyout_s += time.perf_counter() - t2
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
        """(peer, tree, phase, piece, how) for a ring op: the previous node we wait to receive from,
        and the next one if our sender is stuck in a send to it (under the lock)."""
        r: RingOp = st.ring
        out: list[tuple[int, int, str, int, str]] = []
        prev, nxt = self._ring_prev, self._ring_next
        if r.recv_done < r.total and prev is not None:
            out.append((prev.peer, RING_TREE, r.phase(r.recv_done), r.recv_done, "recv"))
        if r.sending and nxt is not None:
            out.append((nxt.peer, RING_TREE, r.phase(r.sent), r.sent, "send"))
        return out
