"""One communicator generation on a node worker: arrival, fingerprint check, op, release.

:class:`NodeComm` has one op thread that waits for all ``K`` local ranks to submit op
``seq`` (the deadline counts from the first arrival, or from the end of the previous op
if that is later), checks their fingerprints agree, runs the op (:mod:`.opexec`, with a
``NodeEngine`` across nodes) and releases the ranks.  Any failure -- a mismatch, a rank
that did not arrive, a rank whose connection dropped, an engine error -- *fails the
generation*: every pending and later op of every local rank gets the error, and
``engine.abort`` makes the other nodes' ranks raise too.  Ranks that join again under the
same name get a new generation (:meth:`Worker.join`).

Small ops across nodes are *posted* (``NodeEngine.post``), not waited for: the thread
that starts one (a rank's reader, or the op thread) goes back to its work at once, and the
engine thread that completes it writes the result back, releases the ranks, ends the op
and, if the next op's ranks have all submitted, posts that one too.  Nobody waits for a
posted op that finishes quickly; one still running after ``WATCH_S``, or an engine that
failed (``NodeEngine.on_failure`` wakes the op thread), gets ``engine.wait`` on the op
thread, which enforces the deadline and turns a failure into a failed generation.  This
saves every small op the wake-up of the thread that started it.

Small ops (allreduces, reduces and broadcasts of at most ``EXPRESS_BYTES``, barriers) skip the
engine's op machinery altogether: they take the *express* path
(:mod:`.express` between two nodes, :mod:`.express_tree` up and down tree 0 beyond; decided
from the op alone so all nodes agree), posted the same way, with ``ExpressBase.wait`` in place
of ``engine.wait`` for a slow one.

One ``NodeEngine`` per generation: an aborted engine is dead by contract, so a new
generation builds a new one on the same listen address once the old one has closed
(``Worker.engine_slot``).  Hence one multi-node communicator per worker at a time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from fireflyer.core.errors import FireFlyerError, InvalidArgument
from fireflyer.core.log import get_logger

from . import kernels
from ._op import fp_wire
from .errors import CollectiveTimeout, FingerprintMismatch, HFReduceError, PeerLost
from .express import ExpressBase, XOp
from .express import eligible as express_eligible
from .opexec import OpPlan, _WorkBuffers, broadcast_words, execute, may_post, scatter_into, wire_layout
from .protocol import Channel, Done, Failed, Hello, Submit, encode
from .settings import WorkerSettings
from .shm import Segment
from .telemetry import OpRecord
from .types import Fingerprint, OpStats

__all__ = ["NodeComm", "RankConn", "CommHost"]

log = get_logger(__name__)


class CommHost(Protocol):
    """What a :class:`NodeComm` needs of the :class:`~fireflyer.hfreduce.worker.Worker` that
    serves it (the worker is above this module: it makes its communicators and hands itself over)."""

    settings: WorkerSettings
    node_rank: int
    peers: list[str]
    zones: list[str] | None
    chunk_bytes: int
    threads: int
    engine_slot: threading.Lock
    tracing: bool

    def retire(self, comm: NodeComm) -> None: ...

    def ring_begin(self, rec: OpRecord) -> OpRecord: ...

    def ring_record(self, comm: NodeComm, seq: int) -> OpRecord | None: ...

    def ring_end(self, comm: NodeComm, seq: int, phase: str, *, error: str = "") -> OpRecord | None: ...

    def ring_pending(self, comm: NodeComm) -> list[int]: ...

    def span(self, comm: NodeComm, sub: Submit, seq: int) -> contextlib.AbstractContextManager[Any]: ...

    def span_after(self, comm: NodeComm, sub: Submit, seq: int, started_at: float, rec: OpRecord | None) -> None: ...

#: ops of at most this many bytes run on the thread of the rank whose submit completed them
#: when no op is running (:meth:`NodeComm.submit`): the hand-off to the op thread, a
#: condition wake-up that costs ~50 µs on a 2-core VM, was a large share of a small op's
#: latency.  Larger ops go to the op thread, so a rank's reader never blocks for long.
FAST_OP_BYTES = 64 << 10

#: a posted small op still running after this long gets its deadline enforced by the op thread
#: (``engine.wait``); quicker ones never wake it
WATCH_S = 0.1
#: the engine waits this much longer than the op deadline, so that a node whose local rank
#: did not arrive (it fails exactly at the deadline, with the precise reason) aborts the
#: other nodes before their engines time out with the vaguer "node N sent nothing"
ENGINE_SLACK_S = 0.5
KINDS = ("allreduce", "reduce", "broadcast", "barrier", "allgather", "reduce_scatter")
#: the ops with an output buffer apart from their input (Submit.out_seg)
PAIRED = ("allgather", "reduce_scatter")


class RankConn:
    """One connected rank: its channel, its registered segments, its communicator."""

    def __init__(self, chan: Channel) -> None:
        self.chan = chan
        self.hello: Hello | None = None
        self.comm: NodeComm | None = None
        self.segments: dict[int, Segment] = {}
        self.said_bye = False

    def send(self, msg: Any) -> None:
        self.send_encoded(encode(msg))

    def send_encoded(self, data: bytes) -> None:
        try:
            self.chan.send_encoded(data)
        except OSError:
            pass  # the rank is gone; its reader thread reports that

    def label(self) -> str:
        h = self.hello
        return f"local rank {h.local_rank} (rank {h.rank}, pid {h.pid})" if h else "an unidentified rank"


class NodeComm:
    """One generation of a communicator on this node; see the module docs."""

    def __init__(self, worker: CommHost, key: str, generation: int, first: Hello) -> None:
        self.worker = worker
        self.key = key
        self.generation = generation
        self.K = first.local_world_size
        self.world_size = first.world_size
        self.nnodes = first.nnodes
        self.node_rank = worker.node_rank
        self.timeout_s = first.timeout_s or worker.settings.timeout_s
        self.conns: dict[int, RankConn] = {}
        self.global_rank: dict[int, int] = {}
        self.left: set[int] = set()
        self.submits: dict[int, dict[int, tuple[Submit, float, float]]] = {}
        #: guards the fields below; entered directly (``with self._lock``) on the per-op paths, where
        #: the Python-level Condition.__enter__/__exit__ wrappers cost more; ``cond`` waits on it
        self._lock = threading.RLock()
        self.cond = threading.Condition(self._lock)
        self.error: FireFlyerError | None = None
        #: ``error`` is a failure (:meth:`fail`), not a clean close: the engine is aborted with it
        #: before it is closed
        self.failed = False
        self.next_seq = 0
        #: an op is running (on the op thread, or on a rank's thread: see submit)
        self.busy = False
        #: the engine is connected (several nodes) and ops may run on ranks' threads
        self.ready = False
        #: ops run on a rank's thread (see submit), for Worker.info and the tests
        self.fast_ops = 0
        #: of those, the ops that were posted: released and ended by the thread that completed them
        self.posted_ops = 0
        #: of those, the ops that took the express path (:mod:`.express`, :mod:`.express_tree`)
        self.express_ops = 0
        #: the lean path of small ops (set once the engine is connected)
        self.express: ExpressBase | None = None
        self.closing = False
        self.engine: Any = None
        self.scratch = _WorkBuffers()
        #: the posted op in flight: (seq, deadline_s, posted at)
        self._posted: tuple[int, float, float] | None = None
        #: the last posted op whose deadline the op thread enforced (see _wait_for_op)
        self._watched = -1
        self._tls = threading.local()
        self.writer = ThreadPoolExecutor(1, thread_name_prefix=f"hfr-wb-{key}")
        self.thread = threading.Thread(target=self._run, name=f"hfr-comm-{key}#{generation}", daemon=True)
        self.thread.start()

    # -- membership -------------------------------------------------------------------------------

    def join(self, conn: RankConn, hello: Hello) -> None:
        for what, ours, theirs in (("world_size", self.world_size, hello.world_size),
                                   ("local_world_size", self.K, hello.local_world_size),
                                   ("nnodes", self.nnodes, hello.nnodes)):
            if ours != theirs:
                raise InvalidArgument(f"{conn.label()} joins communicator {self.key!r} with {what}={theirs}, "
                                      f"but its other ranks said {ours}", comm=self.key)
        if not 0 <= hello.local_rank < self.K:
            raise InvalidArgument(f"local rank {hello.local_rank} out of range for local_world_size {self.K}")
        with self.cond:
            if hello.local_rank in self.conns:
                raise InvalidArgument(f"local rank {hello.local_rank} already joined communicator {self.key!r} "
                                      f"on node {self.node_rank} (two processes with the same FF_LOCAL_RANK?)")
            self.conns[hello.local_rank] = conn
            self.global_rank[hello.local_rank] = hello.rank
            self.cond.notify_all()

    def leave(self, conn: RankConn, *, died: bool) -> None:
        """A rank disconnected: a death fails the communicator; a clean close retires it."""
        lr = conn.hello.local_rank if conn.hello else -1
        with self.cond:
            self.left.add(lr)
            pending = sorted(s for s, subs in self.submits.items() if subs)
            all_left = len(self.left) >= len(self.conns)
            closed = all_left and not died and not pending
            if closed:
                # set with ``left`` under one lock: a rank's new hello that sees it left must also see
                # the communicator closing (else it is "re-created" and failed, a warning for nothing)
                self.closing = True  # the op thread says goodbye to the other nodes, then stops
                self.cond.notify_all()
        if died or pending:
            what = "disconnected without closing the communicator (the process died?)" if died \
                else "closed the communicator"
            seq = pending[0] if pending else self.next_seq
            self.fail(PeerLost(f"{conn.label()} of node {self.node_rank} {what}; communicator {self.key!r} "
                               f"op #{seq} cannot complete", node=self.node_rank, peer=f"rank {self.global_rank.get(lr)}",
                               phase="waiting_ranks", seq=seq, comm=self.key))
        if not died:
            log.debug("hfreduce.rank_closed", comm=self.key, generation=self.generation, rank=conn.label())
        if closed:
            log.info("hfreduce.comm_closed", comm=self.key, generation=self.generation, node=self.node_rank)
        elif all_left:
            self.shutdown()

    # -- ops --------------------------------------------------------------------------------------

    def submit(self, conn: RankConn, sub: Submit) -> None:
        lr = conn.hello.local_rank  # type: ignore[union-attr]
        now_wall, now_mono = time.time(), time.monotonic()
        fast, subs = False, {}
        with self._lock:
            err = self.error
            if err is None and self.left:
                err = HFReduceError(f"communicator {self.key!r} on node {self.node_rank} is closing: local ranks "
                                    f"{sorted(self.left)} left it", comm=self.key, seq=sub.seq)
            if err is None:
                self.submits.setdefault(sub.seq, {})[lr] = (sub, now_wall, now_mono)
                rec = self.worker.ring_record(self, sub.seq)
                if rec is None:
                    rec = self.worker.ring_begin(OpRecord(
                        comm=self.key, generation=self.generation, seq=sub.seq, kind=sub.kind, op=sub.op,
                        dtype=sub.dtype, count=sub.count, node_rank=self.node_rank, started_at=now_wall))
                rec.arrivals[lr] = now_wall
                arrived = self.submits[sub.seq]
                rec.missing = [r for r in range(self.K) if r not in arrived]
                fast = self._may_run_fast(sub.seq, arrived)
                if fast:
                    self.busy = True
                    self.fast_ops += 1
                    subs = dict(arrived)
                elif not self.busy:
                    # (while an op runs, its thread looks at the next op when it ends: _run_op)
                    self.cond.notify_all()
        if err is None:
            if fast:  # outside the lock: other ranks' submits and the releasing thread need it
                self._run_fast(sub.seq, subs)
            return
        conn.send(Failed(seq=sub.seq, error=err.to_dict()))

    def _run_fast(self, seq: int, subs: dict[int, tuple[Submit, float, float]]) -> None:
        """Run small op ``seq`` on this thread (claimed with ``busy``), and the small ops whose
        last submit arrived meanwhile (the ranks are released before ``busy`` clears, so their
        next submits often do).

        An op that is posted (:meth:`_run_op`) ends on the thread that completes it, which
        comes back here for the next one.  When that thread is this one (the op completed
        inside the post), the completion only hands the next op to the loop below, so a
        stream of ops never nests calls.
        """
        tls = self._tls
        if getattr(tls, "driving", False):
            tls.handed = (seq, subs)
            return
        tls.driving, tls.handed = True, None
        posted = False
        try:
            with self._failing_on_error():
                nxt: tuple[int, dict[int, tuple[Submit, float, float]]] | None = (seq, subs)
                while nxt is not None:
                    seq, posted = nxt[0], False
                    if self._express_subs(nxt[1]):
                        nxt = self._run_express(*nxt)
                    else:
                        nxt = self._run_op(*nxt, chain=True)
                    if nxt is None:
                        nxt, tls.handed = tls.handed, None
                        posted = nxt is None and self._posted is not None
        finally:
            tls.driving = False
            with self.cond:
                if self.busy and self.next_seq <= seq and not posted:  # failed before it was released
                    self.busy = False
                    self.cond.notify_all()

    def _failing_on_error(self) -> _FailingOnError:
        """Turn an op-running thread's errors into a failed generation (every rank raises);
        ``_Stop`` (already failed) ends quietly, ``_Closing`` passes through."""
        return _FailingOnError(self)

    def fail(self, err: FireFlyerError) -> None:
        """Fail every pending and future op of this generation, here and (via the engine) on other nodes."""
        with self.cond:
            if self.error is not None:
                return
            self.error = err
            self.failed = True
            pending = {seq: dict(subs) for seq, subs in self.submits.items()}
            self.submits.clear()
            conns = dict(self.conns)
            self.cond.notify_all()
        log.warning("hfreduce.comm_failed", comm=self.key, generation=self.generation, error=str(err))
        engine = self.engine
        if engine is not None:
            try:
                engine.abort(str(err))
            except Exception as e:  # noqa: BLE001 - aborting must not raise over the original error
                log.warning("hfreduce.engine_abort_failed", error=str(e))
        body = err.to_dict()
        for seq in sorted(pending):
            for lr in pending[seq]:
                conns[lr].send(Failed(seq=seq, error=body))
            self.worker.ring_end(self, seq, "failed", error=str(err))
        # the op already running (taken from ``submits``) ends here too: its record is the evidence a
        # health service needs of what this node saw when the generation failed (an abort by coord
        # can come before the op's own deadline, and the running thread then ends without a record)
        for seq in self.worker.ring_pending(self):
            self.worker.ring_end(self, seq, "failed", error=str(err))

    def shutdown(self) -> None:
        with self.cond:
            if self.error is None:
                self.error = HFReduceError(f"communicator {self.key!r} was closed", comm=self.key)
            self.cond.notify_all()

    def _run(self) -> None:
        try:
            with self._failing_on_error():
                if self.nnodes > 1:
                    self.start_engine()
                with self.cond:
                    self.ready = True
                while True:
                    seq, subs, watch = self._wait_for_op()
                    if watch is not None:
                        self._watched = seq
                        if watch[0] == "x":
                            self.express.wait(seq, watch[1])  # type: ignore[union-attr]
                        else:
                            self.engine.wait(*watch)  # returns once it completed; raises its failure
                        continue
                    if self._express_subs(subs):
                        self._run_express(seq, subs)
                    else:
                        self._run_op(seq, subs)
        except _Closing:
            self._close_handshake()
        finally:
            engine, self.engine = self.engine, None
            if engine is not None:
                try:
                    if self.failed:  # (fail() aborts it too, but may not have yet: the peers must get
                        engine.abort(str(self.error))  # the reason, not "closed its engine")
                    engine.close()
                except Exception as e:  # noqa: BLE001
                    log.warning("hfreduce.engine_close_failed", error=str(e))
                self.worker.engine_slot.release()
            self.writer.shutdown(wait=True)
            self.worker.retire(self)

    def _close_handshake(self) -> None:
        """Every local rank closed cleanly: one last engine op before the engine closes.

        Closing an engine aborts its peers, so a node whose ranks finish first would fail
        the last op still draining on another node.  A ``close`` collective completes
        only once every node has finished all ops, after which closing is harmless.  A
        node that instead runs another op fails with a fingerprint mismatch naming
        ``close``: its ranks learn that this node's ranks left.
        """
        with self.cond:
            self.error = self.error or HFReduceError(f"communicator {self.key!r} was closed", comm=self.key)
        if self.engine is None:
            return
        fp = Fingerprint(comm=self.key, seq=self.next_seq, op="sum", dtype="int32", count=1, kind="close")
        try:
            if self.express is not None:  # (the peer's express frame for this op number: a mismatch)
                self.express.engine_op(fp.seq, fp)
            self.engine.allreduce(np.zeros(1, np.int32), "sum", fp, deadline_s=min(self.timeout_s, 30.0))
        except HFReduceError as e:
            log.info("hfreduce.close_handshake_failed", comm=self.key, error=str(e))

    def _wait_for_op(self) -> tuple[int, dict[int, tuple[Submit, float, float]], tuple[Any, float] | None]:
        """Block until every local rank submitted op ``next_seq`` and claim it (``busy``).

        A small op whose last submit finds no op running is claimed and run by that rank's
        thread instead (:meth:`submit`); this thread then only keeps the deadline of ops
        whose ranks are still arriving, and of a posted op still running after ``WATCH_S``:
        for that one it returns ``(seq, {}, (state, deadline_s))``, for ``engine.wait``."""
        with self.cond:
            while True:
                if self.error is not None:
                    raise _Stop
                seq = self.next_seq
                subs = self.submits.get(seq)
                p = self._posted
                if self.busy and p is not None and p[0] != self._watched and (
                        time.monotonic() - p[2] >= WATCH_S or self.engine.failed is not None):
                    if self.express is not None and self.express.running(p[0]):
                        return p[0], {}, ("x", p[1])
                    st = self.engine.current(p[0])
                    if st is not None:  # (None: it is still being posted; look again shortly)
                        return p[0], {}, (st, p[1])
                if self.busy or not subs:
                    if self.closing and not self.busy and not subs:
                        raise _Closing
                    self.cond.wait(WATCH_S if self.busy else 0.5)
                    continue
                if len(subs) == self.K:
                    self.busy = True
                    return seq, dict(subs), None
                first = min(m for _, _, m in subs.values())
                timeout = next(iter(subs.values()))[0].timeout_s or self.timeout_s
                left = max(first, self._prev_end) + timeout - time.monotonic()
                if left > 0:
                    # (at most 0.5 s: the last rank's thread may post the op meanwhile without waking
                    # this one, which must then watch it)
                    self.cond.wait(min(left, 0.5))
                    continue
                missing = [r for r in range(self.K) if r not in subs]
                names = ", ".join(f"local rank {r} (rank {self.global_rank[r]})" if r in self.global_rank
                                  else f"local rank {r} (never connected)" for r in missing)
                raise CollectiveTimeout(
                    f"op #{seq} of communicator {self.key!r}: {names} of node {self.node_rank} did not submit it "
                    f"within {timeout:g} s (local ranks {sorted(subs)} did)", node=self.node_rank,
                    peer=",".join(str(self.global_rank.get(r, f'local {r}')) for r in missing),
                    phase="waiting_ranks", seq=seq, missing=",".join(map(str, missing)), waited_s=timeout,
                    comm=self.key)

    _prev_end = 0.0

    def _run_op(self, seq: int, subs: dict[int, tuple[Submit, float, float]], *,
                chain: bool = False) -> tuple[int, dict[int, tuple[Submit, float, float]]] | None:
        """Run op ``seq``; with ``chain``, claim and return the next op if it may run on this thread."""
        ordered = [subs[r][0] for r in range(self.K)]
        self._check_fingerprints(seq, ordered)
        s0 = ordered[0]
        rec = self.worker.ring_record(self, seq)
        views = self._views(seq, ordered)
        dtype = kernels.dtype_from_name(s0.dtype) if s0.kind != "barrier" else _I32
        root_local = self._local_rank_of(s0.root)
        if s0.kind == "broadcast" and self.engine is None and root_local is None:
            raise HFReduceError(f"broadcast root {s0.root} is not a rank of this node", seq=seq)
        fp = self._fingerprint(seq, s0, dtype)
        if self.express is not None:  # (the peer must not have sent this op express: a mismatch)
            self.express.engine_op(seq, fp)
        outs = self._out_views(seq, ordered, dtype) if s0.kind in PAIRED else []
        plan = OpPlan(kind=s0.kind, op=s0.op, dtype=dtype, count=s0.count, views=views,
                      world_size=self.world_size, root_local=root_local,
                      chunk_bytes=self.worker.chunk_bytes, threads=self.worker.threads, outs=outs,
                      ranks=[self.global_rank[r] for r in range(self.K)], node_rank=self.node_rank,
                      nnodes=self.nnodes)
        if rec is not None:
            rec.nbytes = max(s0.count, s0.out_count) * dtype.itemsize
        timeout = s0.timeout_s or self.timeout_s
        start = max(min(m for _, _, m in subs.values()), self._prev_end)
        deadline_s = max(0.1, start + timeout + ENGINE_SLACK_S - time.monotonic())

        def on_phase(phase: str) -> None:
            if rec is not None:
                rec.phase = phase

        # a small op is posted, not waited for: the thread that completes it releases the ranks and
        # ends it (_finish), and this one goes back at once to reading its rank (or, the op thread,
        # to keeping deadlines); with tracing on it waits, so that the op's span covers it
        post = self._postable(s0, dtype)

        def release(stats: OpStats | None, times: dict[str, float]) -> None:
            """The result is in every rank's buffer: tell the ranks (on the thread that finished it)."""
            with self._lock:
                if self.error is not None:
                    return  # failed while running (a rank died): the ranks already have the error
                # no longer pending: a rank that closes as soon as it is released must not look like
                # it left in the middle of this op (leave() fails the communicator for that)
                self.submits.pop(seq, None)
            if rec is not None:
                rec.local_reduce_s, rec.tree_s, rec.writeback_s = (times["local_reduce_s"], times["tree_s"],
                                                                   times["writeback_s"])
                rec.stats = stats
            self._tell_ranks(seq, ordered)
            if post:
                nxt = None
                with self._failing_on_error():
                    # an engine thread may run the next op only if it can post it too: waiting
                    # for an op here would block the thread that must receive its data
                    nxt = self._finish(seq, chain=True, postable=True)
                if nxt is not None:
                    self._run_fast(*nxt)

        if post:
            with self._lock:
                self._posted = (seq, deadline_s, time.monotonic())
                self.posted_ops += 1
            execute(plan, engine=self.engine, fp=fp, deadline_s=deadline_s, scratch=self.scratch,
                    writer=self.writer, on_phase=on_phase, on_done=release, post=True)
            return None
        with self.worker.span(self, s0, seq) as span:
            ran = execute(plan, engine=self.engine, fp=fp, deadline_s=deadline_s, scratch=self.scratch,
                          writer=self.writer, on_phase=on_phase, on_done=release)
            assert ran is not None
            if span is not None:
                for k, v in ran[1].items():
                    span.set_attribute(f"hfreduce.{k}", v)
        return self._finish(seq, chain)

    def _views(self, seq: int, ordered: list[Submit]) -> list[np.ndarray]:
        """Each local rank's buffer of op ``seq`` (a view of its registered segment)."""
        views = []
        for r, sub in enumerate(ordered):
            conn = self.conns[r]
            if sub.count == 0 or sub.kind == "barrier":
                views.append(_empty(sub.dtype))
                continue
            seg = conn.segments.get(sub.seg)
            if seg is None:
                raise HFReduceError(f"{conn.label()} submitted op #{seq} on unknown segment {sub.seg}", seq=seq)
            views.append(seg.array(kernels.dtype_from_name(sub.dtype), sub.count, sub.offset))
        return views

    def _out_views(self, seq: int, ordered: list[Submit], dtype: np.dtype) -> list[np.ndarray]:
        """Each local rank's output buffer of allgather / reduce_scatter ``seq``, its size checked
        against the input's and the world size (the client checks it too, before it submits)."""
        s0 = ordered[0]
        want = s0.count * self.world_size if s0.kind == "allgather" else s0.count // self.world_size
        if s0.kind == "reduce_scatter" and s0.count % self.world_size:
            raise InvalidArgument(f"{s0.kind}#{seq}: the input's {s0.count} elements are not a multiple of the "
                                  f"world size {self.world_size}", seq=seq, comm=self.key)
        if s0.kind == "allgather" and self.nnodes > 1 and any(
                self.global_rank[r] != self.node_rank * self.K + r for r in range(self.K)):
            # (a node's ranks' blocks must be one contiguous range of the output: see opexec)
            raise InvalidArgument(f"allgather across nodes needs global rank = node rank x {self.K} + local rank "
                                  f"(as ff launch assigns them); node {self.node_rank} has ranks "
                                  f"{[self.global_rank[r] for r in range(self.K)]}", seq=seq, comm=self.key)
        views = []
        for r, sub in enumerate(ordered):
            if sub.out_count != want:
                raise InvalidArgument(f"{self.conns[r].label()}: {s0.kind}#{seq} output has {sub.out_count} "
                                      f"elements, expected {want}", seq=seq, comm=self.key)
            if want == 0:
                views.append(np.empty(0, dtype))
                continue
            seg = self.conns[r].segments.get(sub.out_seg)
            if seg is None:
                raise HFReduceError(f"{self.conns[r].label()} submitted op #{seq} on unknown segment "
                                    f"{sub.out_seg}", seq=seq)
            views.append(seg.array(dtype, want, sub.out_offset))
        return views

    def _tell_ranks(self, seq: int, ordered: list[Submit]) -> None:
        """Op ``seq`` is done and its result in every rank's buffer: end its record, release the ranks."""
        done_rec = self.worker.ring_end(self, seq, "done")
        plain = None  # (the record only to a rank that asked for it: see Submit.record)
        for r in range(self.K):
            if ordered[r].record:
                self.conns[r].send(Done(seq=seq, record=done_rec))
            else:
                plain = plain or encode(Done(seq=seq))  # one encoding for all the ranks
                self.conns[r].send_encoded(plain)

    # -- the express path (small ops: .express, .express_tree) ----------------------------------

    def _express_subs(self, subs: dict[int, tuple[Submit, float, float]]) -> bool:
        """Does the op of these submits take the express path?  (Local rank 0's says: ranks that
        disagree fail on their fingerprints either way.)"""
        return self.express is not None and bool(subs) and self._goes_express(subs[min(subs)][0])

    def _goes_express(self, sub: Submit) -> bool:
        """Does op ``sub`` take the express path?  (The same answer on both nodes: the op decides.)"""
        if self.express is None:
            return False
        try:  # (a barrier names no dtype of its own: it is an exchange of nothing)
            return express_eligible(sub.kind, _I32 if sub.kind == "barrier" else kernels.dtype_from_name(sub.dtype),
                                    sub.count)
        except FireFlyerError:
            return False  # it fails on its dtype wherever it runs

    def _run_express(self, seq: int, subs: dict[int, tuple[Submit, float, float]]) -> None:
        """Start express op ``seq`` (claimed with ``busy``); whichever thread gets the peer's partial
        finishes it (:meth:`_express_done`).  Returns None: a next op is chained from there."""
        assert self.express is not None
        ordered = [subs[r][0] for r in range(self.K)]
        self._check_fingerprints(seq, ordered)
        s0 = ordered[0]
        t = time.perf_counter()
        op = self._express_op(seq, s0, ordered)
        local_s = time.perf_counter() - t
        rec = self.worker.ring_record(self, seq)
        if rec is not None:
            rec.phase = "exchange"
            rec.nbytes = 0 if s0.kind == "barrier" else s0.count * kernels.dtype_from_name(s0.dtype).itemsize
        op.local_s = local_s
        scatter = None
        if s0.kind == "reduce_scatter":  # the whole result lands in ``ours``: each rank's slice from it
            outs, ranks = self._out_views(seq, ordered, kernels.dtype_from_name(s0.dtype)), \
                [self.global_rank[r] for r in range(self.K)]

            def scatter(x: XOp) -> None:
                scatter_into(outs, ranks, s0.count // self.world_size, x.ours, 0, s0.count)
        op.ctx = (ordered, rec, scatter)
        timeout = s0.timeout_s or self.timeout_s
        start = max(min(m for _, _, m in subs.values()), self._prev_end)
        with self._lock:
            # (the op thread watches it once slow, with the engine path's deadline and slack)
            self._posted = (seq, max(0.1, start + timeout + ENGINE_SLACK_S - time.monotonic()), time.monotonic())
            self.posted_ops += 1
            self.express_ops += 1
        self.express.start(op)

    def _fingerprint(self, seq: int, s0: Submit, dtype: np.dtype, *, express: bool = False) -> Fingerprint:
        """What op ``seq`` is, as every node must agree on it, on the engine and the express path alike.

        An allreduce or reduce names the engine's op and count and the ranks' dtype: a node
        reducing bfloat16 and one reducing float32 carry the same float32 partials, and only the
        fingerprint tells them apart.  A broadcast names op ``copy`` and the ranks' dtype and
        count, not the int32 words a small one travels as: three float16 and four are both two
        words, and a node would take the other's bytes with two zero bytes added.  A barrier is
        the engine's one int32 (on the ``express`` path, no data: count 0).  A reduce or broadcast
        names its root: nodes that disagree on it would run the same bytes and end with the
        result in different places.
        """
        kind = s0.kind
        if kind == "broadcast":
            op, named, count = "copy", dtype, s0.count
        elif kind in PAIRED:  # (the input's count: the output's follows from it and the world size)
            op, named, count = ("gather" if kind == "allgather" else s0.op), dtype, s0.count
        else:
            op, wdt, count = wire_layout(kind, s0.op, dtype, s0.count)
            named = dtype if kind in ("allreduce", "reduce") else wdt
        return Fingerprint(comm=self.key, seq=seq, op=op, dtype=kernels.dtype_name(named),
                           count=0 if kind == "barrier" and express else count, kind=kind,
                           root=s0.root if kind in ("reduce", "broadcast") else -1)

    def _local_rank_of(self, root: int) -> int | None:
        """The local rank of global rank ``root`` on this node (None: another node's, or no root)."""
        return None if root < 0 else next((r for r, g in self.global_rank.items() if g == root), None)

    def _express_op(self, seq: int, s0: Submit, ordered: list[Submit]) -> XOp:
        """Express op ``seq``: this node's partial made (the local reduce) and where the result goes.

        - allreduce: the ranks' reduce, into rank 0's buffer when it can; every buffer gets the result;
        - reduce: the ranks' reduce into scratch (the other ranks' buffers stay as they were); only
          the root's buffer, if it is on this node, gets the result;
        - broadcast: as on the engine path (``opexec``), an int32 sum of the buffer's bytes as words,
          the root's node giving them and every other node zeros; every buffer but the root's gets them;
        - barrier: an empty partial (its frames say only that this node's ranks are all in).
        """
        kind = s0.kind
        barrier = kind == "barrier"
        views = [] if barrier else self._views(seq, ordered)
        dtype = _I32 if barrier else kernels.dtype_from_name(s0.dtype)
        _, _, wcount = wire_layout(kind, s0.op, dtype, s0.count)
        fpw = fp_wire(self._fingerprint(seq, s0, dtype, express=True))
        root = self._local_rank_of(s0.root)
        done = self._express_done
        if barrier:
            return XOp(seq, fpw, np.zeros(0, _I32), [], narrow=False, redop="sum", divisor=1, on_done=done)
        if kind == "broadcast":
            raw = [v.view(np.uint8) for v in views]
            words = broadcast_words(self.scratch, None if root is None else raw[root], wcount)
            return XOp(seq, fpw, words, [r for i, r in enumerate(raw) if i != root], narrow=False, redop="sum",
                       divisor=1, on_done=done, result=words.view(np.uint8)[:s0.count * dtype.itemsize])
        carried = kernels.carried_dtype(dtype)
        narrow = carried != dtype
        redop = "sum" if s0.op == "avg" else s0.op
        divisor = self.world_size if s0.op == "avg" else 1
        if kind in ("reduce", "reduce_scatter"):  # (a reduce_scatter's slices: _express_done scatters them)
            ours = self.scratch.get(carried, s0.count)
            kernels.reduce_into(ours, views, redop, threads=1)
            out = [views[root]] if root is not None and kind == "reduce" else []
            return XOp(seq, fpw, ours, out, narrow=narrow, redop=redop, divisor=divisor, on_done=done)
        ours = self.scratch.get(carried, s0.count) if narrow else views[0]
        if narrow or self.K > 1:  # our partial: the ranks' reduce (into rank 0's buffer when it can)
            kernels.reduce_into(ours, views, redop, threads=1)
        return XOp(seq, fpw, ours, views, narrow=narrow, redop=redop, divisor=divisor, on_done=done)

    def _express_done(self, op: XOp) -> None:
        """Express op ``op`` is in every rank's buffer (on the thread that finished it): record,
        release, and run the next op if its ranks are all in and it may run here."""
        seq = op.seq
        ordered, rec, scatter = op.ctx
        with self._lock:
            if self.error is not None:
                return  # failed meanwhile: the ranks have the error
            self.submits.pop(seq, None)
        if rec is not None:
            assert self.express is not None
            rec.local_reduce_s, rec.tree_s = op.local_s, time.monotonic() - op.t0
            rec.stats = self.express.stats(op)
        if scatter is not None:
            with self._failing_on_error():
                scatter(op)
            if self.error is not None:
                return
        if self.worker.tracing:
            self.worker.span_after(self, ordered[0], seq, op.started_at, rec)
        self._tell_ranks(seq, ordered)
        nxt = None
        with self._failing_on_error():
            nxt = self._finish(seq, chain=True, postable=True)
        if nxt is not None:
            self._run_fast(*nxt)

    def _finish(self, seq: int, chain: bool, *,
                postable: bool = False) -> tuple[int, dict[int, tuple[Submit, float, float]]] | None:
        """Op ``seq`` ended (its ranks are released): the next op may run.  With ``chain``,
        claim and return the next op if it may run on this thread (with ``postable``: only
        if it would be posted)."""
        self._prev_end = time.monotonic()
        # busy until here, not just until the ranks are released: the engine runs one op at a time
        with self._lock:
            if self.error is not None:
                raise _Stop
            self.submits.pop(seq, None)
            self.next_seq = seq + 1
            self.busy = False
            if self._posted is not None and self._posted[0] == seq:
                self._posted = None
            nxt = self.submits.get(seq + 1)
            if chain and nxt and self._may_run_fast(seq + 1, nxt) and (
                    not postable or self._postable(nxt[min(nxt)][0])):
                self.busy = True
                self.fast_ops += 1
                return seq + 1, dict(nxt)
            if nxt or self.closing:
                self.cond.notify_all()  # the op thread waits for the next op (or to close)
        return None

    def _may_run_fast(self, seq: int, arrived: dict[int, tuple[Submit, float, float]]) -> bool:
        """Under the lock: op ``seq`` is complete, next, small, and nothing runs (see submit)."""
        return (len(arrived) == self.K and seq == self.next_seq and self.ready and not self.busy
                and not self.closing and self.error is None and _nbytes(arrived[min(arrived)][0]) <= FAST_OP_BYTES)

    def _postable(self, sub: Submit, dtype: np.dtype | None = None) -> bool:
        """Would op ``sub`` (of ``dtype``, if already known) be posted, not waited for? (See _run_op.)"""
        if self.engine is None:
            return False
        if self._goes_express(sub):
            return True  # (tracing or not: the path must be the op's, see _goes_express)
        if self.worker.tracing:
            return False
        if dtype is None:
            try:
                dtype = kernels.dtype_from_name(sub.dtype) if sub.kind != "barrier" else _I32
            except FireFlyerError:
                return False  # it fails on its dtype wherever it runs
        return may_post(sub.kind, sub.op, dtype, sub.count, self.engine)

    def _check_fingerprints(self, seq: int, subs: list[Submit]) -> None:
        def fp(s: Submit) -> str:
            root = f", root {s.root}" if s.kind in ("reduce", "broadcast") else ""
            return f"{s.kind}#{seq}({s.op}, {s.dtype}, {s.count} el{root})"

        for r, s in enumerate(subs[1:], start=1):
            a, b = subs[0], s
            if (a.kind, a.op, a.dtype, a.count, a.root) != (b.kind, b.op, b.dtype, b.count, b.root):
                g0, g1 = self.global_rank[0], self.global_rank[r]
                raise FingerprintMismatch(
                    f"collective mismatch in communicator {self.key!r} on node {self.node_rank}: rank {g0} "
                    f"(local 0) runs {fp(a)} but rank {g1} (local {r}) runs {fp(b)}; every rank must issue the "
                    f"same collectives in the same order", node=self.node_rank, peer=f"rank {g1}",
                    ours=fp(a), theirs=fp(b), seq=seq, comm=self.key)

    def start_engine(self) -> None:
        """Build and connect this generation's NodeEngine (several nodes only)."""
        from .engine import NodeEngine

        w = self.worker
        if not w.engine_slot.acquire(timeout=self.timeout_s):
            raise HFReduceError(f"node {self.node_rank}: the previous communicator's engine did not close "
                                f"within {self.timeout_s:g} s", node=self.node_rank)
        try:
            eng = NodeEngine(node_rank=self.node_rank, addresses=w.peers, zones=w.zones, token=w.settings.token,
                             chunk_bytes=w.chunk_bytes, timeout_s=self.timeout_s + ENGINE_SLACK_S,
                             block_bytes=w.settings.block_bytes, streaming=w.settings.stream,
                             sock_buf_bytes=w.settings.sock_buf_bytes, tcp_congestion=w.settings.congestion_prefs,
                             send_buf_bytes=w.settings.send_buf_bytes, express_poll_s=w.settings.express_poll_s,
                             algorithm=w.settings.algorithm, ring_piece_bytes=w.settings.ring_piece_bytes)
            eng.start(self.timeout_s)
            log.info("hfreduce.engine_connected", node=self.node_rank, comm=self.key,
                     congestion=",".join(eng.congestion_summary()))
        except BaseException:
            w.engine_slot.release()
            raise
        eng.on_failure = self._engine_failed
        self.engine = eng
        self.express = eng.express

    def _engine_failed(self) -> None:
        """The engine failed: wake the op thread, which reports it (a posted op may have no waiter)."""
        with self.cond:
            self.cond.notify_all()


class _Stop(Exception):
    pass


class _FailingOnError:
    """:meth:`NodeComm._failing_on_error` (a class, not a generator: it wraps every small op twice)."""

    __slots__ = ("comm",)

    def __init__(self, comm: NodeComm) -> None:
        self.comm = comm

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: object) -> bool:
        if e is None or isinstance(e, _Stop):
            return True
        comm = self.comm
        if isinstance(e, FireFlyerError):
            comm.fail(e)
            return True
        if isinstance(e, _Closing) or not isinstance(e, Exception):
            return False
        # a bug: fail loudly on every rank rather than hang them
        log.error("hfreduce.op_crashed", comm=comm.key, exc_info=(et, e, tb))
        comm.fail(HFReduceError(f"HFReduce worker of node {comm.node_rank} failed: {type(e).__name__}: {e}",
                                node=comm.node_rank))
        return True


class _Closing(Exception):
    pass


def _nbytes(sub: Submit) -> int:
    if sub.kind == "barrier" or max(sub.count, sub.out_count) <= 0:
        return 0
    try:
        return max(sub.count, sub.out_count) * kernels.dtype_from_name(sub.dtype).itemsize
    except FireFlyerError:
        return 0  # the op fails on its dtype wherever it runs


def _empty(dtype: str) -> np.ndarray:
    try:
        return np.empty(0, kernels.dtype_from_name(dtype))
    except FireFlyerError:
        return np.empty(0, np.int32)


_I32 = np.dtype(np.int32)
