"""Small ops over three or more nodes: up and down tree 0, with the express path's lean code.

Two nodes exchange their partials in one hop (:mod:`.express`).  Beyond two, a small op on the
engine's general path pays for machinery built for large ones -- layouts, ring slots, step
claims, a thread hand-off per frame -- and with more nodes than CPUs that CPU is the op's
latency: on the thirty-seventh VM (2026-11-29, 2 vCPUs) a 4-node, 1-rank 4-byte allreduce took
566 µs and ~950 µs of CPU over all processes, where the two-node express op took 71 µs and
~130 µs.  This path runs the same op on tree 0 alone with only what it needs:

- tree 0's links, rooted at the tree's centre (:meth:`~.trees.Tree.centred`: the double
  binary tree's root has a single child, a level this path need not climb; over four nodes
  the centred tree 0 is a star, one hop up and one down);
- a node waits for the partial of each of its children, reduces them into its own (its own
  first, then the children in node order: the same order every run), and sends the result to
  its parent; the root's result is final (``avg`` divided there, once);
- the final result comes down from the parent, is copied into every child's frame and every
  local rank's buffer.  Every node ends with the root's bits.

**Wire.**  ``hfr.x`` frames (:data:`~.express.XOP`) on tree-0 links, as between two nodes:
``rid`` the communicator's op number, ``meta`` ``{"fp": fingerprint}``, the payload the
partial or the result in the carried dtype.  The link says which: a frame from a child is its
partial, one from the parent the result.  Tree 1 and the ring's links never carry them.

**Order.**  A child can be an op ahead (it finishes op ``k`` on our result, then may start
``k + 1`` before our ranks have), so its frames of ops not started here are parked, at most
:data:`~.express._MAX_PARKED`; the parent's result only ever answers our own partial.

**Failures** as on the two-node path, through the engine: a fingerprint that differs, or a
frame for an op this node runs on the engine, fails it with :class:`FingerprintMismatch`
(flooded to every node); a slow op's watcher (:meth:`~.express.ExpressBase.wait`) blames the
children whose partials are missing, or the parent, naming the phase (``up`` / ``down``).
A node cannot tell a silent parent from one that is itself waiting for a child, so the
deadlines are staggered (:meth:`TreeExpress._stagger_s`): in the up phase deeper nodes time
out first, then the down phase, nearer the root first.  The node next to the fault names it
and its abort reaches the others before their own, vaguer, deadlines (a 3-node test with a
stopped leaf worker caught the leaf that had sent up blaming the root otherwise).  The stagger
stays within :data:`STAGGER_MAX_S`, well inside the client's grace after the deadline.

Why not recursive doubling (two rounds of pairwise exchange over four nodes): its partners are
not all tree neighbours, so it would need links of its own, and over four nodes the centred
tree is as short, one hop up and one down.  (A bare Python prototype over loopback on the
thirty-seventh VM: doubling 48-51 µs per op, the uncentred tree's four hops 73-83 µs.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fireflyer.wire.frame import Request

from ._op import divide_inplace
from .errors import CollectiveTimeout, HFReduceError
from .express import _MAX_PARKED, ExpressBase, ExpressHost, XOp, combine, send_partial
from .types import OpStats, PeerStats

if TYPE_CHECKING:
    from ._links import Link

__all__ = ["TreeExpress"]

_UP, _DOWN = "up", "down"
#: seconds between the deadlines of successive levels ("Failures") ...
STAGGER_STEP_S = 0.2
#: ... and the most any node waits past its deadline (the client gives up 1.5 s after it,
#: of which the engine's slack takes 0.5)
STAGGER_MAX_S = 0.8


class TreeExpress(ExpressBase):
    """The express path of an engine of three or more nodes (see the module docs)."""

    def __init__(self, engine: ExpressHost) -> None:
        """Made by the engine once its links are up, before its readers start."""
        super().__init__(engine)
        #: no link of this path polls after its frames (see :mod:`.express`, "Polling")
        self.link: Link | None = None
        # tree 0's links, rooted at its centre (``Tree.centred``: the same on every node)
        tree = engine.double_tree.trees[0].centred()
        place = tree.nodes[engine.node]
        #: this node's distance from the root, and the tree's depth ("Failures")
        self.level = 0
        up = place.parent
        while up >= 0:
            self.level, up = self.level + 1, tree.nodes[up].parent
        self.depth = tree.depth()
        self._step_s = min(STAGGER_STEP_S, STAGGER_MAX_S / max(1, 2 * self.depth - 1))
        by_peer = {lk.peer: lk for lk in engine.tree_links(0)}
        self.parent: Link | None = by_peer[place.parent] if place.parent >= 0 else None
        #: reduced in this order after our own partial
        self.children: list[Link] = [by_peer[c] for c in place.children]
        self._parked: dict[tuple[int, int], tuple[object, np.ndarray, float]] = {}
        #: the current op's children's partials (peer -> payload) and whether ours went up
        self._got: dict[int, np.ndarray] = {}
        self._up_sent = False

    # -- the op ---------------------------------------------------------------------------------

    def start(self, op: XOp) -> None:
        """Take the children's partials parked for ``op``; send ours up once all are in (the
        caller's thread, or the reader of the last child's link).  Raises the engine's failure."""
        with self._lock:
            got = {peer: self._parked.pop((op.seq, peer)) for peer in self._peers() if (op.seq, peer) in self._parked}
            for peer, (fpw, buf, _) in got.items():
                self._check(op, peer, fpw, buf)
            self._op, self._up_sent = op, False
            self._got = {}
            for peer, (_, buf, took) in got.items():
                self._record(op, peer, recv=buf.nbytes, secs=took)
                self._got[peer] = buf
            ready = self._claim_up(op)
        if ready:
            self._up(op)

    def on_frame(self, lk: Link, hdr: Request, plen: int) -> None:
        """A child's partial or the parent's result (on the link's reader)."""
        seq, fpw = hdr.rid, hdr.meta.get("fp")
        try:
            buf, took = self._read_frame(lk, hdr, plen)
            if lk.tree != 0 or lk not in self._neighbours():
                self._fail(HFReduceError(f"{self.engine.who(lk.peer)} sent an express frame on {lk.name()}, which "
                                         f"carries none (mixed versions?)", node=self.engine.node, peer=lk.peer))
            with self._lock:
                op = self._op
                if lk is self.parent:
                    if op is None or op.seq != seq or not self._up_sent:
                        self._fail(HFReduceError(
                            f"{self.engine.who(lk.peer)} sent the result of express op #{seq}, which "
                            f"{self.engine.who(self.engine.node)} has not sent up", node=self.engine.node,
                            peer=lk.peer, seq=seq))
                    self._check(op, lk.peer, fpw, buf)
                    self._record(op, lk.peer, recv=buf.nbytes, secs=took)
                    ready = False
                elif op is None or op.seq != seq:
                    self._park(seq, lk.peer, fpw, buf, took)
                    return
                else:
                    if lk.peer in self._got:
                        self._fail(HFReduceError(f"{self.engine.who(lk.peer)} sent its partial of express op #{seq} "
                                                 f"twice", node=self.engine.node, peer=lk.peer, seq=seq))
                    self._check(op, lk.peer, fpw, buf)
                    self._record(op, lk.peer, recv=buf.nbytes, secs=took)
                    self._got[lk.peer] = buf
                    ready = self._claim_up(op)
            if lk is self.parent:
                np.copyto(op.ours, buf.view(op.ours.dtype))
                self._down(op)
            elif ready:
                self._up(op)
        except HFReduceError:
            return  # the engine has failed with it (floods it, wakes the op thread)

    def _claim_up(self, op: XOp) -> bool:
        """Under the lock: every child's partial is in and ours has not gone up: claim the send."""
        if self._up_sent or len(self._got) < len(self.children):
            return False
        self._up_sent = True  # (before the send: the parent's answer may come before it returns)
        return True

    def _up(self, op: XOp) -> None:
        """Our partial with the children's, to the parent; at the root, the result goes down."""
        ours = op.ours
        if self.children:
            combine(op, [ours] + [self._got[lk.peer].view(ours.dtype) for lk in self.children])
        if self.parent is None:
            if op.divisor != 1:
                divide_inplace(ours, op.divisor)
            self._down(op)
            return
        # (counted before the send: the parent's answer may finish the op before it returns)
        self._record(op, self.parent.peer, sent=ours.nbytes)
        self._record(op, self.parent.peer, secs=send_partial(self.engine, self.parent, op))

    def _down(self, op: XOp) -> None:
        """``op.ours`` is the result: to every child, then into the local ranks' buffers."""
        for lk in self.children:
            secs = send_partial(self.engine, lk, op)
            self._record(op, lk.peer, sent=op.ours.nbytes, secs=secs)
        op.write_result()
        with self._lock:
            self._got = {}
        self._complete(op)

    # -- bookkeeping ----------------------------------------------------------------------------

    def _neighbours(self) -> list[Link]:
        return self.children + ([self.parent] if self.parent is not None else [])

    def _peers(self) -> list[int]:
        """The nodes whose frames may be parked: the children (the parent only answers us)."""
        return [lk.peer for lk in self.children]

    @staticmethod
    def _record(op: XOp, peer: int, *, sent: int = 0, recv: int = 0, secs: float = 0.0) -> None:
        row = op.links.setdefault(peer, [0, 0, 0.0])
        row[0] += sent
        row[1] += recv
        row[2] += secs

    def _check(self, op: XOp, peer: int, fpw: object, buf: np.ndarray) -> None:
        if fpw != op.fpw or buf.nbytes != op.ours.nbytes:
            self._fail(self.engine.peer_mismatch(peer, str(op.fingerprint()), fpw))

    def _park(self, seq: int, peer: int, fpw: object, buf: np.ndarray, took: float) -> None:
        """Under the lock: keep a child's frame of an op this node has not started (it is ahead)."""
        if seq == self._engine_seq:
            self._fail(self.engine.peer_mismatch(peer, self._engine_fp, fpw))
        if seq <= self._done_seq or (seq, peer) in self._parked or len(self._parked) >= _MAX_PARKED:
            self._fail(HFReduceError(
                f"{self.engine.who(peer)} sent an express frame for op #{seq}, which "
                f"{self.engine.who(self.engine.node)} has {'finished' if seq <= self._done_seq else 'not started'} "
                f"({len(self._parked)} frames parked)", node=self.engine.node, peer=peer, seq=seq))
        self._parked[(seq, peer)] = (fpw, buf, took)

    def _unpark(self, seq: int) -> list[tuple[int, object]]:
        return [(peer, self._parked.pop((seq, peer))[0]) for peer in self._peers() if (seq, peer) in self._parked]

    def _stagger_s(self) -> float:
        """Up phase: ``(depth - 1 - level)`` steps (the deepest waiters first); down phase: after
        every up-phase deadline, ``depth - 1 + level`` steps (nearer the root first)."""
        if not self._up_sent:
            return self._step_s * max(0, self.depth - 1 - self.level)
        return self._step_s * (self.depth - 1 + self.level)

    def _timeout(self, op: XOp, waited: float) -> CollectiveTimeout:
        with self._lock:
            up_sent = self._up_sent
            missing = [lk.peer for lk in self.children if lk.peer not in self._got]
        if not up_sent:
            phase, blamed = _UP, missing
        else:
            phase, blamed = _DOWN, [self.parent.peer] if self.parent is not None else []
        who = ", ".join(self.engine.who(p) for p in blamed)
        return CollectiveTimeout(
            f"{op.fingerprint()} on {self.engine.who(self.engine.node)}: {who} sent nothing for {waited:.1f} s "
            f"in the express op's {phase} phase (tree 0)", node=self.engine.node,
            peer=blamed[0] if blamed else -1, tree=0, phase=phase, chunk=0, seq=op.seq,
            missing=",".join(str(p) for p in blamed), waited_s=round(waited, 3))

    def stats(self, op: XOp) -> OpStats:
        """The op's telemetry (:meth:`XOp.stats`), with the traffic to the parent and each child."""
        return op.stats({p: PeerStats(bytes_sent=int(s), bytes_received=int(r), transfer_s=t)
                         for p, (s, r, t) in op.links.items()})

