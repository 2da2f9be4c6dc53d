"""NodeEngine with ``algorithm="ring"``: results, bits, telemetry and failures of ring ops (engines in threads)."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
from engine_util import allreduce_all, close_all, make_engines, odd_one_out, run_all
from test_engine import check, inputs, reference

from fireflyer.core.errors import InvalidArgument, SettingsError, Unauthenticated
from fireflyer.hfreduce._ring import RING_TREE, RingOp, ring_steps, segments
from fireflyer.hfreduce.engine import NodeEngine
from fireflyer.hfreduce.errors import (
    CollectiveAborted,
    CollectiveTimeout,
    FingerprintMismatch,
    HFReduceError,
    PeerLost,
)
from fireflyer.hfreduce.settings import WorkerSettings
from fireflyer.hfreduce.types import Fingerprint, OpStats

RING = {"algorithm": "ring"}
INLINE = 4096  # make_engines' chunk: ops up to this many bytes are inline, on the trees


def _check(res: list[object], got: list[np.ndarray], ref: np.ndarray, op: str, *, ring: bool) -> None:
    check(res, got, ref, op)
    assert all(r.algorithm == ("ring" if ring else "tree") for r in res), [r.algorithm for r in res]  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_every_segment_is_reduced_over_all_nodes_once_and_then_sent_everywhere(n: int) -> None:
    """The schedule as a simulation: after reduce-scatter each node owns one segment holding
    every node's contribution exactly once; after allgather every node holds every segment."""
    have = [[{i} for _ in range(n)] for i in range(n)]  # have[node][segment] = contributors
    plans = [ring_steps(i, n) for i in range(n)]
    for s in range(2 * (n - 1)):
        sent = [set(have[i][plans[i][s][0]]) for i in range(n)]  # what each node sends at step s
        for i in range(n):
            _, into, reduce = plans[i][s]
            got = sent[(i - 1) % n]
            assert plans[(i - 1) % n][s][0] == into  # the sender sends what we expect
            if reduce:
                assert not have[i][into] & got, "a contribution counted twice"
                have[i][into] = have[i][into] | got
            else:
                assert got == set(range(n))  # allgather moves final segments only
                have[i][into] = set(got)
        if s == n - 2:
            assert all(have[i][(i + 1) % n] == set(range(n)) for i in range(n))
    assert all(h == set(range(n)) for node in have for h in node)


def _plan(node: int, n: int, work: np.ndarray, block_bytes: int, piece_bytes: int) -> RingOp:
    return RingOp(node, n, work, [work], [], "sum", block_bytes, piece_bytes)


def test_segments_and_pieces_cover_the_buffer() -> None:
    assert segments(10, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    op = _plan(1, 4, np.zeros(10, np.float32), 8, 8)
    assert op.pieces == 2 and op.total == 12  # the longest segment (3) in pieces of 2
    spans = [op.recv_range(q) for q in range(op.total)]
    assert spans[0] == (0, 2) and spans[1] == (2, 2)  # segment 0 (2 elements): its second piece is empty
    assert op.finalises(4) and op.finalises(5) and not op.finalises(3) and not op.finalises(6)
    assert op.phase(5) == "reduce-scatter" and op.phase(6) == "allgather"
    # a frame is a whole number of blocks (at least one), so blocks never straddle frames
    assert _plan(0, 4, np.zeros(100, np.float32), 8, 20).per == 4
    assert _plan(0, 4, np.zeros(100, np.float32), 64, 8).per == 16


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_more_local_inputs_than_one_kernel_pass_takes_and_special_values(op: str) -> None:
    """18 inputs per node plus the received partial: the reduce-scatter's loop reduces them in
    several passes; NaN and infinities come through as the kernels define."""
    n, k, count = 3, 18, 9001
    engines = make_engines(n, block_bytes=1024, ring_piece_bytes=4096, **RING)
    try:
        ranks = [inputs(k, count, np.dtype(np.float32), seed=20 + i) for i in range(n)]
        ranks[1][2][:3] = [np.nan, np.inf, -np.inf]
        ranks[2][5][4000:4002] = [np.inf, np.inf]
        ref = reference([r for node in ranks for r in node], op)
        fp = Fingerprint("c", 0, op, "float32", count)
        res = run_all([lambda i=i: engines[i].allreduce(ranks[i][0], op, fp, inputs=ranks[i], mirrors=ranks[i][1:])
                       for i in range(n)], 30)
        _check(res, [r for node in ranks for r in node], ref, op, ring=True)
        assert np.isnan(ranks[0][0][0]) and (ranks[0][0][4000] == np.inf) == (op != "min")
    finally:
        close_all(engines)


# ---------------------------------------------------------------------------- results


@pytest.mark.parametrize("n", [3, 4, 5])
def test_ring_allreduce_matches_numpy_with_identical_bits_on_every_node_and_run(n: int) -> None:
    # 256-element pieces of 64-element blocks: several pieces per segment, several blocks per piece
    engines = make_engines(n, block_bytes=256, ring_piece_bytes=1024, **RING)
    try:
        assert all(e.algorithm == "ring" for e in engines)
        seq = 0
        for dtype in (np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64)):
            for op in ("sum", "avg", "max", "min"):
                for count in (0, 7, INLINE // dtype.itemsize + 1, 5003):
                    arrs = inputs(n, count, dtype, seed=seq)
                    ref = reference(arrs, op)
                    again = [a.copy() for a in arrs]
                    res = allreduce_all(engines, arrs, op, seq=seq)
                    _check(res, arrs, ref, op, ring=count * dtype.itemsize > INLINE)
                    allreduce_all(engines, again, op, seq=seq + 1)
                    seq += 2
                    assert again[0].tobytes() == arrs[0].tobytes(), "a second run gave other bits"
    finally:
        close_all(engines)


def test_a_large_ring_op_with_many_pieces_and_the_default_block() -> None:
    n, count = 4, (6 << 20) // 4 + 3
    for piece in (512 << 10, 2 << 20):
        engines = make_engines(n, ring_piece_bytes=piece, **RING)
        try:
            arrs = inputs(n, count, np.dtype(np.float32), seed=piece)
            ref = reference(arrs, "avg")
            _check(allreduce_all(engines, arrs, "avg"), arrs, ref, "avg", ring=True)
        finally:
            close_all(engines)


@pytest.mark.parametrize("own_work", [False, True])
def test_ring_op_reduces_local_inputs_and_writes_the_mirrors(own_work: bool) -> None:
    """The worker's streamed call: the ranks' buffers are the inputs (the first one is ``work``,
    or ``work`` is a buffer of its own) and the others get the result as mirrors."""
    n, k, count = 3, 3, 20011
    engines = make_engines(n, block_bytes=1024, ring_piece_bytes=4096, **RING)
    try:
        ranks = [inputs(k, count, np.dtype(np.float32), seed=10 * i + own_work) for i in range(n)]
        ref = reference([r for node in ranks for r in node], "sum")
        works = [np.empty(count, np.float32) if own_work else node[0] for node in ranks]
        mirrors = [node if own_work else node[1:] for node in ranks]
        fp = Fingerprint("c", 0, "sum", "float32", count)
        res = run_all([lambda i=i: engines[i].allreduce(works[i], "sum", fp, inputs=ranks[i], mirrors=mirrors[i])
                       for i in range(n)], 30)
        _check(res, [*works, *(m for ms in mirrors for m in ms)], ref, "sum", ring=True)
    finally:
        close_all(engines)


def test_on_final_reports_every_range_once_already_final() -> None:
    """The worker's write-back (a broadcast's, an op through scratch): each final range once,
    holding its final bits when reported, together the whole buffer."""
    n, count = 3, 50021
    engines = make_engines(n, block_bytes=4096, ring_piece_bytes=16 << 10, **RING)
    try:
        arrs = inputs(n, count, np.dtype(np.int32), seed=5)
        ref = reference(arrs, "sum")
        seen: list[list[tuple[int, int, bytes]]] = [[] for _ in range(n)]
        lock = threading.Lock()

        def on_final(i: int, a: int, b: int) -> None:
            with lock:
                seen[i].append((a, b, arrs[i][a:b].tobytes()))

        fp = Fingerprint("c", 0, "sum", "int32", count)
        res = run_all([lambda i=i: engines[i].allreduce(arrs[i], "sum", fp, on_final=lambda a, b, i=i: on_final(i, a, b))
                       for i in range(n)], 30)
        _check(res, arrs, ref, "sum", ring=True)
        for i in range(n):
            spans = sorted((a, b) for a, b, _ in seen[i])
            assert spans[0][0] == 0 and spans[-1][1] == count
            assert all(x[1] == y[0] for x, y in zip(spans, spans[1:], strict=False)), "gaps or overlaps"
            assert all(data == arrs[i][a:b].tobytes() for a, b, data in seen[i])
    finally:
        close_all(engines)


def test_ring_telemetry_counts_each_nodes_pieces_and_phases() -> None:
    n, count = 4, 30001
    engines = make_engines(n, block_bytes=2048, ring_piece_bytes=8192, **RING)
    try:
        arrs = [np.ones(count, np.float32) for _ in range(n)]
        res = allreduce_all(engines, arrs, "sum")
        assert all(isinstance(r, OpStats) for r in res), res
        for i, st in enumerate(res):
            plan = _plan(i, n, arrs[i], 2048, 8192)
            sent = sum(b - a for a, b in map(plan.send_range, range(plan.total))) * 4
            got = sum(b - a for a, b in map(plan.recv_range, range(plan.total))) * 4
            assert st.peers[(i + 1) % n].bytes_sent == sent
            assert st.peers[(i - 1) % n].bytes_received == got
            # reduce-scatter sends every segment but the one final here (i + 1), allgather every one
            # but the next node's (i + 2); we receive every one but our own, then all but i + 1
            size = [(b - a) * 4 for a, b in segments(count, n)]
            assert sent == 2 * count * 4 - size[(i + 1) % n] - size[(i + 2) % n]
            assert got == 2 * count * 4 - size[i] - size[(i + 1) % n]
            assert st.trees[0].up_s > 0 and st.trees[0].down_s > 0 and st.trees[1].up_s == 0
        assert all((a == n).all() for a in arrs)
        assert set(engines[0].link_congestion()) >= {f"t{RING_TREE}-n1", f"t{RING_TREE}-n3"}
    finally:
        close_all(engines)


@pytest.mark.parametrize("n,zones,want", [(2, None, "tree"), (4, ["a", "a", "b", "b"], "tree"),
                                          (4, ["a", "a", "a", "a"], "ring"), (3, None, "ring")])
def test_ring_runs_on_three_or_more_nodes_in_one_zone(n: int, zones: list[str] | None, want: str) -> None:
    engines = make_engines(n, zones=zones, **RING)
    try:
        assert all(e.algorithm == want for e in engines)
        arrs = [np.full(5000, i, np.float32) for i in range(n)]
        res = allreduce_all(engines, arrs, "sum")
        _check(res, arrs, np.full(5000, sum(range(n)), np.float64), "sum", ring=want == "ring")
    finally:
        close_all(engines)


def test_algorithm_is_checked() -> None:
    with pytest.raises(InvalidArgument, match="algorithm"):
        NodeEngine(node_rank=0, addresses=["127.0.0.1:1"], algorithm="butterfly")
    with pytest.raises(SettingsError, match="algorithm"):
        WorkerSettings(algorithm="butterfly")
    assert WorkerSettings(algorithm="ring").algorithm == "ring"
    assert WorkerSettings(ring_piece_size="1M").ring_piece_bytes == 1 << 20
    with pytest.raises(SettingsError, match="ring_piece_size"):
        WorkerSettings(ring_piece_size="1k")
    with pytest.raises(InvalidArgument, match="ring_piece_bytes"):
        NodeEngine(node_rank=0, addresses=["127.0.0.1:1"], ring_piece_bytes=8)


# ---------------------------------------------------------------------------- failures


@pytest.mark.parametrize("what", ["count", "dtype", "seq", "op", "small", "root"])
def test_a_mismatch_in_a_ring_op_fails_every_node_naming_the_odd_one(what: str) -> None:
    n, bad, count = 4, 2, 20000
    engines = make_engines(n, **RING)
    try:
        arrs, fps = odd_one_out(what, n, bad, count)  # "small": a tree op against ring ops
        t0 = time.monotonic()
        res = run_all([lambda i=i: engines[i].allreduce(arrs[i], fps[i].op, fps[i]) for i in range(n)], 20)
        assert time.monotonic() - t0 < 5
        assert all(isinstance(r, FingerprintMismatch) for r in res), res
        for i in range(n):
            if i != bad:
                assert res[i].peer == bad and res[i].ours == str(fps[i]) and res[i].theirs == str(fps[bad]), res[i]
        assert res[bad].ours == str(fps[bad])
    finally:
        close_all(engines)


@pytest.mark.parametrize("n,sleeper", [(4, 3), (5, 0), (5, 2)])
def test_a_node_that_never_calls_is_named_within_the_deadline(n: int, sleeper: int) -> None:
    engines = make_engines(n, timeout_s=10, **RING)
    try:
        arrs = [None if i == sleeper else np.ones(20000, dtype=np.float32) for i in range(n)]
        deadline = 1.0
        t0 = time.monotonic()
        res = allreduce_all(engines, arrs, "sum", deadline_s=deadline, join_s=deadline + 5)
        assert time.monotonic() - t0 < deadline + 2
        for i, r in enumerate(res):
            if i == sleeper:
                continue
            assert isinstance(r, CollectiveTimeout | CollectiveAborted), (i, r)
            if isinstance(r, CollectiveTimeout):
                assert r.peer == sleeper and f"node {sleeper}" in str(r), r
            else:
                assert r.culprit == sleeper, r
        timeouts = [r for r in res if isinstance(r, CollectiveTimeout)]
        assert timeouts and all(r.tree == RING_TREE and "ring's" in str(r) for r in timeouts), timeouts
    finally:
        close_all(engines)


def _frames_in(engine: NodeEngine) -> bool:
    """The current ring op has received a few frames (white box)."""
    st = engine._op
    return st is not None and st.ring is not None and st.ring.recv_done >= 6


def _inside_a_frame(engine: NodeEngine) -> bool:
    """The ring reader's loop is a few blocks into a frame (white box)."""
    from fireflyer.hfreduce import _blocks as B

    reader = engine._ring_bufs[1] if engine._ring_bufs else None
    return reader is not None and reader.busy and reader.io[B.IO_DONE] >= 4


def _when_ring_moves(engine: NodeEngine, then: object, ready: object = _frames_in) -> threading.Thread:
    """Call ``then()`` once ``ready(engine)`` (at most 10 s from now)."""

    def body() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not ready(engine):  # type: ignore[operator]
            time.sleep(0.0002)
        then()  # type: ignore[operator]

    th = threading.Thread(target=body, daemon=True)
    th.start()
    return th


def _large_op_while(engines: list[NodeEngine], then: object, watched: NodeEngine,
                    ready: object = _frames_in) -> list[object]:
    """A 24 MiB sum on every node, ``then()`` called once ``ready(watched)``; every node's outcome,
    all of them within 10 s (no node waits out a deadline)."""
    th = _when_ring_moves(watched, then, ready)
    arrs = [np.ones((24 << 20) // 4, np.float32) for _ in engines]
    t0 = time.monotonic()
    res = allreduce_all(engines, arrs, "sum", join_s=30)
    th.join()
    assert time.monotonic() - t0 < 10
    return res


_SMALL_FRAMES = {"ring_piece_bytes": 16 << 10}  # one block per frame: the abort falls between frames
# one frame per step of 64 blocks: the abort lands inside a frame, whose sender ends it early with an
# aborted block; the next node reads the abort frame behind it instead of waiting for the rest
_LONG_FRAMES = {"block_bytes": 64 << 10, "ring_piece_bytes": 8 << 20}


@pytest.mark.parametrize("n,who,kw,ready", [(3, 1, _SMALL_FRAMES, _frames_in), (5, 4, _SMALL_FRAMES, _frames_in),
                                            (3, 0, _LONG_FRAMES, _inside_a_frame),
                                            (3, 2, _LONG_FRAMES, _inside_a_frame)])
def test_an_abort_in_the_middle_of_a_ring_op_reaches_every_node_with_its_reason(
        n: int, who: int, kw: dict[str, int], ready: object) -> None:
    engines = make_engines(n, **kw, **RING)
    try:
        res = _large_op_while(engines, lambda: engines[who].abort("operator asked"), engines[who], ready)
        for i, r in enumerate(res):
            if i != who:
                assert isinstance(r, CollectiveAborted) and r.origin == who and "operator asked" in r.reason, (i, r)
    finally:
        close_all(engines)


def test_a_node_closed_in_the_middle_of_a_ring_op_is_named_by_the_others() -> None:
    n, victim = 4, 2
    engines = make_engines(n, ring_piece_bytes=16 << 10, **RING)
    try:
        res = _large_op_while(engines, engines[victim].close, engines[victim])
        for i, r in enumerate(res):
            if i == victim:
                continue
            assert isinstance(r, PeerLost | CollectiveAborted), (i, r)
            assert (r.peer if isinstance(r, PeerLost) else r.origin) == victim, (i, r)
    finally:
        close_all(engines)


@pytest.mark.parametrize("odd", [{"algorithm": "tree"}, {"ring_piece_bytes": 1 << 20}])
def test_nodes_that_disagree_on_the_ring_refuse_to_connect_and_say_why(odd: dict[str, object]) -> None:
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
    addrs = [f"127.0.0.1:{s.getsockname()[1]}" for s in listeners]
    engines = [NodeEngine(node_rank=i, addresses=addrs, listen=listeners[i], timeout_s=2, token="t",
                          **{**RING, **(odd if i == 1 else {})}) for i in range(3)]
    try:
        res = run_all([lambda e=e: e.start(2) for e in engines], 15)
        assert all(isinstance(r, HFReduceError | Unauthenticated) for r in res), res
        assert any("configuration differs" in str(r) for r in res), res
    finally:
        close_all(engines)


def test_a_tree_frame_on_a_ring_link_fails_the_engines_instead_of_being_misread() -> None:
    from fireflyer.wire.frame import Request

    engines = make_engines(3, **RING)
    try:
        nxt = engines[0]._ring_next  # white box: node 0's link to node 1, whose reader takes ring frames only
        assert nxt is not None
        nxt.send(Request(rid=0, op="hfr.down", meta={"c": 0}))
        arrs = [np.ones(20000, np.float32) for _ in range(3)]
        res = allreduce_all(engines, arrs, "sum", deadline_s=3, join_s=10)
        assert all(isinstance(r, HFReduceError) for r in res), res
        assert "hfr.down frame on the ring link" in str(engines[1].failed), engines[1].failed
    finally:
        close_all(engines)
