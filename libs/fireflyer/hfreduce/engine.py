"""The inter-node part of HFReduce: a pipelined, full-duplex double-binary-tree allreduce.

One :class:`NodeEngine` runs in each node's HFReduce worker.  The worker reduces
its local ranks' buffers into one partial, calls :meth:`NodeEngine.allreduce`
with it, and gets the global result in the same buffer; ``on_final(start, stop)``
reports element ranges as they become final so the worker can copy results back
to its ranks while the rest is still in flight.  With ``fill(start, stop)`` the
worker instead hands over an unfilled buffer and the engine asks for the local
partial chunk by chunk (on its fill thread, ahead of the up threads): the local
reduce is then pipelined with the trees instead of preceding them.  With
``algorithm="ring"`` large streamed ops on three or more nodes go around a ring instead
(:mod:`._ring`: one more link to each ring neighbour, its own sender thread and frames);
everything below describes the trees, and the failure rules hold for both.

**Trees and data split.**  ``zone_aware_double_tree(zones)`` (or the plain
``double_binary_tree``): tree ``t`` carries half ``t`` of the buffer
(``split_halves``), cut into chunks of ``chunk_bytes`` -- except for *streamed*
ops (float32 / int32 / int64, see :mod:`._streamed`), whose half is one chunk that
numba loops move in cache-sized blocks.  Each node reduces its own
chunk with its children's, in a fixed order (own first, then children as the
tree lists them), and sends it up; the root's result is broadcast down and every
node ends with the root's bits.  ``avg`` is a ``sum`` up the tree; the root
divides each final chunk by ``avg_divisor`` (default: the node count; the worker
passes the world size) before sending it down, so all nodes get identical bits.

**Frames** (``fireflyer.wire`` ``req`` frames, one-way; ``rid`` is the engine's op
number, starting at 0 and the same on all nodes; ``meta`` as listed)::

    hfr.up     child -> parent   {"c": chunk, "fp": fingerprint on chunk 0, "p": 1 unless inline}
                                 payload: partial chunk
    hfr.down   parent -> child   {"c": chunk, "fp": fingerprint on chunk 0}  payload: final chunk
    hfr.wait   any direction     {}   "I have started op rid" (sent only once an op is slow)
    hfr.abort  any direction     {"origin", "reason", "culprit", "error"}   flooded once
    hfr.xchg   root -> child     two nodes, a small op that is not an express one: the root's partial
    hfr.bc     away from / toward a large broadcast's root: its announcement, chunks, ack and done
                                 (:mod:`._bcast`: the root's bytes flooded over both trees)
    hfr.x      either way        an express op: a small allreduce, reduce or broadcast, or a barrier
                                 (two nodes: :mod:`.express`; more, on tree 0: :mod:`.express_tree`;
                                 ``rid`` is the communicator's op number, not ours)

A streamed op's payloads are its blocks, each followed by an 8-byte marker (``_blocks``).

**Threads** (all long-lived, started by :meth:`start`; none per op):

- one *reader* per link: child links receive small ops' up chunks into a ring of
  ``ring`` preallocated slots (``recv_into``; TCP back-pressure when the ring is
  full) and park threaded ops' up chunks for the up thread (:mod:`._streamed`),
  parent links receive final chunks straight into ``work``, call ``on_final`` and
  wake the down writers (a streamed op's: forward them and write the mirrors
  themselves, block by block); readers also take ``hfr.abort`` and ``hfr.wait`` at
  any time, and after a failure they drain and discard;
- one *up* thread per tree: takes chunk ``c`` from every child, reduces with
  ``kernels.reduce_into(threads=1)`` into ``work`` and sends it to the parent (or,
  at the root, finalises it); a streamed op's half goes through one block loop;
- one *down writer* per child link: sends each chunk once it is final;
- one *fill* thread: runs the caller's ``fill`` (the local reduce) chunk by chunk,
  alternating trees, ahead of the up threads (which wait for it as for their
  children); ops without ``fill`` skip it (their chunks are ready from the start),
  and so do the trees whose up step makes our partial with the caller's ``fuse``.

So the two trees, and the up and down streams of each, run concurrently, and a
link carries data in both directions at once.  The calling thread only posts the
op and waits; it enforces the deadlines and decides whom to blame.

**Failures.**  Every wait for a peer is bounded by ``min(op deadline, last
progress + timeout_s)``.  On expiry the caller names the peer it waits for (tree,
phase, chunk).  To blame the right node, a node whose op is slow tells its
neighbours it has started (``hfr.wait``); a node waiting on a peer that has started
holds off for a grace period, since that peer is itself waiting on the real
culprit and its neighbour will abort first.  Any failure (timeout, EOF =
:class:`PeerLost`, fingerprint mismatch) sends ``hfr.abort`` on every link; a node
receiving one fails with :class:`CollectiveAborted` naming the origin and culprit
and forwards it once.  The engine is then dead: every later call raises.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fireflyer.core.errors import DeadlineExceeded, InvalidArgument, Unavailable
from fireflyer.core.log import get_logger
from fireflyer.core.threadname import set_os_thread_name
from fireflyer.hfreduce import kernels
from fireflyer.hfreduce._bcast import Broadcasting
from fireflyer.hfreduce._blocks import BLOCK_BYTES
from fireflyer.hfreduce._links import CHILD, PARENT, Acceptor, Link, dial, parse_address
from fireflyer.hfreduce._op import Fuse, OpState, divide_inplace
from fireflyer.hfreduce._pipeline import ABORT, WAIT, Pipeline, _Failed
from fireflyer.hfreduce._ring import ALGORITHMS, RING_PIECE_BYTES, RING_TREE, Ringing, RingOp
from fireflyer.hfreduce._streamed import Streaming, StreamOp, check_buffers
from fireflyer.hfreduce.errors import (
    CollectiveAborted,
    CollectiveTimeout,
    FingerprintMismatch,
    HFReduceError,
    PeerLost,
)
from fireflyer.hfreduce.express import EXPRESS_BYTES, EXPRESS_POLL_S, Express, ExpressBase
from fireflyer.hfreduce.express_tree import TreeExpress
from fireflyer.hfreduce.trees import TreeNode, double_binary_tree, zone_aware_double_tree
from fireflyer.hfreduce.types import Fingerprint, OpStats
from fireflyer.wire.conn import FramedSocket, congestion_of
from fireflyer.wire.frame import FrameLimits, Request

__all__ = ["NodeEngine"]

_log = get_logger("fireflyer.hfreduce.engine")

_JOIN_S = 2.0
#: how long a failed send waits for the link's reader to read why the peer closed
#: (:meth:`NodeEngine._reader_explains`); a reader that is scheduled at all reads a queued
#: abort frame in microseconds, this is headroom for a loaded host
EXPLAIN_S = 1.0
#: how long ``close`` waits for the peers to acknowledge what we sent (:meth:`NodeEngine._linger`)
LINGER_S = 1.0


class NodeEngine(Pipeline, Streaming, Ringing, Broadcasting):
    """The inter-node allreduce of one node (see the module docstring for the protocol).

    ``addresses[i]`` is node ``i``'s engine listener (``host:port``); ``zones[i]``
    its zone (``None``: one zone).  ``listen`` is an already bound socket for our
    own address (tests bind port 0 first); the engine takes it over and closes it
    after :meth:`start`.  ``chunk_bytes`` must be equal on all nodes (checked at
    connect).  ``sock_buf_bytes`` fixes SO_SNDBUF/SO_RCVBUF (``None``: kernel
    auto-tuning); without it ``send_buf_bytes`` fixes SO_SNDBUF alone (``None``: auto-tuning;
    see ``WorkerSettings.send_buf_size`` for when to fix it).  ``tcp_congestion``: congestion controls to try
    on the links, in order (:func:`fireflyer.wire.conn.set_congestion`; empty: the system
    default).  ``block_bytes``: the block of a streamed
    op's loops (:mod:`._blocks`); ``streaming=False`` runs every op the threaded way
    (for comparisons).  ``express_poll_s``: how long a two-node engine's express link
    polls for the next small op's frame before its reader sleeps (0: never polls).
    ``algorithm``: ``"tree"`` (the default) or ``"ring"``: large streamed ops on three or more
    nodes without zones go around a ring instead of the trees (:mod:`._ring`), in frames of
    ``ring_piece_bytes`` (whole blocks); every node must choose the same (checked at connect).
    """

    def __init__(self, *, node_rank: int, addresses: Sequence[str], zones: Sequence[str] | None = None,
                 token: str = "", chunk_bytes: int = 4 << 20, timeout_s: float = 60.0,
                 listen: socket.socket | None = None, sock_buf_bytes: int | None = None,
                 ring: int = 3, grace_s: float = 1.0, inline_bytes: int = 64 << 10,
                 block_bytes: int = BLOCK_BYTES, streaming: bool = True,
                 tcp_congestion: Sequence[str] = (), send_buf_bytes: int | None = None,
                 express_poll_s: float = EXPRESS_POLL_S, algorithm: str = "tree",
                 ring_piece_bytes: int = RING_PIECE_BYTES) -> None:
        n = len(addresses)
        if ring_piece_bytes < 64:
            raise InvalidArgument("need ring_piece_bytes >= 64", ring_piece_bytes=ring_piece_bytes)
        if algorithm not in ALGORITHMS:
            raise InvalidArgument(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}",
                                  argument="algorithm")
        if not 0 <= node_rank < n:
            raise InvalidArgument(f"node_rank {node_rank} not in 0..{n - 1}", node=node_rank, nnodes=n)
        if zones is not None and len(zones) != n:
            raise InvalidArgument("zones must name one zone per node", expected=n, got=len(zones))
        if chunk_bytes < 64 or timeout_s <= 0 or ring < 2 or block_bytes < 64 or express_poll_s < 0:
            raise InvalidArgument("need chunk_bytes >= 64, timeout_s > 0, ring >= 2, block_bytes >= 64, "
                                  "express_poll_s >= 0", chunk_bytes=chunk_bytes, timeout_s=timeout_s, ring=ring,
                                  block_bytes=block_bytes, express_poll_s=express_poll_s)
        for a in addresses:
            parse_address(a)
        self.node = node_rank
        self.addresses = list(addresses)
        self.nnodes = n
        self.token = token
        self.chunk_bytes = chunk_bytes
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        #: ops up to this size go on tree 0 in one chunk, without the pipeline threads
        self.inline_bytes = min(inline_bytes, chunk_bytes)
        #: two nodes: a small op is one exchange (each node sends its partial to the other and
        #: both reduce them in the same order), one hop instead of up then down
        self.exchange = n == 2
        #: how long the express link's reader polls for the next small op's frame before it
        #: sleeps (:mod:`.express`, "Polling"); a node's own choice, the peers need not agree
        self.express_poll_s = express_poll_s
        # (the express path's limit too: two nodes that would choose differently refuse to connect)
        #: large streamed ops go around a ring (:mod:`._ring`): asked for, three nodes or more, one zone
        self.ring_on = algorithm == "ring" and n >= 3 and len(set(zones or [None])) == 1
        self.algorithm = "ring" if self.ring_on else "tree"
        self.ring_piece_bytes = ring_piece_bytes
        self._layout_key = (f"{chunk_bytes}-{self.inline_bytes}{f'-x-e{EXPRESS_BYTES}' if self.exchange else ''}"
                            f"{f'-s{block_bytes}' if streaming else ''}{f'-ring{ring_piece_bytes}' if self.ring_on else ''}")
        self._ring = ring
        self._sock_buf = sock_buf_bytes
        self._send_buf = send_buf_bytes
        self._congestion = tuple(tcp_congestion)
        self.block_bytes = block_bytes
        self.streaming = streaming
        #: nonzero once the engine failed: the block loops stop at their next block
        self._abort = np.zeros(1, dtype=np.int64)
        self._listen = listen
        if zones and n > 1:
            dt, _order = zone_aware_double_tree(list(zones))
        else:
            dt = double_binary_tree(n)
        #: both trees, every node's place (the express path re-roots tree 0: :mod:`.express_tree`)
        self.double_tree = dt
        #: this node's place in tree 0 and tree 1
        self.tree_nodes: tuple[TreeNode, TreeNode] = dt.for_rank(node_rank)
        self.roots = dt.roots()
        self._mu = threading.Lock()
        self._post_cv = threading.Condition(self._mu)
        self._done_cv = threading.Condition(self._mu)
        self._up_cv = (threading.Condition(self._mu), threading.Condition(self._mu))
        self._down_cv = (threading.Condition(self._mu), threading.Condition(self._mu))
        #: the ring sender waits here for the reader's pieces (:mod:`._ring`)
        self._ring_cv = threading.Condition(self._mu)
        self._ring_next: Link | None = None
        self._ring_prev: Link | None = None
        self._ring_bufs: tuple[Any, ...] = ()  # the ring's loop buffers (``_streamed``), once connected
        self._parent: list[Link | None] = [None, None]
        self._children: list[list[Link]] = [[], []]
        self._links: list[Link] = []
        self._threads: list[threading.Thread] = []
        self._op: OpState | None = None
        self._next_k = 0
        self._failure: HFReduceError | None = None
        #: called (no arguments, no lock held) once the engine failed: a posted op may have nobody
        #: waiting for it (:meth:`post`), so its owner needs telling
        self.on_failure: Callable[[], None] | None = None
        #: the express path of small ops (two nodes: :mod:`.express`; more:
        #: :mod:`.express_tree`), made by :meth:`start` before the readers, which hand it its
        #: ``hfr.x`` frames
        self.express: ExpressBase | None = None
        #: (origin, fields) of a remote FingerprintMismatch that arrived between ops
        self._abort_mismatch: tuple[int, dict[str, object]] | None = None
        self._closing = False
        self._started = False
        self._in_op = False
        self._progress_at = time.monotonic()

    # ------------------------------------------------------------------ set-up

    def who(self, node: int) -> str:
        return f"node {node} ({self.addresses[node]})"

    def link_congestion(self) -> dict[str, str | None]:
        """Each link's TCP congestion control as the kernel reports it (``"t<tree>-n<peer>"`` keys;
        None for a link whose socket is closed already)."""
        out: dict[str, str | None] = {}
        for lk in self._links:
            try:
                out[f"t{lk.tree}-n{lk.peer}"] = congestion_of(lk.fs.sock)
            except OSError:
                out[f"t{lk.tree}-n{lk.peer}"] = None
        return out

    def congestion_summary(self) -> list[str]:
        """The distinct congestion controls of the links, sorted (``"?"``: unknown or closed)."""
        return sorted({c or "?" for c in self.link_congestion().values()})

    def send_buffers(self) -> list[int]:
        """The distinct SO_SNDBUF sizes of the open links as the kernel reports them (twice what was
        asked for: the kernel's bookkeeping share), sorted."""
        out = set()
        for lk in self._links:
            try:
                out.add(lk.fs.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
            except OSError:
                continue
        return sorted(out)

    def tree_links(self, tree: int) -> list[Link]:
        """This node's links in ``tree`` (its parent's and its children's), once started."""
        return [lk for lk in self._links if lk.tree == tree]

    def express_link(self) -> Link:
        """The tree-0 link of a two-node engine, which carries the :mod:`.express` frames."""
        if self.nnodes != 2 or not self._links:
            raise InvalidArgument("the express path needs a started two-node engine", nnodes=self.nnodes)
        return next(lk for lk in self._links if lk.tree == 0)

    def start(self, timeout_s: float | None = None) -> None:
        """Connect to the tree neighbours (retrying until they are up) and start the threads.

        Raises :class:`CollectiveTimeout` (phase ``connect``) naming the peers that
        never connected within ``timeout_s`` (default: the engine's ``timeout_s``).
        """
        if self._started:
            raise InvalidArgument("engine already started")
        self._started = True
        if self.nnodes == 1:
            return
        wait = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait
        # a streamed op's frame carries half the buffer (no allocation follows from its length:
        # payloads go into the op's own buffers, whose sizes the op checks)
        limits = FrameLimits(max_payload_bytes=1 << 50)
        expected = {(c, t) for t, nd in enumerate(self.tree_nodes) for c in nd.children}
        nxt, prev = (self.node + 1) % self.nnodes, (self.node - 1) % self.nnodes
        if self.ring_on:  # the ring's link from the previous node: dialled by it, like a child's
            expected.add((prev, RING_TREE))
        got: dict[tuple[int, int], FramedSocket] = {}
        listener = self._listen
        acceptor = None
        if expected:
            if listener is None:
                host, port = parse_address(self.addresses[self.node])
                listener = socket.create_server((host, port), reuse_port=False, backlog=64)
            acceptor = Acceptor(listener, me=self.node, nnodes=self.nnodes, layout=self._layout_key,
                                token=self.token, expected=expected, limits=limits,
                                buf_bytes=self._sock_buf, on_link=lambda c, t, fs: got.__setitem__((c, t), fs),
                                congestion=self._congestion, send_buf_bytes=self._send_buf)
            acceptor.thread.start()
        dialed: dict[int, FramedSocket] = {}
        try:
            for t, nd in enumerate(self.tree_nodes):
                if nd.parent >= 0:
                    fs = self._dial(nd.parent, t, limits, deadline)
                    if fs is not None:
                        dialed[t] = fs
            if self.ring_on:
                fs = self._dial(nxt, RING_TREE, limits, deadline)
                if fs is not None:
                    dialed[RING_TREE] = fs
            if acceptor is not None:
                acceptor.thread.join(max(0.0, deadline - time.monotonic()))
                acceptor.stop.set()
                acceptor.thread.join()
            missing = [(nd.parent, t, "dial") for t, nd in enumerate(self.tree_nodes)
                       if nd.parent >= 0 and t not in dialed]
            if self.ring_on and RING_TREE not in dialed:
                missing.append((nxt, RING_TREE, "dial"))
            missing += [(c, t, "accept") for c, t in sorted(expected, key=lambda e: (e[1], e[0]))
                        if (c, t) not in got]
            if missing:
                peer, tree, _ = missing[0]
                names = ", ".join(f"{self.who(p)} ({'ring' if t == RING_TREE else f'tree {t}'})"
                                  for p, t, _ in missing)
                raise CollectiveTimeout(
                    f"node {self.node} ({self.addresses[self.node]}): could not connect to its "
                    f"neighbours within {wait:.1f} s; never connected: {names}",
                    node=self.node, peer=peer, tree=tree, phase="connect", chunk=None, seq=None,
                    missing=",".join(str(p) for p, _, _ in missing), waited_s=round(wait, 3))
        except BaseException:
            if acceptor is not None:
                acceptor.stop.set()
            for fs in [*dialed.values(), *got.values()]:
                fs.close()
            raise
        finally:
            if listener is not None:
                listener.close()
        for t, nd in enumerate(self.tree_nodes):
            if nd.parent >= 0:
                link = Link(nd.parent, t, PARENT, self.addresses[nd.parent], dialed[t])
                if self.exchange and t == 0:  # the parent's partials of small ops arrive ahead of our call
                    link.cv = threading.Condition(self._mu)
                    link.slots = [memoryview(np.empty(self.inline_bytes, dtype=np.uint8)) for _ in range(self._ring)]
                    link.meta = [(-1, -1, 0, None, 0.0)] * self._ring
                self._add_link(link)
            for c in nd.children:
                link = Link(c, t, CHILD, self.addresses[c], got[(c, t)], cv=threading.Condition(self._mu))
                bufs = [np.empty(self.chunk_bytes, dtype=np.uint8) for _ in range(self._ring)]
                link.slots = [memoryview(b) for b in bufs]
                link.meta = [(-1, -1, 0, None, 0.0)] * self._ring
                self._add_link(link)
        if self.ring_on:  # (in _links, for the aborts, status frames and closing; not in the trees')
            self._ring_next = Link(nxt, RING_TREE, PARENT, self.addresses[nxt], dialed[RING_TREE])
            self._ring_prev = Link(prev, RING_TREE, CHILD, self.addresses[prev], got[(prev, RING_TREE)])
            self._links += [self._ring_next, self._ring_prev]
        self._setup_streaming()
        if self.nnodes == 2:
            self.express = Express(self)
        elif self.nnodes > 2:
            self.express = TreeExpress(self)
        for link in self._links:
            link.reader = self._spawn(self._read_loop, link, f"hfr-read-{self.node}-t{link.tree}-n{link.peer}")
            if link.role == CHILD and link.tree != RING_TREE:
                self._spawn(self._down_loop, link, f"hfr-down-{self.node}-t{link.tree}-n{link.peer}")
        if self.ring_on:
            self._spawn(self._ring_send_loop, None, f"hfr-ring-send-{self.node}")
        for t in (0, 1):
            self._spawn(self._up_loop, t, f"hfr-up-{self.node}-t{t}")
        self._spawn(self._fill_loop, None, f"hfr-fill-{self.node}")

    def _dial(self, parent: int, tree: int, limits: FrameLimits, deadline: float) -> FramedSocket | None:
        pause = 0.02
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                return dial(self.addresses[parent], me=self.node, tree=tree, nnodes=self.nnodes,
                            layout=self._layout_key, token=self.token, limits=limits,
                            buf_bytes=self._sock_buf, timeout_s=min(left, 2.0), congestion=self._congestion,
                            send_buf_bytes=self._send_buf)
            except (OSError, DeadlineExceeded, Unavailable):  # not up yet, or busy: retry
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(pause * 2, 0.25)

    def _add_link(self, link: Link) -> None:
        if link.role == CHILD:
            self._children[link.tree].append(link)
        else:
            self._parent[link.tree] = link
        self._links.append(link)

    def _spawn(self, fn: Callable[..., None], arg: object, name: str) -> threading.Thread:
        def run() -> None:
            set_os_thread_name(name.removeprefix("hfr-"))  # "read-2-t0-n1" in top -H and perf
            fn(arg)

        th = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(th)
        th.start()
        return th

    # ------------------------------------------------------------------ the call

    def allreduce(self, work: np.ndarray, op: str, fp: Fingerprint, *,
                  on_final: Callable[[int, int], None] | None = None, deadline_s: float | None = None,
                  avg_divisor: int | None = None, fill: Callable[[int, int], None] | None = None,
                  fuse: Fuse | None = None, on_done: Callable[[OpStats], None] | None = None,
                  inputs: Sequence[np.ndarray] | None = None, mirrors: Sequence[np.ndarray] = (),
                  discard: bool = False) -> OpStats:
        """Allreduce ``work`` in place across the nodes; return this node's telemetry.

        ``work`` (1-D, contiguous, writable) holds this node's partial on entry and
        the global result on return; the engine owns it meanwhile.  ``op`` is
        ``sum``/``avg``/``max``/``min``; ``avg`` sums across nodes and divides by
        ``avg_divisor`` (default: the node count).  ``on_final(start, stop)`` is
        called from engine threads as element ranges become final (it must not
        block for long).  ``fill(start, stop)``, if given, must write this node's
        partial into ``work[start:stop]``: the engine calls it before it first reads
        those elements, on its fill thread (each range once, chunk by chunk, the two
        trees' chunks alternating; inline ops call it once for the whole buffer on the
        calling thread), so ``work`` may hold anything on entry.  ``fuse(start, stop,
        children)``, given with ``fill``, replaces it for the chunks of a tree in which
        this node has children (threaded ops): the up step calls it once the children's
        chunks arrived, and it must write the local partial and ``children`` (the
        children's chunks, valid during the call only) reduced left to right, in that
        order, into ``work[start:stop]`` -- one pass over the data where fill-then-reduce
        makes two (the worker reduces its ranks and the children in one kernel call).
        ``on_done(stats)``, if
        given, is called once when the op has completed on this node, by the engine thread
        that ran its last step (or the calling thread), before this call returns: the
        worker releases its ranks from there without waiting for this thread to wake.
        ``deadline_s`` bounds the whole op, ``timeout_s`` any wait
        without progress.  Raises an :class:`HFReduceError` subclass on failure,
        after which the engine is dead.

        ``inputs`` (instead of ``fill``; only for ops that :meth:`can_stream`): this node's
        partial is their reduce, left to right, which the engine makes itself -- ``work``
        may be one of them (in place) or a buffer of its own; ``mirrors`` get the result too.
        Ops without ``fill`` or ``fuse`` that can stream do so with ``inputs=[work]``.
        A streamed op is one frame per tree and direction, whatever ``chunk_bytes``.
        ``discard`` (with ``inputs``): this node wants the result in the ``mirrors`` only (a
        reduce whose root is elsewhere has none); an op streamed over the trees then leaves
        ``work`` as it was, one over the ring still uses it for its pieces.
        """
        self._check_call(work, op, fp)
        if inputs is not None or mirrors or discard:
            if fill is not None or fuse is not None or not self.can_stream(work):
                raise InvalidArgument("inputs/mirrors/discard are for ops that stream (can_stream), without fill or fuse",
                                      count=work.size, dtype=str(work.dtype))
            check_buffers(work, inputs or [work], mirrors)
        divisor = self.nnodes if avg_divisor is None else int(avg_divisor)
        if self.nnodes == 1:
            if fill is not None and work.size:
                fill(0, work.size)
            if op == "avg":
                divide_inplace(work, divisor)
            return self._one_node(work, fp, on_final, on_done)
        stream = ring = None
        if fill is None and fuse is None and self.can_stream(work):
            if self.ring_on and work.nbytes > self.inline_bytes:
                ring = RingOp(self.node, self.nnodes, work, inputs or [work], mirrors, "sum" if op == "avg" else op,
                              self.block_bytes, self.ring_piece_bytes)
            else:
                stream = StreamOp(work, inputs or [work], mirrors, "sum" if op == "avg" else op, self.block_bytes,
                                  discard=discard)
        st = self._post(work, op, fp, on_final, divisor, fill, on_done, fuse, stream, ring)
        return self._wait_complete(st, deadline_s)

    def _wait_complete(self, st: OpState, deadline_s: float | None) -> OpStats:
        """Wait for op ``st`` to complete (on_done has returned too, so the caller's report of the
        op comes first); its stats.  The engine is idle afterwards, whatever happened."""
        try:
            return self._wait_result(st, deadline_s, lambda: st.complete)
        finally:
            with self._mu:
                if self._op is st:
                    self._in_op = False

    def post(self, work: np.ndarray, op: str, fp: Fingerprint, *,
             on_final: Callable[[int, int], None] | None = None, avg_divisor: int | None = None,
             fill: Callable[[int, int], None] | None = None, on_done: Callable[[OpStats], None]) -> OpState:
        """Start a small (inline) op and return without waiting for it (several nodes only).

        Like :meth:`allreduce`, except that the call returns once this node's first steps
        ran: ``on_done(stats)`` reports the completion, on the engine thread that ran the
        last step, and the next op may be posted from there.  Nobody enforces the op's
        deadline unless someone calls :meth:`wait` (the worker's op thread does for an op
        that is slow to finish); a failure reaches ``wait`` and the next call.
        """
        self._check_call(work, op, fp)
        if not self.can_post(work.nbytes):
            raise InvalidArgument("post() takes small ops across several nodes only; call allreduce()")
        divisor = self.nnodes if avg_divisor is None else int(avg_divisor)
        return self._post(work, op, fp, on_final, divisor, fill, on_done)

    def _post(self, work: np.ndarray, op: str, fp: Fingerprint, on_final: Callable[[int, int], None] | None,
              divisor: int, fill: Callable[[int, int], None] | None,
              on_done: Callable[[OpStats], None] | None, fuse: Fuse | None = None,
              stream: StreamOp | None = None, ring: RingOp | None = None) -> OpState:
        """Make the op current and run the steps this thread may run now (inline ops)."""
        # a streamed op's frames carry a whole half each: its loops pipeline block by block
        chunk = self.chunk_bytes if stream is None else max(self.chunk_bytes, work.nbytes)
        st = OpState(self._next_k, fp, work, "sum" if op == "avg" else op, divisor if op == "avg" else 1,
                     on_final, chunk, len(self._links),
                     (len(self._children[0]), len(self._children[1])),
                     inline=work.nbytes <= self.inline_bytes, exchange=self.exchange)
        st.on_done = on_done
        st.stream = stream
        if ring is not None:  # the ring sender's last piece and the reader's: nothing on the trees
            st.ring = ring
            st.remaining = 2
        if fill is not None and st.inline:
            if work.size:
                fill(0, work.size)
        elif fill is not None:
            st.fill = fill
            # the fill thread produces the chunks; the up threads wait for them -- except in a tree
            # where we have children and the caller can fuse: there the up step reduces it all at once
            for t in (0, 1):
                if fuse is not None and self._children[t]:
                    st.fused[t] = True
                else:
                    st.filled[t] = 0
            st.fuse = fuse
        with self._mu:
            self._make_current(st)
            if st.inline:
                try:
                    self._check_no_park(st)
                except HFReduceError as e:
                    failed: HFReduceError | None = e
                else:
                    failed = None
                mine = [] if st.exchange or failed else [t for t in (0, 1) if self._claim_up(st, t)]
            else:
                failed = None
                for t in (0, 1):
                    for lk in self._children[t]:
                        lk.sent = 0  # (the down writers reset it too; a streamed op has none)
                self._post_cv.notify_all()
        if failed is not None:
            self._fail(failed)
            raise self._reraise(fp)
        try:
            if st.exchange:
                self._exchange_post(st)
            elif st.inline:
                for t in mine:
                    self._up_step(st, t, 0)
                    if self._parent[t] is None:
                        for lk in self._children[t]:
                            self._down_step(st, lk, 0)
        except _Failed:
            raise self._reraise(fp) from None
        except HFReduceError as e:
            if e is not self._failure:
                self._fail(e)  # found by an inline step on this thread: abort the others too
            raise self._reraise(fp) from None
        return st

    def _make_current(self, st: OpState) -> None:
        """Under the lock: ``st`` is this engine's op from now on (raises if the engine failed)."""
        if self._failure is not None:
            raise self._reraise(st.fp)
        self._op = st
        self._in_op = True
        self._next_k += 1
        self._progress_at = st.t0

    def current(self, seq: int) -> OpState | None:
        """The op state of op ``seq`` (its fingerprint's seq) if that is the current op, for :meth:`wait`."""
        st = self._op
        return st if st is not None and st.fp.seq == seq else None

    def can_post(self, nbytes: int) -> bool:
        """May an op of ``nbytes`` go through :meth:`post` (several nodes, an inline op)?"""
        return self.nnodes > 1 and nbytes <= self.inline_bytes

    def wait(self, st: OpState, deadline_s: float | None = None) -> OpStats:
        """Wait for posted op ``st`` (its deadline ``deadline_s`` counts from its post); its stats.

        Returns once every step of the op ran (its ``on_done`` may still be running: it
        may post and run later ops); raises the engine's failure otherwise.
        """
        return self._wait_result(st, deadline_s, lambda: st.result is not None)

    def _wait_result(self, st: OpState, deadline_s: float | None, ready: Callable[[], bool]) -> OpStats:
        try:
            self._wait(st, deadline_s, ready)
        except _Failed:
            raise self._reraise(st.fp) from None
        except HFReduceError as e:
            if e is not self._failure:
                self._fail(e)
            raise self._reraise(st.fp) from None
        assert st.result is not None
        return st.result

    @staticmethod
    def _one_node(work: np.ndarray, fp: Fingerprint, on_final: Callable[[int, int], None] | None,
                  on_done: Callable[[OpStats], None] | None) -> OpStats:
        """An op on one node, once ``work`` holds its result: report it whole."""
        if on_final is not None and work.size:
            on_final(0, work.size)
        now = time.time()
        stats = OpStats(seq=fp.seq, kind=fp.kind, nbytes=work.nbytes, started_at=now, finished_at=now)
        if on_done is not None:
            on_done(stats)
        return stats

    def _check_work(self, work: np.ndarray, fp: Fingerprint) -> None:
        """What every op needs: a started engine, not failed, idle, and a 1-D buffer it may write."""
        if not self._started:
            raise InvalidArgument(f"call start() before running {fp.kind} ops")
        if self._failure is not None:  # first: a failed op may leave _in_op set, and this is the news
            raise self._reraise(fp)
        if self._in_op:
            raise InvalidArgument("one op at a time per engine")
        if not isinstance(work, np.ndarray) or work.ndim != 1 or not work.flags.c_contiguous \
                or not work.flags.writeable:
            raise InvalidArgument("work must be a writable 1-D contiguous numpy array")

    def _check_call(self, work: np.ndarray, op: str, fp: Fingerprint) -> None:
        self._check_work(work, fp)
        if op not in kernels.OPS or fp.op != op:
            raise InvalidArgument(f"op {op!r} must be one of {kernels.OPS} and match the fingerprint's {fp.op!r}")
        # (the worker's allreduce of a narrow float names that dtype in the fingerprint, so that nodes
        # that disagree on it are told, and carries float32 partials in ``work``)
        named = kernels.dtype_from_name(fp.dtype)
        if fp.count != work.size or work.dtype not in (named, kernels.carried_dtype(named)):
            raise InvalidArgument(f"work ({work.size} x {work.dtype}) does not match the fingerprint {fp}",
                                  count=work.size, dtype=str(work.dtype))

    def _reraise(self, fp: Fingerprint | None = None) -> HFReduceError:
        """A fresh copy of the failure to raise (for op ``fp``: a remote mismatch names its fingerprint)."""
        e = self._failure
        assert e is not None
        if fp is not None and self._abort_mismatch is not None and isinstance(e, CollectiveAborted):
            return self._mismatch(str(fp), *self._abort_mismatch)
        return type(e)(e.message, **e.fields)

    def _mismatch(self, ours: str, origin: int, fields: dict[str, object]) -> FingerprintMismatch:
        """From another node's mismatch: name whichever of the two disagrees with *us* (the odd one out)."""
        peer, theirs = origin, fields.get("ours")
        if theirs == ours and fields.get("theirs") != ours:
            peer, theirs = fields.get("peer"), fields.get("theirs")
        return FingerprintMismatch(
            f"collective mismatch on {self.who(self.node)}: we run {ours} but node {peer} runs {theirs} "
            f"(found by node {origin}; every node must issue the same collectives in the same order)",
            node=self.node, peer=peer, ours=ours, theirs=theirs, origin=origin)

    def _wait(self, st: OpState, deadline_s: float | None, ready: Callable[[], bool]) -> None:
        """Wait until ``ready()`` for op ``st``, enforcing its deadlines (raises on failure).

        Waits without progress end after ``timeout_s``, the op after ``deadline_s``.
        Then the peer we wait for is blamed -- unless it has started the op (it told
        us, or sent data): it is waiting on someone else, whose neighbour will abort
        first, so we hold off for ``grace_s`` before blaming it anyway.
        """
        window = self.timeout_s if deadline_s is None else min(self.timeout_s, deadline_s)
        op_deadline = math.inf if deadline_s is None else st.t0 + deadline_s
        err: HFReduceError | None = None
        with self._mu:
            while self._failure is None and not ready():
                now = time.monotonic()
                status_at = math.inf if st.status_sent else st.t0 + min(0.5, window / 4)
                expiry = min(op_deadline, self._progress_at + self.timeout_s)
                if now >= status_at:
                    st.status_sent = True
                    self._send_status(st.k)  # on other threads: this one must never block on a socket
                    continue
                if now >= expiry and (st.stream is not None or st.ring is not None) and self._loops_moved():
                    self._progress_at = now  # a block loop moved data: progress, not a stall
                    continue
                if now >= expiry:
                    err = self._timeout_error(st, now, expiry)
                    if err is not None:
                        break
                    wake = expiry + self.grace_s
                else:
                    wake = min(expiry, status_at)
                self._done_cv.wait(max(0.001, min(wake - now, 1.0)))
            # an op that completed here before the failure stands (its ranks may be released
            # already); the failure reaches the next call
            if err is None and self._failure is not None and not ready():
                raise self._reraise(st.fp)
        if err is not None:
            self._fail(err)
            raise self._reraise(st.fp)

    def _send_status(self, k: int) -> None:
        """Tell every neighbour we started op ``k`` (best effort, one short-lived thread per link).

        Not on the waiting thread: a send to a neighbour that stopped reading would block
        it, and with it every deadline this node enforces.  Called under the lock.
        """
        hdr = Request(rid=k, op=WAIT)
        self._threads = [th for th in self._threads if th.is_alive() or not th.name.startswith("hfr-status")]
        for link in self._links:
            th = threading.Thread(target=link.try_send, args=(hdr, 0.05), daemon=True,
                                  name=f"hfr-status-{self.node}-n{link.peer}")
            self._threads.append(th)
            th.start()

    def _peer_started(self, peer: int, k: int) -> bool:
        return any(lk.seen_op >= k for lk in self._links if lk.peer == peer)

    def _blame(self, st: OpState) -> list[tuple[int, int, str, int, str]]:
        """(peer, tree, phase, chunk, how) for every peer this op waits on (under the lock)."""
        if st.ring is not None:
            return self._ring_blame(st)
        if st.bcast is not None:
            return self._bcast_blame(st)
        out = self._stream_waits(st) if st.stream is not None else []
        if out:  # a block loop is blocked in a socket call: that peer, precisely
            return out
        for t in (0, 1):
            n = st.layouts[t].nchunks
            parent = self._parent[t]
            if st.up_done[t] < n:
                missing = [lk for lk in self._children[t] if lk.arrived <= lk.consumed and lk.park is None]
                out += [(lk.peer, t, "up", st.up_done[t], "recv") for lk in missing]
                if not missing and st.up_sending[t] and parent is not None:
                    out.append((parent.peer, t, "up", st.up_done[t], "send"))
            if parent is not None and st.final[t] < st.up_done[t]:
                out.append((parent.peer, t, "down", st.final[t], "recv"))
            for lk in self._children[t]:
                if lk.sent < st.final[t]:
                    out.append((lk.peer, t, "down", lk.sent, "send"))
        return out

    def _timeout_error(self, st: OpState, now: float, expiry: float) -> CollectiveTimeout | None:
        waiting = self._blame(st)
        culprits = [w for w in waiting if not self._peer_started(w[0], st.k)]
        if not culprits and waiting and now < expiry + self.grace_s:
            return None  # our peers are running the op: their own neighbour should name the culprit
        peer, tree, phase, chunk, how = (culprits or waiting or [(-1, -1, "?", -1, "recv")])[0]
        waited = now - max(st.t0, self._progress_at)
        missing = ",".join(dict.fromkeys(str(w[0]) for w in waiting))
        who = self.who(peer) if peer >= 0 else "no peer"
        what = f"sent nothing for {waited:.1f} s" if how == "recv" else f"took no data for {waited:.1f} s"
        note = " and never started this op" if culprits else ""
        where = (f"in the ring's {phase} phase, frame {chunk}" if tree == RING_TREE
                 else f"in tree {tree} {phase} phase" + (f", chunk {chunk}" if chunk >= 0 else ""))
        return CollectiveTimeout(
            f"{st.fp} on {self.who(self.node)}: {who} {what}{note}, {where} (waiting for nodes {missing or '-'})",
            node=self.node, peer=peer, tree=tree, phase=phase, chunk=chunk, seq=st.fp.seq,
            missing=missing, waited_s=round(waited, 3))

    # ------------------------------------------------------------------ failure

    def _link_failed(self, lk: Link, e: BaseException) -> None:
        if self._closing or self._failure is not None:
            return
        if isinstance(e, HFReduceError):
            self._fail(e)
            return
        if self._reader_explains(lk):
            return
        st = self._op
        if not self._in_op:
            phase = "idle"
        elif lk.tree == RING_TREE:
            phase = "ring"
        else:
            phase = "up" if lk.role == CHILD else "down"
        what = f"{st.fp}" if st is not None and self._in_op else f"{self.who(self.node)} (between ops)"
        self._fail(PeerLost(
            f"{what} on node {self.node}: lost the connection to {self.who(lk.peer)} "
            f"{'on the ring' if lk.tree == RING_TREE else f'in tree {lk.tree}'} "
            f"({phase} phase): {e}; that node's process probably died",
            node=self.node, peer=lk.peer, tree=lk.tree, phase=phase,
            seq=st.fp.seq if st is not None else None), culprit=lk.peer)

    def _reader_explains(self, lk: Link) -> bool:
        """A send on ``lk`` failed (not its reader): wait up to ``EXPLAIN_S`` for another failure.

        A send fails when the peer closed its end -- often because that node failed first
        (a local rank died, say), sent us its abort frame and then closed the communicator.
        That frame is still queued on the socket for the link's reader, even after a reset;
        reporting the lost connection at once would hide the peer's reason behind our own
        race.  The reader reads what is queued and fails the engine, with the peer's reason
        or with the EOF itself.  False: nobody did in time, the caller reports the link.
        """
        reader = lk.reader
        if reader is None or reader is threading.current_thread() or not reader.is_alive():
            return False
        deadline = time.monotonic() + EXPLAIN_S
        with self._mu:
            while self._failure is None and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._done_cv.wait(left)
        return True

    def _on_abort(self, lk: Link, hdr: Request) -> None:
        m = hdr.meta
        origin = m.get("origin", lk.peer)
        reason = str(m.get("reason", ""))
        err = m.get("error") or {}
        fields = err.get("fields") or {}
        st = self._op
        mismatch = err.get("kind") == "FingerprintMismatch"
        if mismatch and st is not None and self._in_op:
            mine: HFReduceError = self._mismatch(str(st.fp), origin, fields)
        else:
            if mismatch:  # not in an op yet: our next call turns it into a mismatch with its fingerprint
                self._abort_mismatch = (origin, fields)
            desc = str(st.fp) if st is not None else f"op {hdr.rid}"
            mine = CollectiveAborted(
                f"{desc} on {self.who(self.node)} aborted: {self.who(origin)} failed first: {reason}",
                node=self.node, origin=origin, reason=reason, seq=st.fp.seq if st is not None else None,
                culprit=m.get("culprit"))
        # a peer that closed cleanly while we are between ops or in the last, ``close``
        # collective (the end of a job: it finished that op first, so every earlier op is done
        # everywhere) is no fault; during any other op it is, and is logged as one
        ending = not self._in_op or (st is not None and st.fp.kind == "close")
        self._fail(mine, source=lk, forward=dict(m), log=not (m.get("closed") and ending))

    def _fail(self, err: HFReduceError, *, source: Link | None = None, culprit: int | None = None,
              forward: dict[str, object] | None = None, log: bool = True, closed: bool = False) -> None:
        """Record the first failure, wake every thread, flood ``hfr.abort`` (once).

        ``closed``: the failure is this node closing its engine cleanly; peers that are
        between ops then record it without logging (a normal end, not a fault)."""
        if culprit is None and isinstance(err, CollectiveTimeout | PeerLost):
            culprit = err.peer
        meta = forward or {"origin": self.node, "reason": str(err), "culprit": culprit,
                           "error": err.to_dict(), "closed": closed}
        with self._mu:
            if self._failure is not None:
                return
            # the abort threads are registered before anyone can see the failure: a caller that
            # raises and closes the engine at once must not shut the links before they are sent
            # (the peers would see a clean EOF from a live node and blame it)
            k = self._op.k if self._op is not None else self._next_k
            hdr = Request(rid=k, op=ABORT, meta=meta)
            floods = [] if self._closing else [
                threading.Thread(target=self._send_abort, args=(lk, hdr), daemon=True,
                                 name=f"hfr-abort-{self.node}-n{lk.peer}")
                for lk in self._links if lk is not source]
            for th in floods:
                th.start()
            self._threads.extend(floods)
            self._failure = err
            self._abort[0] = 1
            for cv in (self._post_cv, self._done_cv, self._ring_cv, *self._up_cv, *self._down_cv):
                cv.notify_all()
            for lk in self._links:
                if lk.cv is not None:
                    lk.cv.notify_all()
            closing = self._closing
        if self.on_failure is not None:
            try:
                self.on_failure()
            except Exception:  # noqa: BLE001 - the failure is recorded; the hook only speeds up its report
                _log.exception("hfreduce on_failure hook failed", node=self.node)
        if closing:
            return
        if log:
            (_log.warning if self._in_op else _log.info)("hfreduce engine failed", node=self.node,
                                                        error=str(err), kind=err.kind)

    @staticmethod
    def _send_abort(lk: Link, hdr: Request) -> None:
        if not lk.try_send(hdr, 1.0):
            lk.fs.shutdown()  # could not get a word in: the peer sees EOF instead

    # ------------------------------------------------------------------ closing

    @property
    def failed(self) -> HFReduceError | None:
        """The error that killed this engine, if any."""
        return self._failure

    def abort(self, reason: str) -> None:
        """Fail the current (or next) op on every node, naming ``reason`` and this node."""
        self._fail(HFReduceError(f"{self.who(self.node)} aborted: {reason}", node=self.node, reason=reason))

    def close(self) -> None:
        """Tell the peers (best effort), close every connection and join every thread."""
        with self._mu:
            if self._closing:
                return
            was_ok = self._failure is None
        if was_ok and self._links:
            self._fail(HFReduceError(f"{self.who(self.node)} closed its engine", node=self.node), log=False,
                       closed=True)
        with self._mu:
            self._closing = True
            if self._failure is None:
                self._failure = HFReduceError(f"{self.who(self.node)} closed its engine", node=self.node)
            for cv in (self._post_cv, self._done_cv, self._ring_cv, *self._up_cv, *self._down_cv):
                cv.notify_all()
        deadline = time.monotonic() + _JOIN_S
        with self._mu:
            threads = list(self._threads)
        for th in threads:
            if th.name.startswith("hfr-abort"):
                th.join(max(0.0, deadline - time.monotonic()))
        self._linger(min(deadline, time.monotonic() + LINGER_S))
        for lk in self._links:
            lk.fs.shutdown()
        with self._mu:
            threads = list(self._threads)
        for th in threads:
            if th is not threading.current_thread():
                th.join(_JOIN_S)
        for lk in self._links:
            lk.fs.close()
        if self._listen is not None and not self._started:
            self._listen.close()

    def _linger(self, until: float) -> None:
        """Before the links close: wait (until ``until``) for the peers to acknowledge all we sent.

        A peer still sending to us leaves unread bytes on our sockets, and closing such a
        socket resets the connection and drops what of ours the peer has not acknowledged --
        after a failure, the aborted block and abort frame that tell it why.  It would then
        report a lost connection instead of our reason.  The readers keep draining meanwhile,
        so a peer blocked on sending to us moves on and reads."""
        while any(lk.fs.unacked_bytes() for lk in self._links) and time.monotonic() < until:
            time.sleep(0.002)

    def __enter__(self) -> NodeEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
