"""How the node worker executes one collective once every local rank has submitted it.

Data path per op (``K`` local ranks, ``n`` nodes, chunk = ``chunk_bytes``)::

    local slots --reduce_into, chunk by chunk--> node work buffer --engine (both trees)-->
        --on_final(start, stop)--> write-back thread: avg divide, cast, copy into every slot

* **Work dtype.**  float16 / bfloat16 / float8 are reduced into float32 partials, carried
  across nodes as float32 and rounded once at write-back (:func:`kernels.cast_into`):
  one rounding in total, whatever the number of nodes and ranks, and the same bits on
  every rank.  float32 / int32 / int64 travel as they are.
* **avg** is a sum everywhere, then one division by the *world size* (all ranks): float32
  true division, integer floor division (numpy semantics).  On one node the write-back
  divides; across nodes the engine's tree roots divide (``avg_divisor``) before the
  down pass, so every node gets the root's bits.
* **In place.**  For an allreduce of a float32/int dtype local rank 0's own shared
  buffer is the work buffer (the local reduce writes it, the engine sends from and
  receives into it): the write-back makes K - 1 copies, and with one local rank none.
* **reduce(root)** runs the allreduce and writes only the root's buffer; other ranks'
  buffers are left as they were.  A streamed one (below) leaves its scratch work buffer
  alone too (``discard``): the final blocks go from the cache to the children and the root's
  buffer only, where writing them to scratch read each of its lines from memory first.  64 MiB
  float32 to rank 0 on the fortieth VM, launches of the two alternating (medians of 8 ops):
  2 x 1 30.2-33.5 ms against 40.0-42.5, 2 x 4 48.6-53.4 against 55.2-61.9, 3 x 2 71.9-75.4
  against 75.6-80.6.  And on the root's node, when the root is local rank 0, the root's buffer
  is the work buffer, as rank 0's is for an allreduce: 2 x 1 25.4-27.7 ms against 30.1-31.4
  (the allreduce 24.6-27.5 in the same launches), 2 x 4 44.5-47.2 against 47.7-51.9, 4 x 1 on
  the ring 83.8-94.2 against 96.5-107.4.  (Over the ring, ``ff launch``'s choice for one rank per
  node on three or more nodes, a node's pieces live in ``work``: the other nodes still write
  scratch, and the reduce took 1.1x the allreduce's time there, 76.1-83.3 ms; over the trees
  it took 106-111 ms.)
* **broadcast(root)** is bit-exact for every dtype (NaN payloads, -0.0 included): across nodes
  it is the engine's own broadcast, the root's bytes as they are, flooded over both trees,
  each edge carrying them once (:mod:`._bcast`), into the root's buffer's twin on every node
  (rank 0's), then copied to the node's other ranks as each range lands.  (Small ones take the
  express path: an int32 sum of the bytes as zero-padded words, zeros from every node but the
  root's, :func:`broadcast_words`.)  Until the engine's broadcast larger ones went through the
  allreduce that way, moving twice the bytes: 64 MiB on the thirty-ninth VM, launches of the two
  alternating, 2 x 1 15.0-41.5 ms against 46.3-53.3, 4 x 1 40.9-51.9 against 77.3-92.4, 2 x 4
  23.3-58.5 against 35.1-58.3 (faster in 5 of 7), 3 x 2 36.2-65.8 against 53.9-78.0.
* **allgather** (ranks' inputs ``views``, outputs ``outs``): a local gather, then across ``N`` nodes
  one engine broadcast per node of its ranks' contiguous block, bit for bit; each node receives
  ``(N-1)/N`` of the output and sends as much on average (:func:`_allgather` says why not a ring).
* **reduce_scatter** is the allreduce of the input -- the same path (express, streamed trees or
  ring, fill/fuse), the same reduction order, so the same bits as ``allreduce`` then slicing --
  into scratch (the inputs stay as they are), and the write-back copies each rank's slice
  (:func:`scatter_into`).  Bytes: an allreduce's, ``2(N-1)/N`` of the input per node, twice a ring
  reduce-scatter's: bit-identity with the allreduce needs its up pass to the tree roots whole, and
  only the down pass could be trimmed to each slice's node (not done).
* **barrier** is a one-element int32 sum when there is more than one node; locally the
  arrival wait already is the barrier.

**Streamed ops** (across nodes, an allreduce or reduce whose dtype travels as it is --
float32, int32, int64 -- and is larger than the engine's inline size): the engine itself
reduces the ranks' buffers (``inputs``) and writes the result into every target
(``mirrors``), block by block in the cache, in one numba loop per tree half
(:mod:`._streamed`, :mod:`._blocks`).  Nothing below runs for them; their local-reduce
and write-back times are the loops' own.

Otherwise both ends are pipelined with the trees.  Across nodes the local reduce runs inside the
engine, chunk by chunk, so the first chunk leaves the node after one chunk of local work
instead of after the whole buffer.  In a tree where this node is a leaf, the engine's fill
thread calls ``fill`` ahead of the up thread.  In a tree where it has children, the up
thread calls ``fuse`` once the children's chunk is in: one kernel call reduces the ranks'
chunks and the children's, left to right (the bits of fill-then-reduce), reading each
input once and writing ``work`` once, where fill-then-reduce writes ``work`` and reads it
back -- on a node whose memory bandwidth is the limit, a pass saved over that half.
Write-back: the engine reports each final range through ``on_final`` and a dedicated
thread writes it to the ranks while later chunks are still in the trees, with
:func:`.copies.copy_into` (non-temporal stores, the source read once for every rank).
(Every range is read by ``fill`` or ``fuse`` before it can become final, so the
write-back never overwrites an input still to be reduced.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from . import kernels
from ._op import Fuse
from .copies import copy_into
from .types import Fingerprint, OpStats, PeerStats, TreeStats

__all__ = ["OpPlan", "broadcast_words", "execute", "may_post", "scatter_into", "wire_layout"]

_I32 = np.dtype(np.int32)


class OpPlan:
    """One op as the worker runs it: the ranks' views in local-rank order and the shape of the op.

    ``targets`` are the local-rank indices whose buffers receive the result.
    """

    __slots__ = ("kind", "op", "dtype", "count", "views", "world_size", "root_local", "chunk_bytes", "threads",
                 "outs", "ranks", "node_rank", "nnodes")

    def __init__(self, *, kind: str, op: str, dtype: np.dtype, count: int, views: Sequence[np.ndarray],
                 world_size: int, root_local: int | None, chunk_bytes: int, threads: int,
                 outs: Sequence[np.ndarray] = (), ranks: Sequence[int] = (), node_rank: int = 0,
                 nnodes: int = 1) -> None:
        self.kind = kind
        self.op = op
        self.dtype = np.dtype(dtype)
        self.count = count
        self.views = list(views)
        self.world_size = world_size
        self.root_local = root_local
        self.chunk_bytes = chunk_bytes
        self.threads = threads
        #: allgather / reduce_scatter: each local rank's output buffer (``views`` are the inputs)
        self.outs = list(outs)
        #: each local rank's global rank
        self.ranks = list(ranks)
        self.node_rank = node_rank
        self.nnodes = nnodes


def wire_layout(kind: str, op: str, dtype: np.dtype, count: int) -> tuple[str, np.dtype, int]:
    """(op, dtype, element count) an op travels as through an allreduce; identical on every node.

    A broadcast's is the express path's int32 words (:func:`broadcast_words`); across nodes
    otherwise a broadcast is the engine's own and moves the ranks' bytes as they are."""
    dt = np.dtype(dtype)
    if kind == "broadcast":
        return "sum", _I32, -(-count * dt.itemsize // 4)
    if kind == "barrier":
        return "sum", _I32, 1
    return op, kernels.carried_dtype(dt), count


Engine = Any  # NodeEngine; typed loosely so this module imports without it


class _WorkBuffers:
    """A grow-only scratch buffer per dtype, reused op after op (no page faults per op)."""

    def __init__(self) -> None:
        self._bufs: dict[np.dtype, np.ndarray] = {}

    def get(self, dtype: np.dtype, count: int, *, zero: bool = False) -> np.ndarray:
        buf = self._bufs.get(dtype)
        if buf is None or buf.size < count:
            buf = np.empty(max(count, 1), dtype=dtype)
            self._bufs[dtype] = buf
        out = buf[:count]
        if zero:
            out[...] = 0
        return out


def broadcast_words(scratch: _WorkBuffers, src: np.ndarray | None, words: int) -> np.ndarray:
    """What a node contributes to a broadcast's int32 sum (:func:`wire_layout`): on the root's node
    the root's bytes ``src`` (uint8), zero-padded to ``words`` whole words; zeros on every other."""
    work = scratch.get(_I32, words, zero=src is None)
    if src is not None:
        wbytes = work.view(np.uint8)
        wbytes[:src.nbytes] = src
        wbytes[src.nbytes:] = 0
    return work


Done = Callable[[OpStats | None, dict[str, float]], None]


def execute(plan: OpPlan, *, engine: Engine | None, fp: Fingerprint, deadline_s: float | None,
            scratch: _WorkBuffers, writer: ThreadPoolExecutor, on_phase: Callable[[str], None],
            on_done: Done | None = None, post: bool = False) -> tuple[OpStats | None, dict[str, float]] | None:
    """Run one op; returns the engine's stats (None on one node) and phase durations.

    ``on_done(stats, times)`` is called exactly once when the op succeeded and the ranks'
    buffers hold the result, before this returns: for a small op by the engine thread
    that completed it (so the worker can release its ranks without another thread
    hand-off), otherwise on this thread.

    With ``post`` the op (which must pass :func:`may_post`) is only started: this returns
    None once it is posted (``engine.post``), and ``on_done`` alone reports its completion,
    on whichever thread completes it -- possibly before this returns.
    """
    times = {"local_reduce_s": 0.0, "tree_s": 0.0, "writeback_s": 0.0}
    fired = [False]

    def done(stats: OpStats | None) -> None:
        if not fired[0]:
            fired[0] = True
            if on_done is not None:
                on_done(stats, times)

    if plan.kind == "barrier":
        stats = None
        if engine is not None:
            on_phase("tree")
            t = time.perf_counter()

            def barrier_done(s: OpStats) -> None:
                times["tree_s"] = time.perf_counter() - t
                done(s)

            work = scratch.get(_I32, 1, zero=True)
            if post:
                engine.post(work, "sum", fp, on_done=barrier_done)
                return None
            stats = engine.allreduce(work, "sum", fp, deadline_s=deadline_s, on_done=barrier_done)
    elif plan.kind == "broadcast":
        stats = _broadcast(plan, engine, fp, deadline_s, scratch, writer, on_phase, times, done, post)
    elif plan.kind == "allgather":
        stats = _allgather(plan, engine, fp, deadline_s, writer, on_phase, times)
    else:
        stats = _reduce(plan, engine, fp, deadline_s, scratch, writer, on_phase, times, done, post)
    if stats is _POSTED:
        return None
    done(stats)
    return stats, times


def may_post(kind: str, op: str, dtype: np.dtype, count: int, engine: Engine | None) -> bool:
    """Can :func:`execute` post this op (``post``) instead of waiting for it?

    Small ops across nodes whose result is written back on the engine thread that
    completes them: then nothing is left to do on the calling thread.
    """
    if engine is None or kind in ("broadcast", "allgather", "reduce_scatter"):
        # (a broadcast the express path does not take is the engine's; an allgather is several engine
        # ops; a reduce_scatter's write-back scatters after the engine op: they run on the op thread)
        return False
    _, wdt, wcount = wire_layout(kind, op, dtype, count)
    nbytes = wcount * wdt.itemsize
    return nbytes <= INLINE_WRITE_BYTES and engine.can_post(nbytes)


#: what the op functions return for a posted op (``execute`` returns None)
_POSTED: Any = object()


def _chunks(count: int, itemsize: int, chunk_bytes: int) -> list[tuple[int, int]]:
    step = max(1, chunk_bytes // max(1, itemsize))
    return [(a, min(count, a + step)) for a in range(0, count, step)]


#: final ranges up to this size are written back on the engine thread that reports them: a
#: hand-off to the write-back thread costs more than the copy (and dominates small-op latency)
INLINE_WRITE_BYTES = 256 << 10


def _run_tree(engine: Engine, work: np.ndarray, op: str, fp: Fingerprint, deadline_s: float | None,
              write: Callable[[int, int], None] | None, writer: ThreadPoolExecutor,
              times: dict[str, float], done: Callable[[OpStats], None], avg_divisor: int | None = None,
              fill: Callable[[int, int], None] | None = None, fuse: Fuse | None = None,
              local_reduce: Callable[[], float] | None = None, post: bool = False,
              inputs: Sequence[np.ndarray] | None = None, mirrors: Sequence[np.ndarray] = (),
              discard: bool = False, bcast_root: bool | None = None) -> OpStats:
    """engine.allreduce (or, with ``bcast_root``, engine.broadcast: does this node hold the root?)
    with write-back of each final range on the writer thread.

    When every final range is small enough to be written on the engine thread that
    reports it, the op is complete as soon as the engine says so: ``done`` runs there.
    With ``inputs`` the op streams: the engine reduces them and writes the result into
    ``work`` (unless ``discard``) and ``mirrors`` itself, and its stats carry those phases' times.
    """
    futures: list[Future[None]] = []
    wb = [0.0]
    early = write is None or work.nbytes <= INLINE_WRITE_BYTES

    def take_times(stats: OpStats) -> None:
        times["tree_s"] = time.perf_counter() - t
        times["writeback_s"] = wb[0] + stats.copyout_s
        if local_reduce is not None:
            times["local_reduce_s"] = local_reduce()
        elif inputs is not None:
            times["local_reduce_s"] = stats.reduce_s

    def engine_done(stats: OpStats) -> None:
        take_times(stats)
        done(stats)

    def timed(a: int, b: int) -> None:
        assert write is not None
        t = time.perf_counter()
        write(a, b)
        wb[0] += time.perf_counter() - t

    def on_final(a: int, b: int) -> None:
        if (b - a) * work.itemsize <= INLINE_WRITE_BYTES:
            timed(a, b)  # an exception fails the op (the engine reports it)
        else:
            futures.append(writer.submit(timed, a, b))

    t = time.perf_counter()
    if post:  # (may_post: every write-back runs on the completing engine thread)
        engine.post(work, op, fp, on_final=None if write is None else on_final, avg_divisor=avg_divisor, fill=fill,
                    on_done=engine_done)
        return _POSTED
    try:
        kw: dict[str, Any] = {"fill": fill, "fuse": fuse} if fill is not None else {}
        if inputs is not None:
            kw = {"inputs": inputs, "mirrors": mirrors, "discard": discard}
        if bcast_root is not None:
            stats = engine.broadcast(work, fp, root=bcast_root, on_final=None if write is None else on_final,
                                     deadline_s=deadline_s, on_done=engine_done if early else None)
        else:
            stats = engine.allreduce(work, op, fp, on_final=None if write is None else on_final,
                                     deadline_s=deadline_s, avg_divisor=avg_divisor,
                                     on_done=engine_done if early else None, **kw)
    finally:
        # the next op reuses the buffers: no write may still be running when we return
        failures = [f.exception() for f in list(futures)]
    bad = next((e for e in failures if e is not None), None)
    if bad is not None:
        raise bad
    take_times(stats)
    return stats


def _reduce(plan: OpPlan, engine: Engine | None, fp: Fingerprint, deadline_s: float | None,
            scratch: _WorkBuffers, writer: ThreadPoolExecutor, on_phase: Callable[[str], None],
            times: dict[str, float], done: Callable[[OpStats], None], post: bool) -> OpStats | None:
    engine_op, wdt, _ = wire_layout(plan.kind, plan.op, plan.dtype, plan.count)
    local_op = "sum" if plan.op == "avg" else plan.op
    views = plan.views
    scatter = plan.kind == "reduce_scatter"
    if plan.kind == "reduce":
        targets = [views[plan.root_local]] if plan.root_local is not None else []
    elif scatter:
        targets = []  # (the write-back scatters the slices into plan.outs: _scatter_into)
    else:
        targets = views
    # an allreduce whose dtype travels as it is uses local rank 0's own buffer as the work buffer:
    # the result lands there directly and the write-back copies it K - 1 times, not K; so does a
    # reduce on the node of its root when the root is local rank 0 (the engine's streamed loops
    # take work as the first of their inputs or apart from them all, never another one)
    # (a reduce_scatter leaves its inputs as they are: it always works in scratch)
    alias = (plan.kind == "allreduce" or plan.kind == "reduce" and plan.root_local == 0) and wdt == plan.dtype
    in_place = alias and len(views) == 1
    work = views[0] if alias else scratch.get(wdt, plan.count)
    if alias:
        targets = views[1:] if plan.kind == "allreduce" else []
    # one node divides at write-back; across nodes the engine's tree root divides before the down pass
    # (write() must never modify work there: the engine still sends final chunks from it)
    divisor = plan.world_size if plan.op == "avg" and engine is None else 0
    int_avg = wdt.kind in "iu"

    def write(a: int, b: int) -> None:
        seg = work[a:b]
        if divisor:
            if int_avg:
                np.floor_divide(seg, divisor, out=seg)
            else:
                np.divide(seg, np.float32(divisor), out=seg)
        if scatter:
            _scatter_into(plan, work, a, b)
            return
        if not targets:
            return
        if wdt != plan.dtype:
            first = targets[0][a:b]
            kernels.cast_into(first, seg, threads=1)
            copy_into([t[a:b] for t in targets[1:]], first)
        else:
            copy_into([t[a:b] for t in targets], seg)

    if engine is not None and wdt == plan.dtype and engine.can_stream(work):
        # the engine's block loops reduce the ranks with the children and write every target
        # themselves, block by block in the cache (``_blocks``): no fill, fuse or write-back here.
        # A reduce wants its result in the root's buffer only: a scratch work buffer is not
        # written (``discard``), which on the trees saves a whole buffer's writes on every node
        on_phase("tree")
        if scatter:
            # the engine writes the whole result into scratch (it has no mirror for a slice), then this
            # thread copies each rank's slice out; ``done`` (the ranks' release) only after that
            stats = _run_tree(engine, work, engine_op, fp, deadline_s, None, writer, times, lambda _: None,
                              avg_divisor=plan.world_size, inputs=views, mirrors=[])
            on_phase("writeback")
            t1 = time.perf_counter()
            _scatter_into(plan, work, 0, plan.count)
            times["writeback_s"] += time.perf_counter() - t1
            return stats
        return _run_tree(engine, work, engine_op, fp, deadline_s, None, writer, times, done,
                         avg_divisor=plan.world_size, inputs=views, mirrors=targets, post=post,
                         discard=plan.kind == "reduce" and not alias)
    if engine is not None:
        # the local reduce runs inside the engine, chunk by chunk: on its fill thread, or fused with
        # the children's chunks on the up thread of a tree where this node has children.
        # local_reduce_s sums those calls' times (a fused call's includes the children's share),
        # and overlaps tree_s (the engine's wall time)
        spent: list[float] = []

        def fill(a: int, b: int) -> None:
            t1 = time.perf_counter()
            out = work[a:b]  # (rank 0's own view when work is its buffer: an alias seen without addresses)
            kernels.reduce_into(out, [out if v is work else v[a:b] for v in views], local_op, threads=1)
            spent.append(time.perf_counter() - t1)

        def fuse(a: int, b: int, children: Sequence[np.ndarray]) -> None:
            # the ranks' chunks, then the children's, left to right: the bits of fill-then-reduce
            # (float32 / integer partials are stored as they are), in one pass instead of two
            t1 = time.perf_counter()
            ranks = [v[a:b] for v in views]
            if wdt != plan.dtype or len(ranks) + len(children) > kernels.MAX_INPUTS:
                # low precision (float32 partials from narrower ranks) or too many inputs: two passes
                kernels.reduce_into(work[a:b], ranks, local_op, threads=1)
                kernels.reduce_into(work[a:b], [work[a:b], *children], local_op, threads=1)
            else:
                kernels.reduce_into(work[a:b], ranks + list(children), local_op, threads=1)
            spent.append(time.perf_counter() - t1)

        on_phase("tree")
        return _run_tree(engine, work, engine_op, fp, deadline_s, write if targets or scatter else None, writer, times,
                         done, avg_divisor=plan.world_size, fill=None if in_place else fill,
                         fuse=None if in_place else fuse, local_reduce=lambda: sum(spent), post=post)
    chunks = _chunks(plan.count, wdt.itemsize, plan.chunk_bytes)
    on_phase("local_reduce")
    t0 = time.perf_counter()
    if not in_place:
        for a, b in chunks:
            kernels.reduce_into(work[a:b], [v[a:b] for v in views], local_op, threads=plan.threads)
            if engine is None:
                t1 = time.perf_counter()
                write(a, b)  # one node: fuse write-back with the reduce while the chunk is in cache
                times["writeback_s"] += time.perf_counter() - t1
    elif engine is None:
        for a, b in chunks:
            write(a, b)
    times["local_reduce_s"] = time.perf_counter() - t0 - times["writeback_s"]
    return None


def _broadcast(plan: OpPlan, engine: Engine | None, fp: Fingerprint, deadline_s: float | None,
               scratch: _WorkBuffers, writer: ThreadPoolExecutor, on_phase: Callable[[str], None],
               times: dict[str, float], done: Callable[[OpStats], None], post: bool) -> OpStats | None:
    nbytes = plan.count * plan.dtype.itemsize
    raw = [v.view(np.uint8) for v in plan.views]
    root = plan.root_local
    others = [r for i, r in enumerate(raw) if i != root]
    if engine is None:
        on_phase("writeback")
        t = time.perf_counter()
        src = raw[root]  # type: ignore[index]
        for a, b in _chunks(nbytes, 1, plan.chunk_bytes):
            copy_into([r[a:b] for r in others], src[a:b])
        times["writeback_s"] = time.perf_counter() - t
        return None
    # the root's bytes flooded over the trees as they are (``_bcast``: every edge carries them once,
    # nothing is added): the root's buffer is the engine's on its node, rank 0's elsewhere, and the
    # write-back copies each range to this node's other ranks as it lands
    work = raw[0 if root is None else root]
    targets = [r for r in raw if r is not work]

    def copy_out(a: int, b: int) -> None:
        copy_into([r[a:b] for r in targets], work[a:b])

    on_phase("tree")
    return _run_tree(engine, work, "sum", fp, deadline_s, copy_out if targets else None, writer, times, done,
                     bcast_root=root is not None)


def _scatter_into(plan: OpPlan, work: np.ndarray, a: int, b: int) -> None:
    scatter_into(plan.outs, plan.ranks, plan.count // plan.world_size, work, a, b)


def scatter_into(outs: Sequence[np.ndarray], ranks: Sequence[int], m: int, work: np.ndarray, a: int, b: int) -> None:
    """A reduce_scatter's write-back of final range ``[a, b)`` of ``work`` (the whole reduced buffer):
    each local rank gets the part of it that lies in its slice ``[g*m, (g+1)*m)`` (``g`` its global
    rank, ``m`` its output's size), rounded to its dtype if ``work`` carries float32 partials."""
    for out, g in zip(outs, ranks, strict=True):
        lo, hi = max(a, g * m), min(b, (g + 1) * m)
        if lo >= hi:
            continue
        dst, src = out[lo - g * m:hi - g * m], work[lo:hi]
        if src.dtype != dst.dtype:
            kernels.cast_into(dst, src, threads=1)
        else:
            copy_into([dst], src)


def _allgather(plan: OpPlan, engine: Engine | None, fp: Fingerprint, deadline_s: float | None,
               writer: ThreadPoolExecutor, on_phase: Callable[[str], None], times: dict[str, float]) -> OpStats | None:
    """Every rank's input into every rank's output at its global rank's place, bit for bit.

    On the node, each local rank's bytes are copied into every local output (``local_reduce_s``:
    the local gather).  Across ``N`` nodes node ``j``'s ranks (global ``j*K`` .. ``j*K+K-1``, as
    ``ff launch`` numbers them; the worker checks) fill one contiguous block of the output, so
    the op is ``N`` of the engine's broadcasts (:mod:`._bcast`), block ``j`` from node ``j``: each
    floods the block's bytes as they are over both trees, every tree edge carrying each byte once,
    into local rank 0's output, and the other local outputs get each range as it lands.

    Why broadcasts, not a ring: they are the engine's own bit-exact transfer, with its deadlines,
    fingerprints, blame and abort flooding, and move the bytes a ring allgather moves -- each node
    *receives* every other node's block exactly once, ``(N-1)/N`` of the output, and the nodes
    together send ``N-1`` blocks per broadcast, ``(N-1)/N`` of the output per node on average (a
    tree's inner nodes forward more than its leaves).  Nothing is reduced or padded (an allreduce
    of zero-padded buffers would move ``2(N-1)/N`` and turn -0.0 into 0.0).  The cost against a
    ring: ``N`` ops back to back, each ``2 x depth`` hops of latency (see :mod:`._bcast`), instead
    of ``N-1`` pipelined steps.
    """
    itemsize = plan.dtype.itemsize
    nb = plan.count * itemsize
    ins = [v.view(np.uint8) for v in plan.views]
    outs = [o.view(np.uint8) for o in plan.outs]
    on_phase("local_gather")
    t = time.perf_counter()
    for src, g in zip(ins, plan.ranks, strict=True):
        if nb:
            copy_into([o[g * nb:(g + 1) * nb] for o in outs], src)
    times["local_reduce_s"] = time.perf_counter() - t
    if engine is None or nb == 0:
        return None
    on_phase("tree")
    K = len(outs)
    block = K * nb
    work_all, others = outs[0], outs[1:]
    t_start = time.monotonic()
    parts: list[OpStats] = []
    for j in range(plan.nnodes):
        work = work_all[j * block:(j + 1) * block]
        mine = j == plan.node_rank

        def copy_out(a: int, b: int, work: np.ndarray = work, base: int = j * block) -> None:
            copy_into([o[base + a:base + b] for o in others], work[a:b])

        # one fingerprint per part: a broadcast's (the engine's check), naming the op and its source
        part_fp = Fingerprint(comm=fp.comm, seq=fp.seq, op="allgather", dtype=fp.dtype, count=K * plan.count,
                              kind="broadcast", root=j)
        left = None if deadline_s is None else max(0.1, deadline_s - (time.monotonic() - t_start))
        sub_times = {"local_reduce_s": 0.0, "tree_s": 0.0, "writeback_s": 0.0}
        # (on the source node the other local outputs have the block already: the local gather)
        parts.append(_run_tree(engine, work, "sum", part_fp, left, None if mine or not others else copy_out,
                               writer, sub_times, lambda _: None, bcast_root=mine))
        times["tree_s"] += sub_times["tree_s"]
        times["writeback_s"] += sub_times["writeback_s"]
    return _merge_stats(parts, fp.seq, plan.count * itemsize * plan.world_size)


def _merge_stats(parts: Sequence[OpStats], seq: int, nbytes: int) -> OpStats:
    """One allgather's telemetry from its parts' (trees' phase times and peers' traffic summed)."""
    trees = [TreeStats(), TreeStats()]
    peers: dict[int, PeerStats] = {}
    for p in parts:
        for t, ts in enumerate(p.trees[:2]):
            trees[t].up_s += ts.up_s
            trees[t].down_s += ts.down_s
        for node, ps in p.peers.items():
            q = peers.setdefault(node, PeerStats())
            q.bytes_sent += ps.bytes_sent
            q.bytes_received += ps.bytes_received
            q.transfer_s += ps.transfer_s
    return OpStats(seq=seq, kind="allgather", nbytes=nbytes, algorithm="tree", trees=trees, peers=peers,
                   copyout_s=sum(p.copyout_s for p in parts), started_at=parts[0].started_at,
                   finished_at=parts[-1].finished_at)
