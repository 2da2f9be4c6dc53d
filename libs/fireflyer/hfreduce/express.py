"""Small ops between two nodes: one frame each way, and as little Python as it takes.

(Beyond two nodes the same lean path runs on tree 0 alone: :mod:`.express_tree`.  Barriers take
it too, as an exchange of an empty partial: on the thirty-seventh VM a 2-node barrier took 63-65
µs against 134-141 on the engine's path, a 4-node one 484-500 against 730-758.  So do small
reduces -- every node reduces, only the root's buffer gets the result -- and broadcasts, as the
engine runs them: an int32 sum of the buffer's bytes as words, zeros from every node but the
root's, so the bits arrive as they left.  On the thirty-eighth VM a 4-byte 2-node broadcast took
158-166 µs against 244-387 on the engine's path, a reduce 163-164 against 255-365; 4 nodes:
733-906 against 950-1,058, and 745-889 against 1,001-1,011.)

With two nodes a small allreduce is an *exchange*: each node sends its partial (its local
ranks' reduce) to the other, and both reduce the two partials in node order (node 0's
first), so both hold the same bits after one hop.  The engine's general path can run that
exchange too, through its op state machine (layouts, ring slots, step claims, per-tree
stats, phase callbacks); on the CI VM that machinery cost a 4-byte op ~170 µs of worker
CPU, about 300 Python calls, while the exchange written with only what it needs, over the
same message layers (msgspec to the ranks, ``fireflyer.wire`` frames between the workers),
took ~60 µs per op end to end (a prototype, 2026-11-26).  This module is that lean path.

:class:`~fireflyer.hfreduce.nodecomm.NodeComm` sends an op here when :func:`eligible` says
so -- an allreduce or reduce of at most :data:`EXPRESS_BYTES` carried bytes, a broadcast of at
most that many bytes as int32 words, a barrier -- on a two-node communicator.  The test
depends on the op alone (never on a node's settings), so when the nodes agree on the op they
agree on the path.

**Wire.**  One ``hfr.x`` frame per node and op on the tree-0 link between the two nodes
(the engine's reader for that link hands it to :meth:`Express.on_frame`): ``rid`` is the
communicator's op number, ``meta`` ``{"fp": fingerprint}``, the payload the partial in
the carried dtype (float32 for narrower floats).  It shares the link, and so its order,
with the engine's frames and its ``hfr.abort`` flood.

**Polling.**  After an express frame the link's reader polls the socket for the next one
for up to :data:`EXPRESS_POLL_S` (``WorkerSettings.express_poll_us``) before it blocks in
``recv``, yielding the CPU between polls (:meth:`fireflyer.wire.conn.FramedSocket.poll_for`).
Small ops come in runs (a barrier, a run of small gradients, a training loop's metrics), and
a two-node op waits on one hop from the other node's CPU.  A reader that sleeps there lets
its CPU go idle, and on a VM waking an idle vCPU costs more than the hop: on the
twenty-first VM (2026-11-27, KVM, guest halt-polling off) a Python ping-pong between two
CPUs took 69-72 µs per round trip with both sides blocking, against 6 µs with the pair on
one CPU; in another run, 72-82 µs blocking against 27-28 µs when the receiving reader
polled for up to 50 µs first.  There, in six
interleaved launch pairs of ``ff bench allreduce --nodes 2 --sizes 4 --vs gloo`` with
polling off and at 200 µs, an op took 146 µs (119-159) against 110 µs (98-122): 0.78x the
time at the median of the pairs (0.65-1.03x), 1.00x Gloo against 1.35x; with 2 x 4 local
ranks, four pairs, 0.88x.  Polling costs at most the budget per op, of CPU time that was
otherwise idle (the yield lets every runnable thread of the CPU go first), and only an
express frame starts it, so a large op's frames never wait behind it.  Not on the engine's
links beyond two nodes: there, with more nodes than CPUs, polling after every small frame
made 4 x 1 4-byte ops slower (1.07-1.20x the time in three pairs on the same VM).

**Failures** go through the engine, so that both nodes hear them as they would from an
engine op: a fingerprint that differs (also a frame for an op this node runs on the engine,
or an engine op where the peer sent a frame) fails the engine with
:class:`FingerprintMismatch`, which floods it; a dead peer is the engine reader's EOF; a
slow op is the op thread's :meth:`Express.wait` (the engine's deadline rules: the op's
deadline plus the slack that lets a node whose rank is missing report it first), which
blames the peer node.  After any of these the engine is dead and the generation fails.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fireflyer.wire.frame import Request

from . import kernels
from ._op import divide_inplace
from .errors import CollectiveTimeout, FingerprintMismatch, HFReduceError
from .trees import DoubleTree
from .types import Fingerprint, OpStats, PeerStats, TreeStats

if TYPE_CHECKING:
    from ._links import Link

__all__ = ["XOP", "EXPRESS_BYTES", "EXPRESS_POLL_S", "Express", "ExpressBase", "ExpressHost", "XOp", "add_pair", "combine",
           "eligible", "send_partial"]


class ExpressHost(Protocol):
    """What the express paths need of the :class:`~fireflyer.hfreduce.engine.NodeEngine` that
    runs them (the engine is above this module: it makes its express paths and hands itself over)."""

    node: int
    double_tree: DoubleTree

    @property
    def failed(self) -> HFReduceError | None: ...

    def who(self, node: int) -> str: ...

    def peer_mismatch(self, peer: int, ours: str, theirs: object) -> FingerprintMismatch: ...

    def express_link(self) -> Link: ...

    def tree_links(self, tree: int) -> list[Link]: ...

    def _reraise(self, fp: Fingerprint | None = None) -> HFReduceError: ...

    def _link_failed(self, lk: Link, e: BaseException) -> None: ...

    def _fail(self, err: HFReduceError, *, source: Link | None = None, culprit: int | None = None,
              forward: dict[str, object] | None = None, log: bool = True, closed: bool = False) -> None: ...

XOP = "hfr.x"
#: the largest express op, in carried bytes (a constant: both nodes must take the same path)
EXPRESS_BYTES = 64 << 10
#: how long the express link's reader polls for the next frame before it sleeps ("Polling")
EXPRESS_POLL_S = 200e-6
#: frames of ops this node has not started yet: the peer can be at most an op or two ahead
#: (it cannot finish an op without our frame), so more is a protocol error
_MAX_PARKED = 16
_ADD_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64)})
_perf = time.perf_counter
_mono = time.monotonic


def add_pair(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a + b`` as ``kernels.reduce_into(out, [a, b], "sum")`` computes it for up to
    ``SMALL_ELEMS`` float32 / int32 / int64 elements (numpy's add, float32 in float32, integers
    wrapping), without its checks, which cost a small op ~10 us; ``out`` may be ``a`` or ``b``."""
    with np.errstate(over="ignore", invalid="ignore"):  # (inf and nan are results, as in the kernels)
        np.add(a, b, out=out)


def eligible(kind: str, dtype: np.dtype, count: int) -> bool:
    """Does an op go express?  Barriers; allreduces and reduces of at most :data:`EXPRESS_BYTES`
    carried; broadcasts of at most that many bytes as the int32 words they travel as
    (``opexec.wire_layout``).  (Decided from the op alone: see the module docs.)"""
    if kind == "barrier":
        return True
    if kind == "broadcast":
        return -(-count * dtype.itemsize // 4) * 4 <= EXPRESS_BYTES
    # (a reduce_scatter as the allreduce of the same input would go: the same bits, see opexec)
    return kind in ("allreduce", "reduce", "reduce_scatter") and \
        count * kernels.carried_dtype(dtype).itemsize <= EXPRESS_BYTES


class XOp:
    """One express op on this node: the caller's buffers and what the exchange needs."""

    __slots__ = ("seq", "fpw", "ours", "views", "targets", "result", "narrow", "redop", "divisor", "t0",
                 "started_at", "local_s", "send_s", "recv_s", "done", "on_done", "ctx", "links")

    def __init__(self, seq: int, fpw: list[object], ours: np.ndarray, views: list[np.ndarray], *, narrow: bool,
                 redop: str, divisor: int, on_done: Callable[[XOp], None],
                 result: np.ndarray | None = None) -> None:
        self.seq = seq
        #: the fingerprint as it travels (``_op.fp_wire``)
        self.fpw = fpw
        #: our partial (carried dtype); the result lands in it too
        self.ours = ours
        #: the buffers that get the result (a reduce: only its root's; a broadcast: all but its root's)
        self.views = views
        #: narrow floats: the float32 result is rounded into views[0], then copied to the others;
        #: otherwise it is copied into every view that is not ``ours`` itself
        self.narrow = narrow
        self.targets = views if narrow else [v for v in views if v is not ours]
        #: what the views get when it is not ``ours`` as it is (a broadcast: its int32 words' bytes,
        #: cut to the buffer's length)
        self.result = ours if result is None else result
        self.redop = redop
        self.divisor = divisor
        self.t0 = _mono()
        self.started_at = time.time()
        self.local_s = self.send_s = self.recv_s = 0.0
        self.done = False
        #: called once with the op when the result is in every view, on the thread that finished it
        self.on_done = on_done
        #: the caller's own state of the op
        self.ctx: Any = None
        #: the tree path's traffic: peer -> [bytes sent, bytes received, seconds in socket calls]
        self.links: dict[int, list[float]] = {}

    def stats(self, peers: dict[int, PeerStats]) -> OpStats:
        """The op's telemetry, its whole time as tree 0's up phase (the only one an express op
        has), with each peer's traffic; the kind the fingerprint names."""
        took = _mono() - self.t0
        return OpStats(seq=self.seq, kind=self.fingerprint().kind, nbytes=self.ours.nbytes,
                       trees=[TreeStats(up_s=took), TreeStats()], peers=peers,
                       started_at=self.started_at, finished_at=self.started_at + took)

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(*self.fpw)  # type: ignore[arg-type]

    def write_result(self) -> None:
        """``ours`` holds the result: put it in every view that is not ``ours`` itself."""
        targets = self.targets
        if self.narrow and targets:
            kernels.cast_into(targets[0], self.ours, threads=1)
            for v in targets[1:]:
                np.copyto(v, targets[0])
        elif not self.narrow:
            for v in targets:
                np.copyto(v, self.result)


def combine(op: XOp, parts: list[np.ndarray]) -> None:
    """Reduce ``parts`` (``op.ours`` among them, in the order given) into ``op.ours``: the same
    order on every run, so the same bits."""
    ours = op.ours
    if op.redop == "sum" and ours.dtype in _ADD_DTYPES and ours.size <= kernels.SMALL_ELEMS:
        add_pair(parts[0], parts[1], ours)
        for p in parts[2:]:
            add_pair(ours, p, ours)
    else:
        kernels.reduce_into(ours, parts, op.redop, threads=1)


class ExpressBase:
    """What both express paths share: one op at a time, parked early frames, the engine-op
    bookkeeping, the watch over a slow op, failing through the engine."""

    def __init__(self, engine: ExpressHost) -> None:
        self.engine = engine
        self._lock = threading.RLock()  # (re-entered: a failure found under it wakes the waiters)
        self._cv = threading.Condition(self._lock)
        self._op: XOp | None = None
        #: the op NodeComm last ran on the engine (a frame for it means the nodes disagree)
        self._engine_seq = -1
        self._engine_fp = ""
        self._done_seq = -1

    # (each path: how an op starts and a frame lands; its parked frames of op ``seq``, removed;
    # the timeout that blames its peers; its op's telemetry)
    def start(self, op: XOp) -> None:
        raise NotImplementedError

    def on_frame(self, lk: Link, hdr: Request, plen: int) -> None:
        raise NotImplementedError

    def _unpark(self, seq: int) -> list[tuple[int, object]]:
        raise NotImplementedError

    def _timeout(self, op: XOp, waited: float) -> CollectiveTimeout:
        raise NotImplementedError

    def stats(self, op: XOp) -> OpStats:
        raise NotImplementedError

    def _stagger_s(self) -> float:
        """How much longer than the deadline this node waits, in its op's current phase (0:
        none), so that the node next to a fault times out first and its reason reaches the rest."""
        return 0.0

    def _read_frame(self, lk: Link, hdr: Request, plen: int) -> tuple[np.ndarray, float]:
        """The payload of an express frame from ``lk`` (the reader's thread); an oversized one
        fails the engine (raises), without allocating what a bad peer says."""
        if plen > EXPRESS_BYTES:
            lk.fs.discard(plen)
            self._fail(HFReduceError(f"{self.engine.who(lk.peer)} sent an express frame of {plen} bytes "
                                     f"(at most {EXPRESS_BYTES})", node=self.engine.node, peer=lk.peer))
        buf = np.empty(plen, np.uint8)
        t = _perf()
        lk.fs.recv_into(memoryview(buf))  # (errors: the reader's, a lost link)
        return buf, _perf() - t

    def _complete(self, op: XOp) -> None:
        """The result is in every view: mark the op done, wake its watcher, report it."""
        with self._lock:
            op.done = True
            self._op = None
            self._done_seq = op.seq
            self._cv.notify_all()
        op.on_done(op)

    # -- NodeComm's bookkeeping -----------------------------------------------------------------

    def engine_op(self, seq: int, fp: Fingerprint) -> None:
        """NodeComm runs op ``seq`` on the engine: a frame for it (now or later) is a mismatch."""
        with self._lock:
            self._engine_seq, self._engine_fp = seq, str(fp)
            got = self._unpark(seq)
        if got:
            self._fail(self.engine.peer_mismatch(got[0][0], str(fp), got[0][1]))

    def running(self, seq: int) -> bool:
        """Is op ``seq`` started here and not finished?"""
        op = self._op
        return op is not None and op.seq == seq and not op.done

    def running_fingerprint(self, seq: int) -> str | None:
        """The fingerprint of op ``seq`` if it is running here (without the lock: the engine asks
        while a reader waits for an engine op that a peer has started and this node has not)."""
        op = self._op
        return str(op.fingerprint()) if op is not None and op.seq == seq and not op.done else None

    def wait(self, seq: int, deadline_s: float) -> None:
        """The op thread's watch over a slow op (``deadline_s`` counts from its start): return
        once it finished; raise the engine's failure, or a timeout blaming the peer."""
        with self._lock:
            op = self._op
            if op is None or op.seq != seq:
                return
            while not op.done and self.engine.failed is None:
                left = op.t0 + deadline_s + self._stagger_s() - _mono()  # (the phase may change)
                if left <= 0:
                    break
                self._cv.wait(min(0.05, max(0.001, left)))
            if op.done:
                return
        if self.engine.failed is None:
            self._fail(self._timeout(op, _mono() - op.t0))
        raise self.engine._reraise(op.fingerprint())

    # -- failure --------------------------------------------------------------------------------

    def _fail(self, err: HFReduceError) -> None:
        """Fail the engine with ``err`` (the peers hear it through its abort flood), then raise it."""
        self.engine._fail(err)
        with self._cv:
            self._cv.notify_all()
        raise err


class Express(ExpressBase):
    """The express path of a two-node engine (see the module docs); one op at a time."""

    def __init__(self, engine: ExpressHost) -> None:
        """Made by a two-node engine once its links are up, before its readers start."""
        super().__init__(engine)
        #: the link whose reader polls after an express frame ("Polling")
        self.link: Link | None = engine.express_link()
        self.peer = self.link.peer
        #: node 0's partial comes first on both nodes: the same bits everywhere
        self.first = engine.node < self.peer
        self._parked: dict[int, tuple[object, np.ndarray, float]] = {}

    # -- the op's two halves --------------------------------------------------------------------

    def start(self, op: XOp) -> None:
        """Send our partial, then finish the op here if the peer's is in already (the caller's
        thread: a rank's reader or the op thread).  Raises the engine's failure."""
        with self._lock:  # the peer's frame came first and is another op: fail here, send nothing
            got = self._parked.get(op.seq)
            if got is not None and got[0] != op.fpw:
                del self._parked[op.seq]
                self._fail(self.engine.peer_mismatch(self.peer, str(op.fingerprint()), got[0]))
        assert self.link is not None
        op.send_s = send_partial(self.engine, self.link, op)
        with self._lock:
            self._op = op  # (after the send: the result overwrites ``ours``, which the send reads)
            got = self._parked.pop(op.seq, None)
        if got is not None:
            self._finish(op, *got)

    def on_frame(self, lk: Link, hdr: Request, plen: int) -> None:
        """The peer's partial (on the link's reader): finish the op, or park it until it starts."""
        fpw = hdr.meta.get("fp")
        seq = hdr.rid
        try:
            buf, took = self._read_frame(lk, hdr, plen)
            with self._lock:
                op = self._op
                if op is None or op.seq != seq:
                    self._park(seq, fpw, buf, took)
                    return
            self._finish(op, fpw, buf, took)
        except HFReduceError:
            return  # the engine has failed with it (floods it, wakes the op thread)

    def _park(self, seq: int, fpw: object, buf: np.ndarray, took: float) -> None:
        """Under the lock: keep the frame of an op this node has not started (the peer is ahead)."""
        if seq == self._engine_seq:
            self._fail(self.engine.peer_mismatch(self.peer, self._engine_fp, fpw))
        if seq <= self._done_seq or seq in self._parked or len(self._parked) >= _MAX_PARKED:
            self._fail(HFReduceError(
                f"{self.engine.who(self.peer)} sent an express frame for op #{seq}, which "
                f"{self.engine.who(self.engine.node)} has {'finished' if seq <= self._done_seq else 'not started'} "
                f"({len(self._parked)} frames parked)", node=self.engine.node, peer=self.peer, seq=seq))
        self._parked[seq] = (fpw, buf, took)

    def _finish(self, op: XOp, fpw: object, buf: np.ndarray, took: float) -> None:
        """Both partials are here: reduce them in node order, write every view, report."""
        if fpw != op.fpw or buf.nbytes != op.ours.nbytes:
            self._fail(self.engine.peer_mismatch(self.peer, str(op.fingerprint()), fpw))
        op.recv_s = took
        ours = op.ours
        theirs = buf.view(ours.dtype)
        combine(op, [ours, theirs] if self.first else [theirs, ours])
        if op.divisor != 1:
            divide_inplace(ours, op.divisor)
        op.write_result()
        self._complete(op)

    def _unpark(self, seq: int) -> list[tuple[int, object]]:
        got = self._parked.pop(seq, None)
        return [] if got is None else [(self.peer, got[0])]

    def _timeout(self, op: XOp, waited: float) -> CollectiveTimeout:
        return CollectiveTimeout(
            f"{op.fingerprint()} on {self.engine.who(self.engine.node)}: {self.engine.who(self.peer)} sent "
            f"nothing for {waited:.1f} s in the two-node exchange", node=self.engine.node, peer=self.peer,
            tree=0, phase="exchange", chunk=0, seq=op.seq, missing=str(self.peer), waited_s=round(waited, 3))

    def stats(self, op: XOp) -> OpStats:
        n = op.ours.nbytes
        return op.stats({self.peer: PeerStats(bytes_sent=n, bytes_received=n, transfer_s=op.send_s + op.recv_s)})


def send_partial(engine: ExpressHost, lk: Link, op: XOp) -> float:
    """Send ``op.ours`` on ``lk`` as an express frame; seconds in the socket call.  A lost link
    fails the engine, and this raises its failure."""
    t = _perf()
    try:
        lk.send(Request(rid=op.seq, op=XOP, meta={"fp": op.fpw}), memoryview(op.ours.view(np.uint8)))
    except Exception as e:  # noqa: BLE001 - OSError or FireFlyerError: the link is gone
        engine._link_failed(lk, e)
        raise engine._reraise(op.fingerprint()) from None
    return _perf() - t
