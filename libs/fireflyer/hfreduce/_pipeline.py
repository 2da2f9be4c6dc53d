"""The data path of the node engine: per-chunk steps and the long-lived threads that run them.

:class:`Pipeline` is a mixin of :class:`~fireflyer.hfreduce.engine.NodeEngine`; it
holds no state of its own (the attributes it uses are created by the engine).
Steps, each for one chunk ``c`` of tree ``t`` of the current op:

- :meth:`_up_step` -- the children's chunk ``c`` (already in ring slots) is reduced
  into ``work`` in a fixed order (own first, then ``children`` in tree order; with the
  caller's ``fuse``, our own partial is made in the same pass), then sent to the
  parent or, at the root, divided for ``avg`` and finalised;
- :meth:`_down_step` -- a final chunk is sent to one child;
- :meth:`_recv_up` / :meth:`_recv_down` -- the readers' halves (ring slot, or
  straight into ``work`` followed by ``on_final``).

Large ops run the steps on dedicated threads (one up thread per tree, one down
writer per child link) so both trees and both directions stream at once.  Ops
that fit in one chunk per tree (``inline``) run each step on whichever thread
completes its inputs: the caller (on posting: leaves send at once) or the reader
that received the last child chunk (reduce, send up / down) or the final chunk
(forward to the children).  That saves the hand-offs to the up and down threads,
which are most of the latency of a small allreduce.

With two nodes a small op is an *exchange* (:meth:`_exchange_post`): the child sends
its partial up as usual, the root sends its own partial down (``hfr.xchg``) at the
same time, and each reduces the two in the same order (root's first), so both get
the same bits after one hop instead of two.  The child receives the root's partial
into a ring on its parent link, like up chunks, since it may arrive before the
child's own call.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from fireflyer.core.errors import FireFlyerError, ProtocolError
from fireflyer.core.log import get_logger
from fireflyer.hfreduce import kernels
from fireflyer.hfreduce._links import CHILD, PARENT, Link
from fireflyer.hfreduce._op import OpState, divide_inplace, fp_from_wire
from fireflyer.hfreduce.errors import FingerprintMismatch, HFReduceError
from fireflyer.hfreduce.express import XOP
from fireflyer.wire.frame import Request

if TYPE_CHECKING:
    from fireflyer.hfreduce.engine import NodeEngine

__all__ = ["Pipeline", "UP", "DOWN", "WAIT", "ABORT", "XCHG", "BCAST", "RING", "RING_TREE"]

_log = get_logger("fireflyer.hfreduce.engine")

UP, DOWN, WAIT, ABORT, XCHG = "hfr.up", "hfr.down", "hfr.wait", "hfr.abort", "hfr.xchg"
#: a large broadcast's frames: announcement, chunk, ack, done (:mod:`._bcast`)
BCAST = "hfr.bc"
#: a ring op's piece (:mod:`._ring`), and the tree index of the ring's links
RING = "hfr.r"
RING_TREE = 2


class _Failed(Exception):
    """A step found the engine failed (the failure is already recorded)."""


class _StepFailures:
    """:meth:`Pipeline._step_failures` (a class, not a generator: it wraps every small op's step)."""

    __slots__ = ("engine",)

    def __init__(self, engine: NodeEngine) -> None:
        self.engine = engine

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: object) -> bool:
        if e is None or isinstance(e, _Failed):
            return True
        if isinstance(e, HFReduceError):
            self.engine._fail(e)
            return True
        return False


class Pipeline:
    """Chunk steps and thread loops (mixin; see the module docstring)."""

    # ------------------------------------------------------------------ steps

    def _up_step(self: NodeEngine, st: OpState, t: int, c: int) -> None:
        """Reduce the children's chunk ``c`` (arrived) into ours; send it up or finalise it."""
        children = self._children[t]
        parent = self._parent[t]
        ring = self._ring
        lay = st.layouts[t]
        a, b = lay.chunk(c)
        with self._mu:
            metas = [lk.meta[lk.consumed % ring] for lk in children]
        if children:
            inputs = [st.work[a:b]]
            for lk, (rid, cc, plen, fp, dt) in zip(children, metas, strict=True):
                self._check_frame(st, lk, rid, cc, fp, c, plen, (b - a) * st.isz)
                i = self._links.index(lk)
                st.recv_b[i] += plen
                st.io_s[i] += dt
                inputs.append(np.frombuffer(lk.slots[lk.consumed % ring], dtype=st.work.dtype, count=b - a))
            if b > a:
                if st.fused[t]:
                    self._fuse_chunk(st, t, a, b, inputs[1:])
                else:
                    kernels.reduce_into(inputs[0], inputs, st.redop, threads=1)
            with self._mu:
                for lk in children:
                    lk.consumed += 1
                    lk.cv.notify()  # type: ignore[union-attr]
        last = c == lay.nchunks - 1
        if parent is None:
            if st.avg_divisor != 1:
                divide_inplace(st.work[a:b], st.avg_divisor)
            if last:
                st.up_end[t] = time.monotonic()
            with self._mu:
                st.up_done[t] = c + 1
            self._finalize(st, t, c, a, b)
        else:
            meta = {"c": c, "fp": st.wire_fp} if c == 0 else {"c": c}
            if not st.inline:
                meta["p"] = 1  # the parent's reader parks it for its up thread (_streamed)
            x, y = st.nbytes(a, b)
            with self._mu:
                st.up_sending[t] = True
            try:
                dt = parent.send(Request(rid=st.k, op=UP, meta=meta), st.wbytes[x:y])
            except (OSError, FireFlyerError) as e:
                self._link_failed(parent, e)
                raise _Failed() from None
            i = self._links.index(parent)
            st.sent_b[i] += y - x
            st.io_s[i] += dt
            if last:
                st.up_end[t] = time.monotonic()
            with self._mu:
                st.up_sending[t] = False
                st.up_done[t] = c + 1
                self._progress_at = time.monotonic()
        if last:
            self._count_down(st)

    def _fuse_chunk(self: NodeEngine, st: OpState, t: int, a: int, b: int, children: list[np.ndarray]) -> None:
        """Our partial and the children's chunk in one pass: the caller's ``fuse``."""
        assert st.fuse is not None
        try:
            st.fuse(a, b, children)
        except Exception as e:  # noqa: BLE001 - the caller's callback failed: the op fails
            self._fail(HFReduceError(f"{st.fp} on node {self.node}: fuse({a}, {b}) raised {e!r}",
                                     node=self.node, seq=st.fp.seq, tree=t))
            raise _Failed() from None

    def _down_step(self: NodeEngine, st: OpState, lk: Link, c: int) -> None:
        """Send final chunk ``c`` of ``lk``'s tree to child ``lk``."""
        self._send_chunk(st, lk, DOWN, c)
        with self._mu:
            lk.sent = c + 1
            self._progress_at = time.monotonic()
        self._count_down(st)

    def _send_chunk(self: NodeEngine, st: OpState, lk: Link, op: str, c: int) -> None:
        """Send chunk ``c`` of ``lk``'s tree from ``work`` to child ``lk`` as an ``op`` frame."""
        x, y = st.nbytes(*st.layouts[lk.tree].chunk(c))
        meta = {"c": c, "fp": st.wire_fp} if c == 0 else {"c": c}
        try:
            dt = lk.send(Request(rid=st.k, op=op, meta=meta), st.wbytes[x:y])
        except (OSError, FireFlyerError) as e:
            self._link_failed(lk, e)
            raise _Failed() from None
        i = self._links.index(lk)
        st.sent_b[i] += y - x
        st.io_s[i] += dt

    # ------------------------------------------------------------------ two-node exchange

    def _exchange_post(self: NodeEngine, st: OpState) -> None:
        """Start a small two-node op on the calling thread (see the module docstring)."""
        if self._parent[0] is None:
            # the root: our partial goes to the child before the up step reduces over it
            self._send_chunk(st, self._children[0][0], XCHG, 0)
            with self._mu:
                st.xsent = True
                mine = self._claim_up(st, 0)
            if mine:  # the child's partial is here already: reduce and finalise it now
                self._up_step(st, 0, 0)
            return
        with self._mu:
            mine = self._claim_up(st, 0)
        if mine:
            self._up_step(st, 0, 0)  # our partial to the root
        with self._mu:
            mine = self._claim_xchg(st)
        if mine:
            self._xchg_step(st)

    def _claim_xchg(self: NodeEngine, st: OpState) -> bool:
        """Under the lock: may this thread reduce the root's partial (child of an exchange) now?

        Only once our own partial is sent (the step overwrites it) and the root's has arrived.
        """
        parent = self._parent[0]
        if not st.exchange or st.xclaimed or self._op is not st or parent is None:
            return False
        if st.up_done[0] < 1 or parent.arrived <= parent.consumed:
            return False
        st.xclaimed = True
        return True

    def _xchg_step(self: NodeEngine, st: OpState) -> None:
        """Child of an exchange: final = reduce(root's partial, ours), in the root's order."""
        parent = self._parent[0]
        assert parent is not None
        a, b = st.layouts[0].chunk(0)
        with self._mu:
            rid, cc, plen, fp, dt = parent.meta[parent.consumed % self._ring]
        self._check_frame(st, parent, rid, cc, fp, 0, plen, (b - a) * st.isz)
        i = self._links.index(parent)
        st.recv_b[i] += plen
        st.io_s[i] += dt
        if b > a:
            theirs = np.frombuffer(parent.slots[parent.consumed % self._ring], dtype=st.work.dtype, count=b - a)
            ours = st.work[a:b]  # (one view as input and output: the kernels see the alias without
            kernels.reduce_into(ours, [theirs, ours], st.redop, threads=1)  # comparing addresses, ~2 us)
        with self._mu:
            parent.consumed += 1
            parent.cv.notify()  # type: ignore[union-attr]
        if st.avg_divisor != 1:
            divide_inplace(st.work[a:b], st.avg_divisor)
        st.down_end[0] = time.monotonic()
        self._finalize(st, 0, 0, a, b)

    def _check_frame(self: NodeEngine, st: OpState, lk: Link, rid: int, c: int, fp: object, want_c: int,
                     plen: int, want_len: int) -> None:
        if want_c == 0 and fp != st.wire_fp or rid != st.k:
            raise self.peer_mismatch(lk.peer, str(st.fp), fp)
        if c != want_c or plen != want_len:
            raise HFReduceError(
                f"{st.fp} on {self.who(self.node)}: {self.who(lk.peer)} sent chunk {c} of {plen} bytes in "
                f"tree {lk.tree}, expected chunk {want_c} of {want_len} bytes (same chunk_bytes everywhere?)",
                node=self.node, peer=lk.peer, tree=lk.tree, chunk=want_c)

    def peer_mismatch(self: NodeEngine, peer: int, ours: str, theirs: object) -> FingerprintMismatch:
        """We run ``ours`` (shown) but ``peer``'s frame carries fingerprint ``theirs`` (as it travels)."""
        shown = fp_from_wire(theirs)
        return FingerprintMismatch(
            f"collective mismatch on {self.who(self.node)}: we run {ours} but {self.who(peer)} runs {shown} "
            f"(every node must issue the same collectives in the same order)",
            node=self.node, peer=peer, ours=ours, theirs=shown)

    def _finalize(self: NodeEngine, st: OpState, t: int, c: int, a: int, b: int, extra: int = 0) -> None:
        """Chunk ``c`` of tree ``t`` is final here (``extra``: and that many down sends of it are done)."""
        with self._mu:
            st.final[t] = c + 1
            self._progress_at = time.monotonic()
            self._down_cv[t].notify_all()
        if st.on_final is not None and b > a:
            try:
                st.on_final(a, b)
            except Exception as e:  # noqa: BLE001 - the caller's callback failed: the op fails
                self._fail(HFReduceError(f"{st.fp} on node {self.node}: on_final({a}, {b}) raised {e!r}",
                                         node=self.node, seq=st.fp.seq))
        self._count_down(st, 1 + extra)

    def _count_down(self: NodeEngine, st: OpState, steps: int = 1) -> None:
        with self._mu:
            st.remaining -= steps
            last = st.remaining == 0
        if last:
            self._complete(st)

    def _complete(self: NodeEngine, st: OpState) -> None:
        """This thread ran op ``st``'s last step: report it (``on_done``), then wake the caller.

        ``on_done`` runs here rather than on the caller's thread after it wakes: for a small
        op that wake-up is a large share of the latency, and the caller's ranks can be
        released without it.
        """
        result = st.stats([lk.peer for lk in self._links])
        with self._mu:
            st.result = result
            if self._op is st:
                self._in_op = False  # (before on_done, which may post the next op: NodeEngine.post)
            self._done_cv.notify_all()  # NodeEngine.wait: the steps are done (on_done may take a while)
        if st.on_done is not None:
            try:
                st.on_done(st.result)
            except Exception:  # noqa: BLE001 - the result is final; the caller's report must not fail it
                _log.exception("hfreduce on_done callback failed", node=self.node, seq=st.fp.seq)
        with self._mu:
            st.complete = True
            self._done_cv.notify()

    # ------------------------------------------------------------------ threads

    def _wait_op(self: NodeEngine, last: int) -> OpState | None:
        """The next threaded op after op ``last`` (inline ops are the caller's), or None when failed."""
        with self._mu:
            while self._failure is None and (self._op is None or self._op.k <= last or self._op.inline):
                self._post_cv.wait()
            return self._op if self._failure is None else None

    def _up_loop(self: NodeEngine, t: int) -> None:
        """Tree ``t``'s up stream, chunk after chunk, op after op.

        The children's chunks wait parked on their sockets (``_streamed``): a streamed op
        reads them in its block loop, any other op into the ring first."""
        last = -1
        try:
            while (st := self._wait_op(last)) is not None:
                if st.bcast is not None:  # a broadcast: this thread is the parent link's writer
                    if (parent := self._parent[t]) is not None:
                        self._bcast_send(st, parent, t)
                    last = st.k
                    continue
                for c in range(0 if st.ring is not None else st.layouts[t].nchunks):  # (a ring op: none)
                    with self._mu:
                        while self._failure is None and (st.filled[t] <= c or not self._parks_ready(t)):
                            self._up_cv[t].wait()
                        if self._failure is not None:
                            return
                        parks = self._take_parks(st, t, c)
                    if st.stream is not None:
                        self._stream_up_step(st, t, c, parks)
                    else:
                        self._recv_parked(st, t, parks)
                        self._up_step(st, t, c)
                last = st.k
        except _Failed:
            return
        except HFReduceError as e:
            self._fail(e)
        except Exception as e:  # noqa: BLE001 - a bug must fail the op, not hang it
            _log.exception("hfreduce up thread crashed", node=self.node, tree=t)
            self._fail(HFReduceError(f"node {self.node}: internal error in tree {t} up thread: {e!r}",
                                     node=self.node, tree=t))

    def _fill_loop(self: NodeEngine, _: object) -> None:
        """Produce our partial of each op (the caller's ``fill``) ahead of the up threads.

        Chunks alternate between the trees (0 of tree 0, 0 of tree 1, 1 of tree 0, ...) so
        both up streams start after one chunk of local work; each up thread waits for
        ``filled`` as it waits for its children.  Ops without ``fill`` are skipped.
        """
        last = -1
        try:
            while (st := self._wait_op(last)) is not None:
                last = st.k
                if st.fill is None:
                    continue  # the caller's buffer holds the partial already
                lays = st.layouts
                for c in range(max(lay.nchunks for lay in lays)):
                    for t in (0, 1):
                        if c < lays[t].nchunks and not st.fused[t]:  # (a fused tree's up step fills)
                            self._fill_chunk(st, t, c)
        except _Failed:
            return
        except Exception as e:  # noqa: BLE001 - a bug must fail the op, not hang it
            _log.exception("hfreduce fill thread crashed", node=self.node)
            self._fail(HFReduceError(f"node {self.node}: internal error in the fill thread: {e!r}",
                                     node=self.node))

    def _fill_chunk(self: NodeEngine, st: OpState, t: int, c: int) -> None:
        a, b = st.layouts[t].chunk(c)
        if st.fill is not None and b > a:
            try:
                st.fill(a, b)
            except Exception as e:  # noqa: BLE001 - the caller's callback failed: the op fails
                self._fail(HFReduceError(f"{st.fp} on node {self.node}: fill({a}, {b}) raised {e!r}",
                                         node=self.node, seq=st.fp.seq, tree=t))
                raise _Failed() from None
        with self._mu:
            if self._failure is not None:
                raise _Failed()
            st.filled[t] = c + 1
            if st.fill is not None:
                self._progress_at = time.monotonic()
            self._up_cv[t].notify()

    def _down_loop(self: NodeEngine, lk: Link) -> None:
        """Send each final chunk of tree ``lk.tree`` to child ``lk.peer`` as soon as it is final."""
        t = lk.tree
        last = -1
        try:
            while (st := self._wait_op(last)) is not None:
                with self._mu:
                    lk.sent = 0
                if st.bcast is not None:
                    self._bcast_send(st, lk, t)
                    last = st.k
                    continue
                if st.stream is not None or st.ring is not None:  # its block loops (or the ring) send the
                    last = st.k  # final chunks themselves
                    continue
                for c in range(st.layouts[t].nchunks):
                    with self._mu:
                        while self._failure is None and st.final[t] <= c:
                            self._down_cv[t].wait()
                        if self._failure is not None:
                            return
                    self._down_step(st, lk, c)
                last = st.k
        except _Failed:
            return

    def _claim_up(self: NodeEngine, st: OpState, t: int) -> bool:
        """Under the lock: may this thread run inline op ``st``'s up step of tree ``t`` now?

        True exactly once per tree: for the first thread that sees the op posted
        and every child's chunk arrived (the caller on posting, a reader on arrival).
        """
        if not st.inline or st.claimed[t] or self._op is not st or not st.layouts[t].nchunks:
            return False
        if st.exchange and self._parent[t] is None and not st.xsent:
            return False  # the root's partial is not on its way to the child yet
        if any(lk.arrived <= lk.consumed for lk in self._children[t]):
            return False
        st.claimed[t] = True
        return True

    def _inline_up(self: NodeEngine, st: OpState, t: int) -> None:
        """Run a claimed inline up step (and, at the root, the down sends) on this thread."""
        with self._step_failures():
            self._up_step(st, t, 0)
            if self._parent[t] is None and not st.exchange:
                for lk in self._children[t]:
                    self._down_step(st, lk, 0)

    def _step_failures(self: NodeEngine) -> _StepFailures:
        """Around an inline step on a reader: its failure fails the engine here (its frame is
        consumed, so the reader must not discard those bytes again); ``_Failed`` is recorded already."""
        return _StepFailures(self)

    # ------------------------------------------------------------------ readers

    def _read_loop(self: NodeEngine, lk: Link) -> None:
        """Receive every frame of one link, in order, for as long as it lives."""
        fs = lk.fs
        # the express link: after a small op's frame, poll for the next one before sleeping
        # (express.py, "Polling"); 0 when this is not that link or polling is off
        poll_s = self.express_poll_s if self.express is not None and lk is self.express.link else 0.0
        polls = False
        try:
            while True:
                if polls:
                    fs.poll_for(poll_s)
                hdr, plen = fs.read_header()
                polls = poll_s > 0 and hdr.op == XOP
                if not isinstance(hdr, Request):
                    raise ProtocolError(f"unexpected {type(hdr).__name__} frame", reason="bad_frame")
                if hdr.op == ABORT:
                    self._on_abort(lk, hdr)
                    fs.discard(plen)
                    continue
                if hdr.op == XOP:  # (its rid is a communicator op number, not ours: seen_op stays)
                    express = self.express
                    if express is not None and self._failure is None:
                        express.on_frame(lk, hdr, plen)
                        continue
                    fs.discard(plen)
                    if express is None:
                        self._fail(HFReduceError(f"{self.who(lk.peer)} sent an express frame, but "
                                                 f"{self.who(self.node)} has no express path (mixed versions?)",
                                                 node=self.node, peer=lk.peer))
                    continue
                with self._mu:
                    lk.seen_op = max(lk.seen_op, hdr.rid)
                    failed = self._failure is not None
                if failed or hdr.op == WAIT:
                    fs.discard(plen)  # after a failure: drain, so the peers' writers never block
                    continue
                try:
                    if lk.tree == RING_TREE:  # the ring's links carry its pieces, from the previous node only
                        if hdr.op != RING or lk is not self._ring_prev:
                            raise ProtocolError(f"{hdr.op} frame on the ring link with {lk.name()}", reason="bad_frame")
                        self._ring_recv(lk, hdr, plen)
                    elif hdr.op == BCAST:
                        self._recv_bcast(lk, hdr, plen)
                    elif hdr.op == UP and lk.role == CHILD and hdr.meta.get("p"):
                        self._park(lk, hdr, plen)
                    elif hdr.op == UP and lk.role == CHILD:
                        self._recv_up(lk, hdr, plen)
                    elif hdr.op == XCHG and lk.role == PARENT and lk.slots:
                        self._recv_xchg(lk, hdr, plen)
                    elif hdr.op == DOWN and lk.role == PARENT:
                        self._recv_down(lk, hdr, plen)
                    else:
                        raise ProtocolError(f"{hdr.op} frame from our {lk.role}", reason="bad_frame")
                except HFReduceError as e:
                    self._fail(e)
                    fs.discard(plen)
        except (OSError, FireFlyerError) as e:
            self._link_failed(lk, e)
        except Exception as e:  # noqa: BLE001
            _log.exception("hfreduce reader crashed", node=self.node, peer=lk.peer, tree=lk.tree)
            self._fail(HFReduceError(f"node {self.node}: internal error reading from {lk.name()}: {e!r}",
                                     node=self.node, peer=lk.peer))

    def _recv_up(self: NodeEngine, lk: Link, hdr: Request, plen: int) -> None:
        """An up chunk from a child: into the next ring slot (waiting while the ring is full).

        Needs no op: the ring is a stream over all ops, so a child that is ahead of
        us (or a peer of a node that never calls) is received without waiting.
        """
        st = self._recv_slot(lk, hdr, plen)
        if self._bcast_clash(st, lk, hdr):
            return
        with self._mu:
            claimed = st is not None and self._claim_up(st, lk.tree)
            if not claimed:
                self._up_cv[lk.tree].notify()
        if claimed:
            assert st is not None
            self._inline_up(st, lk.tree)  # small op: reduce and send on, no hand-off to another thread

    def _recv_xchg(self: NodeEngine, lk: Link, hdr: Request, plen: int) -> None:
        """The root's partial of a two-node exchange: into the parent link's ring, reduced here if we may."""
        st = self._recv_slot(lk, hdr, plen)
        if self._bcast_clash(st, lk, hdr):
            return
        with self._mu:
            claimed = st is not None and self._claim_xchg(st)
        if claimed:
            assert st is not None
            with self._step_failures():
                self._xchg_step(st)

    def _recv_slot(self: NodeEngine, lk: Link, hdr: Request, plen: int) -> OpState | None:
        """Receive a frame into ``lk``'s next ring slot (waiting while the ring is full); the current op."""
        with self._mu:
            i = lk.arrived
            while self._failure is None and i - lk.consumed >= self._ring:
                lk.cv.wait()  # type: ignore[union-attr]
            if self._failure is not None:
                raise self._reraise()
        slot = lk.slots[i % self._ring]
        dt = 0.0
        if plen <= len(slot):
            t0 = time.perf_counter()
            lk.fs.recv_into(slot[:plen])
            dt = time.perf_counter() - t0
        else:  # cannot be ours; the up step reports the mismatch
            lk.fs.discard(plen)
        meta = hdr.meta
        with self._mu:
            lk.meta[i % self._ring] = (hdr.rid, meta.get("c", -1), plen, meta.get("fp"), dt)
            lk.arrived = i + 1
            self._progress_at = time.monotonic()
            return self._op

    def _op_of_frame(self: NodeEngine, lk: Link, rid: int, fp: object) -> OpState:
        """The op a frame of engine op ``rid`` from ``lk`` belongs to, once this node has posted it.

        A broadcast's or a ring op's first frame can come before our own call (the peer is
        ahead of us): wait for it.  While we wait, this reader reads nothing else from ``lk``
        (an abort behind the frame included; between two nodes a broadcast's announcements hold
        up the readers of both their links), so a node that runs this op number on its express
        path instead says so here: such a first frame carries the fingerprint, which names the
        communicator's op number (``fp[1]``)."""
        seq = fp[1] if isinstance(fp, list) and len(fp) > 1 else None
        while True:
            with self._mu:
                if self._failure is not None:
                    raise self._reraise()
                st = self._op
                if st is not None and st.k >= rid:
                    return st
                self._post_cv.wait(0.05)
            mine = self.express.running_fingerprint(seq) if self.express is not None and seq is not None else None
            if mine is not None:
                raise self.peer_mismatch(lk.peer, mine, fp)

    def _recv_final(self: NodeEngine, st: OpState, lk: Link, c: int, a: int, b: int, plen: int) -> None:
        """Receive final chunk ``c`` (elements ``[a, b)`` of ``lk``'s tree) straight into ``work``."""
        x, y = st.nbytes(a, b)
        t0 = time.perf_counter()
        lk.fs.recv_into(st.wbytes[x:y])
        i = self._links.index(lk)
        st.io_s[i] += time.perf_counter() - t0
        st.recv_b[i] += plen
        if c == st.layouts[lk.tree].nchunks - 1:
            st.down_end[lk.tree] = time.monotonic()

    def _recv_down(self: NodeEngine, lk: Link, hdr: Request, plen: int) -> None:
        """A final chunk from the parent: straight into ``work``, then ``on_final`` and the children."""
        st = self._op
        t = lk.tree
        c = hdr.meta.get("c", -1)
        if st is None or st.k != hdr.rid:
            raise ProtocolError(f"{lk.name()} sent a final chunk of op {hdr.rid} which we are not running",
                                reason="bad_frame")
        if c == 0 and hdr.meta.get("fp") != st.wire_fp:
            raise self.peer_mismatch(lk.peer, str(st.fp), hdr.meta.get("fp"))
        lay = st.layouts[t]
        a, b = lay.chunk(st.final[t])
        if c != st.final[t] or plen != st.frame_bytes(a, b):
            raise HFReduceError(f"{st.fp} on {self.who(self.node)}: {lk.name()} sent final chunk {c} of "
                                f"{plen} bytes, expected chunk {st.final[t]} of {st.frame_bytes(a, b)}",
                                node=self.node, peer=lk.peer, tree=t, chunk=st.final[t])
        if st.stream is not None:
            self._stream_down(lk, st, c, a, b, plen)
            return
        self._recv_final(st, lk, c, a, b, plen)
        if st.inline:  # forward first (the children wait for it), then report
            try:
                for child in self._children[t]:
                    self._down_step(st, child, 0)
            except _Failed:
                return
        self._finalize(st, t, c, a, b)
