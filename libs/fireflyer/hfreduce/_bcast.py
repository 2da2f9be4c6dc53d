"""Large broadcasts: the root's data flooded over both trees, each edge carrying it once.

:class:`Broadcasting` is a mixin of :class:`~fireflyer.hfreduce.engine.NodeEngine` (no state of
its own).  A broadcast that went through the allreduce (an int32 sum of the root's words and
every other node's zeros) moved an allreduce's bytes: each node sent and received about the
whole buffer both ways, zeros up the trees and the result down.  Here tree ``t`` carries half
``t`` (``split_halves``), cut into chunks of ``chunk_bytes``, outward from the node that holds
the root: every edge of the tree is used once, in the direction away from it, whether that is
down (parent to child) or up (child to parent).  Each node receives each half once and sends it
on to its other neighbours of that tree, so the root's node sends the buffer once (a half to
each of its neighbours per tree) and in all the nodes move ``(n - 1)`` buffers instead of
about ``2 (n - 1)``; nothing is reduced.

**Who is the source.**  Only the root's node knows it holds the root (ranks name it as a global
rank, and no node knows another's ranks).  It does not need to be told: in a tree, the data
reaches a node along exactly one edge, so the link that delivers a tree's first chunk is that
tree's source, and the node forwards to every other link of the tree.  A second link that
delivers data means two nodes hold the root: an error, not a race.

**Frames** (``hfr.bc``, ``rid`` the engine's op number, no payload but a chunk's)::

    {"c": -1, "fp": fingerprint}           "I run this broadcast": sent first, on every link of
                                           both trees, by every node
    {"c": chunk, "fp": fingerprint on 0}   payload: the chunk, away from the root
    {"c": -2}                              ack, toward the root: this tree's chunks are all here,
                                           and every node beyond us acknowledged them
    {"c": -3}                              done, away from the root: the root has every node's ack

**Nobody returns before everyone has it.**  A node completes a tree once ``done`` reaches it
(the root: once every link acknowledged), so no rank returns from a broadcast that fails
anywhere -- as no rank returns from a failed allreduce, whose result needs every node.  The
acks also close the fingerprint check: before a node acknowledges, it has heard the
announcement of each neighbour beyond it (sent before that neighbour's ack) and of its source
(sent before the data), so the root's last ack means every edge compared fingerprints both
ways.  A node that runs something else (or another broadcast) meets an announcement at once
and fails with a :class:`FingerprintMismatch` -- even where no data would ever cross: a node
running an allreduce next to one waiting for data that no node is sending.  A reader that
meets a frame of an op it has not posted yet waits for it (the peer is ahead of us), as a ring
frame does.  The cost: two frames of a few bytes per edge and tree, and ``2 x depth`` hops of
latency, against a buffer larger than an inline op.

**Threads.**  The long-lived ones: the reader of each link takes announcements, chunks
(straight into ``work``, then ``on_final``), acks and done; each link's writer sends our
announcement, then every chunk once it is final here -- the down writer for a child link, the
tree's up thread for the parent link -- and then ``done`` (or, on the source's link, stops
sending chunks and sends our ``ack`` once it is due).  Deadlines, ``hfr.wait`` /
``hfr.abort`` and blame are the engine's: a stall names the source (receiving), a neighbour
that never announced or acknowledged, or the link a writer is stuck on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from fireflyer.core.errors import FireFlyerError, InvalidArgument, ProtocolError
from fireflyer.hfreduce._op import OpState
from fireflyer.hfreduce._pipeline import BCAST, RING_TREE, _Failed
from fireflyer.hfreduce.errors import HFReduceError
from fireflyer.hfreduce.types import Fingerprint, OpStats
from fireflyer.wire.frame import Request

if TYPE_CHECKING:
    from fireflyer.hfreduce._links import Link
    from fireflyer.hfreduce.engine import NodeEngine

__all__ = ["BCAST", "BcastOp", "Broadcasting"]

_ANNOUNCE, _ACK, _DONE = -1, -2, -3
_PHASE = "broadcast"


class BcastOp:
    """One broadcast's routing and progress on this node (fields change under the engine lock)."""

    __slots__ = ("root", "links", "src", "heard", "acks", "done")

    def __init__(self, root: bool, links: tuple[list[Link], list[Link]]) -> None:
        #: this node holds the root: every chunk is final from the start
        self.root = root
        #: every link of each tree (the parent's first)
        self.links = links
        #: per tree, the link the data came in on (None until its first chunk; always at the root)
        self.src: list[Link | None] = [None, None]
        #: links whose announcement arrived, and whose ack arrived
        self.heard: set[int] = set()
        self.acks: set[int] = set()
        #: per tree: every node has it (the root: every link acked; elsewhere: done came in)
        self.done = [False, False]

    def ack_due(self, t: int, final: int, nchunks: int, index: list[Link]) -> bool:
        """May we acknowledge tree ``t`` to our source?  All its chunks are here and every other
        link of the tree acknowledged (``index``: the engine's links, whose positions name them)."""
        src = self.src[t]
        return final >= nchunks and all(index.index(lk) in self.acks for lk in self.links[t] if lk is not src)


class Broadcasting:
    """Posting, sending and receiving broadcasts (mixin; see the module docstring)."""

    def broadcast(self: NodeEngine, work: np.ndarray, fp: Fingerprint, *, root: bool,
                  on_final: Callable[[int, int], None] | None = None, deadline_s: float | None = None,
                  on_done: Callable[[OpStats], None] | None = None) -> OpStats:
        """Broadcast ``work`` from the node that holds the root (``root=True``: exactly one node).

        ``work`` (1-D, contiguous, writable, any dtype: the bytes travel as they are) holds the
        data on the root's node and receives it everywhere else; ``on_final(start, stop)``
        reports element ranges as they land (on the root's node: all of it, at once), from
        engine threads.  ``fp`` must be a broadcast's, the same on every node.  Deadlines,
        failures and ``on_done`` as for :meth:`allreduce`.
        """
        if fp.kind != "broadcast":
            raise InvalidArgument(f"broadcast() needs a broadcast's fingerprint, got {fp}")
        self._check_work(work, fp)
        if self.nnodes == 1:
            if not root:
                raise InvalidArgument("one node: it must hold the root")
            return self._one_node(work, fp, on_final, on_done)
        st = self._post_bcast(work, fp, root, on_final, on_done)
        if root and on_final is not None and work.size:  # (while the writers send it)
            try:
                on_final(0, work.size)
            except Exception as e:  # noqa: BLE001 - the caller's callback failed: the op fails
                self._fail(HFReduceError(f"{fp} on node {self.node}: on_final(0, {work.size}) raised {e!r}",
                                         node=self.node, seq=fp.seq))
        return self._wait_complete(st, deadline_s)

    def _post_bcast(self: NodeEngine, work: np.ndarray, fp: Fingerprint, root: bool,
                    on_final: Callable[[int, int], None] | None,
                    on_done: Callable[[OpStats], None] | None) -> OpState:
        st = OpState(self._next_k, fp, work, "sum", 1, on_final, self.chunk_bytes, len(self._links),
                     (len(self._children[0]), len(self._children[1])))
        links = tuple([*([p] if (p := self._parent[t]) is not None else []), *self._children[t]]
                      for t in (0, 1))
        b = BcastOp(root, links)  # type: ignore[arg-type]
        st.bcast = b
        nch = [lay.nchunks for lay in st.layouts]
        if root:
            st.final = list(nch)
        # completion: per tree, each link's announcement heard, its writer done and its ack or done
        # received (the source's done, every other link's ack), and each chunk final here
        st.remaining = sum(3 * len(links[t]) + (0 if root else nch[t]) for t in (0, 1))
        st.on_done = on_done
        with self._mu:
            self._make_current(st)
            failed = self._stale_frame(st)
            for t in (0, 1):
                for lk in self._children[t]:
                    lk.sent = 0
            self._post_cv.notify_all()
        if failed is not None:
            self._fail(failed)
            raise self._reraise(fp)
        return st

    def _stale_frame(self: NodeEngine, st: OpState) -> HFReduceError | None:
        """Under the lock, posting broadcast ``st``: a neighbour already sent a frame of another
        kind of op for this op number (a parked up chunk, or a small op's frame in a ring slot)."""
        for lk in self._links:
            if lk.tree == RING_TREE:
                continue
            p = lk.park
            if p is not None and not p.taken and p.rid == st.k:
                return self.peer_mismatch(lk.peer, str(st.fp), p.fp)
            if lk.slots and lk.arrived > lk.consumed:
                rid, _c, _plen, fp, _dt = lk.meta[lk.consumed % self._ring]
                if rid == st.k:
                    return self.peer_mismatch(lk.peer, str(st.fp), fp)
        return None

    def _bcast_clash(self: NodeEngine, st: OpState | None, lk: Link, hdr: Request) -> bool:
        """A small op's frame, just received into a ring slot, for the broadcast we run: fail with
        the mismatch (here, not by raising: the frame is consumed, the reader must not discard it)."""
        if st is None or st.bcast is None or hdr.rid != st.k:
            return False
        self._fail(self.peer_mismatch(lk.peer, str(st.fp), hdr.meta.get("fp")))
        return True

    def _bcast_send(self: NodeEngine, st: OpState, lk: Link, t: int) -> None:
        """Link ``lk``'s writer for broadcast ``st`` in tree ``t``: our announcement, then every chunk
        as it becomes final here and, once every node has it, ``done`` -- or, if ``lk`` turns out
        to be where the data comes from, our ``ack`` once it is due."""
        b: BcastOp = st.bcast
        self._bcast_frame(lk, Request(rid=st.k, op=BCAST, meta={"c": _ANNOUNCE, "fp": st.wire_fp}))
        up = lk is self._parent[t]
        n = st.layouts[t].nchunks
        for c in range(n):
            with self._mu:
                while self._failure is None and st.final[t] <= c and b.src[t] is not lk:
                    self._down_cv[t].wait()
                if self._failure is not None:
                    raise _Failed()
                if b.src[t] is lk:
                    break
            self._send_chunk(st, lk, BCAST, c)
            with self._mu:
                if up:
                    st.up_done[t] = c + 1
                else:
                    lk.sent = c + 1
                self._progress_at = time.monotonic()
        with self._mu:
            source = b.src[t] is lk
            while self._failure is None and not (
                    b.ack_due(t, st.final[t], n, self._links) if source else b.done[t]):
                self._down_cv[t].wait()
            if self._failure is not None:
                raise _Failed()
        self._bcast_frame(lk, Request(rid=st.k, op=BCAST, meta={"c": _ACK if source else _DONE}))
        self._count_down(st)

    def _bcast_frame(self: NodeEngine, lk: Link, hdr: Request) -> None:
        try:
            lk.send(hdr)
        except (OSError, FireFlyerError) as e:
            self._link_failed(lk, e)
            raise _Failed() from None

    def _recv_bcast(self: NodeEngine, lk: Link, hdr: Request, plen: int) -> None:
        """A broadcast frame from a neighbour (on its link's reader): an announcement, or a chunk
        received straight into ``work``."""
        fp = hdr.meta.get("fp")
        c = hdr.meta.get("c", -2)
        st = self._op_of_frame(lk, hdr.rid, fp)
        b: BcastOp | None = st.bcast
        if st.k != hdr.rid or b is None or (fp is not None and fp != st.wire_fp):
            raise self.peer_mismatch(lk.peer, str(st.fp), fp)
        t = lk.tree
        if c in (_ANNOUNCE, _ACK, _DONE):
            self._bcast_control(st, b, lk, t, c, plen)
            return
        with self._mu:
            src = b.src[t]
            if b.root or (src is not None and src is not lk):
                holder = "we hold the root" if b.root else f"it came from {self.who(src.peer)}"  # type: ignore[union-attr]
                raise HFReduceError(
                    f"{st.fp} on {self.who(self.node)}: {self.who(lk.peer)} sent broadcast data in tree {t}, "
                    f"but {holder} (does more than one node hold the root's rank?)",
                    node=self.node, peer=lk.peer, tree=t, phase=_PHASE)
            if src is None:
                b.src[t] = lk
                self._down_cv[t].notify_all()  # (the writer of this link stops)
        lay = st.layouts[t]
        want = st.final[t]
        a, z = lay.chunk(want) if want < lay.nchunks else (0, 0)
        if c != want or want >= lay.nchunks or plen != (z - a) * st.isz:
            raise HFReduceError(f"{st.fp} on {self.who(self.node)}: {lk.name()} sent broadcast chunk {c} of "
                                f"{plen} bytes, expected chunk {want} of {(z - a) * st.isz}",
                                node=self.node, peer=lk.peer, tree=t, chunk=want, phase=_PHASE)
        self._recv_final(st, lk, c, a, z, plen)
        self._finalize(st, t, c, a, z)

    def _bcast_control(self: NodeEngine, st: OpState, b: BcastOp, lk: Link, t: int, c: int, plen: int) -> None:
        """An announcement, ack or done from ``lk`` (tree ``t``), checked against what we expect."""
        i = self._links.index(lk)
        with self._mu:
            src = b.src[t]
            if plen or (c == _ACK and (lk is src or i in b.acks or i not in b.heard)) or \
                    (c == _DONE and (src is None or lk is not src or b.done[t])) or (c == _ANNOUNCE and i in b.heard):
                raise ProtocolError(f"{lk.name()}: broadcast frame {c} out of turn (tree {t})", reason="bad_frame")
            if c == _ANNOUNCE:
                b.heard.add(i)
            elif c == _ACK:
                b.acks.add(i)
                if b.root and all(self._links.index(x) in b.acks for x in b.links[t]):
                    b.done[t] = True
            else:
                b.done[t] = True
            self._progress_at = time.monotonic()
            self._down_cv[t].notify_all()
        self._count_down(st)

    def _bcast_blame(self: NodeEngine, st: OpState) -> list[tuple[int, int, str, int, str]]:
        """(peer, tree, phase, chunk, how) that broadcast ``st`` waits on (under the lock): a neighbour
        that never announced; the source of a tree's chunks (or, before the first, every neighbour
        that may be it); a link a writer is stuck sending to; a neighbour whose ack, or a source
        whose done, is missing."""
        b: BcastOp = st.bcast
        out: list[tuple[int, int, str, int, str]] = []
        for t in (0, 1):
            links, src, n = b.links[t], b.src[t], st.layouts[t].nchunks
            out += [(lk.peer, t, f"{_PHASE} start", -1, "recv") for lk in links
                    if self._links.index(lk) not in b.heard]
            if not b.root and st.final[t] < n:
                out += [(lk.peer, t, _PHASE, st.final[t], "recv") for lk in ([src] if src is not None else links)]
            for lk in links:
                sent = st.up_done[t] if lk is self._parent[t] else lk.sent
                if lk is not src and sent < st.final[t]:
                    out.append((lk.peer, t, _PHASE, sent, "send"))
            if not out and st.final[t] >= n:
                out += [(lk.peer, t, f"{_PHASE} ack", -1, "recv") for lk in links
                        if lk is not src and self._links.index(lk) not in b.acks]
                if src is not None and not b.done[t]:
                    out.append((src.peer, t, f"{_PHASE} done", -1, "recv"))
        return out
