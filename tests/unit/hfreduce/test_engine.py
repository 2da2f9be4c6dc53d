"""NodeEngine: results against numpy, bit-identity, on_final, telemetry (engines in threads)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import ml_dtypes
import numpy as np
import pytest
from engine_util import allreduce_all, close_all, make_engines, run_all

from fireflyer.core.errors import InvalidArgument
from fireflyer.hfreduce import kernels
from fireflyer.hfreduce.engine import NodeEngine
from fireflyer.hfreduce.errors import HFReduceError
from fireflyer.hfreduce.trees import split_halves
from fireflyer.hfreduce.types import Fingerprint, OpStats

BF16 = np.dtype(ml_dtypes.bfloat16)
COUNTS = (0, 1, 2, 7, 3 * 1024 + 5, 5000)  # 4 KiB chunks: 5000 float32 is 2.4 chunks per tree


def inputs(n: int, count: int, dtype: np.dtype, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if dtype == np.float32:
        return [rng.standard_normal(count).astype(np.float32) for _ in range(n)]
    # small integers: every partial sum is exact in bfloat16 and int64, so results are exact
    return [rng.integers(-8, 9, count).astype(dtype) for _ in range(n)]


def reference(arrs: list[np.ndarray], op: str) -> np.ndarray:
    exact = arrs[0].dtype.kind in "iu"  # integers in int64 (floor division for avg), floats in float64
    wide = np.stack([a.astype(np.int64 if exact else np.float64) for a in arrs])
    if op == "max":
        return wide.max(axis=0)
    if op == "min":
        return wide.min(axis=0)
    s = wide.sum(axis=0)
    if op == "avg":
        return s // len(arrs) if exact else s / len(arrs)
    return s


def check(results: list[object], got: list[np.ndarray], ref: np.ndarray, op: str) -> None:
    errs = [r for r in results if isinstance(r, BaseException)]
    assert not errs, errs
    assert all(isinstance(r, OpStats) for r in results)
    first = got[0].tobytes()
    assert all(g.tobytes() == first for g in got), "nodes disagree bitwise"
    g = got[0]
    if g.dtype == np.float32 and op in ("sum", "avg"):
        np.testing.assert_allclose(g.astype(np.float64), ref, rtol=1e-5, atol=1e-5)
    elif g.dtype == BF16 and op == "avg":
        np.testing.assert_array_equal(g, ref.astype(np.float32).astype(BF16))
    else:
        np.testing.assert_array_equal(g.astype(ref.dtype), ref)


@pytest.mark.parametrize("n,zones", [(1, None), (2, None), (3, None), (4, None), (5, None),
                                     (4, ["a", "a", "b", "b"]), (5, ["z1", "z2", "z1", "z2", "z1"])])
def test_allreduce_matches_numpy(n: int, zones: list[str] | None) -> None:
    engines = make_engines(n, zones=zones)
    try:
        seq = 0
        for dtype in (np.dtype(np.float32), BF16, np.dtype(np.int64)):
            for op in ("sum", "avg", "max", "min"):
                for count in COUNTS:
                    arrs = inputs(n, count, dtype, seed=seq)
                    ref = reference(arrs, op)
                    again = [a.copy() for a in arrs]
                    res = allreduce_all(engines, arrs, op, seq=seq)
                    check(res, arrs, ref, op)
                    seq += 1
                    allreduce_all(engines, again, op, seq=seq)  # a second run gives the same bits
                    seq += 1
                    assert again[0].tobytes() == arrs[0].tobytes()
    finally:
        close_all(engines)


def test_large_buffer_many_chunks_and_on_final() -> None:
    n, count = 3, (8 << 20) // 4
    engines = make_engines(n, chunk_bytes=256 << 10)
    try:
        arrs = inputs(n, count, np.dtype(np.float32), seed=1)
        ref = reference(arrs, "sum")
        seen: list[list[tuple[int, int, bytes]]] = [[] for _ in range(n)]
        lock = threading.Lock()

        def on_final(i: int, a: int, b: int) -> None:
            with lock:  # the range must already hold its final value when reported
                seen[i].append((a, b, arrs[i][a:b].tobytes()))

        res = [None] * n
        fns = [lambda i=i: engines[i].allreduce(arrs[i], "sum", Fingerprint("c", 0, "sum", "float32", count),
                                                on_final=lambda a, b, i=i: on_final(i, a, b))
               for i in range(n)]
        res = run_all(fns, 60)
        check(res, arrs, ref, "sum")
        for i in range(n):
            ranges = sorted((a, b) for a, b, _ in seen[i])
            assert ranges[0][0] == 0 and ranges[-1][1] == count
            assert all(x[1] == y[0] for x, y in zip(ranges, ranges[1:], strict=False)), "gaps or overlaps"
            for a, b, data in seen[i]:
                assert data == arrs[i][a:b].tobytes()
        st = res[0]
        assert isinstance(st, OpStats) and st.nbytes == count * 4 and len(st.trees) == 2
        assert sum(p.bytes_sent for p in st.peers.values()) > 0
        assert all(p.transfer_s >= 0 for p in st.peers.values())
        assert st.finished_at >= st.started_at
    finally:
        close_all(engines)


def test_avg_divisor_and_bf16_large() -> None:
    engines = make_engines(2)
    try:
        arrs = [np.full(3000, 3, dtype=np.int64), np.full(3000, 5, dtype=np.int64)]
        res = allreduce_all(engines, arrs, "avg", avg_divisor=4)
        assert not any(isinstance(r, BaseException) for r in res)
        assert (arrs[0] == 2).all() and (arrs[1] == 2).all()
    finally:
        close_all(engines)


def test_argument_checks_and_single_node() -> None:
    (eng,) = make_engines(1)
    try:
        x = np.arange(5, dtype=np.float32)
        with pytest.raises(InvalidArgument):
            eng.allreduce(x, "sum", Fingerprint("c", 0, "sum", "float32", 6))
        with pytest.raises(InvalidArgument):
            eng.allreduce(x, "sum", Fingerprint("c", 0, "max", "float32", 5))
        with pytest.raises(InvalidArgument):
            eng.allreduce(x[::2], "sum", Fingerprint("c", 0, "sum", "float32", 3))
        got: list[tuple[int, int]] = []
        eng.allreduce(x, "avg", Fingerprint("c", 0, "avg", "float32", 5), on_final=lambda a, b: got.append((a, b)),
                      avg_divisor=2)
        assert got == [(0, 5)] and x.tolist() == [0, 0.5, 1, 1.5, 2]
    finally:
        eng.close()
    with pytest.raises(InvalidArgument):
        NodeEngine(node_rank=2, addresses=["127.0.0.1:1", "127.0.0.1:2"])


def test_close_joins_every_thread() -> None:
    # only this test's threads: an in-process worker of another test may still own "hfr-" threads
    before = set(threading.enumerate())
    engines = make_engines(4)
    arrs = [np.ones(100, dtype=np.float32) for _ in range(4)]
    allreduce_all(engines, arrs, "sum")
    close_all(engines)
    close_all(engines)  # idempotent
    left = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("hfr-")]
    assert not left, left


@pytest.mark.parametrize("with_fuse", [False, True], ids=["fill", "fill+fuse"])
@pytest.mark.parametrize("n,count", [(1, 5000), (2, 7), (2, 5000), (3, 5000), (4, (1 << 20) // 4 + 3), (5, 9001)])
def test_fill_and_fuse_make_the_local_partial_bit_identically(n: int, count: int, with_fuse: bool) -> None:
    """``fill`` gets every range exactly once, before the engine reads it; with ``fuse``, the trees
    where the node has children get their ranges from ``fuse`` (with the children's chunks) instead.
    The result equals a pre-filled buffer's, bit for bit."""
    engines = make_engines(n, chunk_bytes=16 << 10)
    try:
        # each node's partial is the sum of two "local ranks", produced only when the engine asks
        locs = [inputs(2, count, np.dtype(np.float32), seed=10 + i) for i in range(n)]
        pre = [a + b for a, b in locs]
        ref_res = allreduce_all(engines, pre, "sum", seq=0)
        want = pre[0].copy()
        filled: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        fused: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        lock = threading.Lock()

        def fill(i: int, work: np.ndarray, a: int, b: int) -> None:
            with lock:
                filled[i].append((a, b))
            np.add(locs[i][0][a:b], locs[i][1][a:b], out=work[a:b])

        def fuse(i: int, work: np.ndarray, a: int, b: int, children: Sequence[np.ndarray]) -> None:
            assert children and all(c.shape == (b - a,) for c in children)
            with lock:
                fused[i].append((a, b))
            kernels.reduce_into(work[a:b], [locs[i][0][a:b], locs[i][1][a:b], *children], "sum", threads=1)

        def kw(i: int) -> dict[str, object]:
            out: dict[str, object] = {"fill": lambda a, b: fill(i, works[i], a, b)}
            if with_fuse:
                out["fuse"] = lambda a, b, ch: fuse(i, works[i], a, b, ch)
            return out

        works = [np.full(count, np.nan, dtype=np.float32) for _ in range(n)]
        fns = [lambda i=i: engines[i].allreduce(works[i], "sum", Fingerprint("c", 1, "sum", "float32", count),
                                                **kw(i)) for i in range(n)]
        res = run_all(fns, 60)
        assert not [r for r in ref_res + res if isinstance(r, BaseException)], (ref_res, res)
        # one node, or an inline op: one fill call for the whole buffer, on the caller
        inline = n == 1 or count * 4 <= engines[0].inline_bytes
        for i in range(n):
            assert works[i].tobytes() == want.tobytes(), f"node {i} differs from the pre-filled run"
            ranges = sorted(filled[i] + fused[i])
            assert ranges[0][0] == 0 and ranges[-1][1] == count, ranges
            assert all(x[1] == y[0] for x, y in zip(ranges, ranges[1:], strict=False)), "gaps or overlaps"
            for t, (lo, hi) in enumerate([] if inline else split_halves(count)):
                by_fuse = with_fuse and bool(engines[i]._children[t])
                mine, other = (fused[i], filled[i]) if by_fuse else (filled[i], fused[i])
                assert sum(b - a for a, b in mine if lo <= a < hi) == hi - lo, (i, t)
                assert not [r for r in other if lo <= r[0] < hi], (i, t)
        assert any(fused) == (with_fuse and not inline), "fuse ran where it must not, or never"
    finally:
        close_all(engines)


@pytest.mark.parametrize("raising", ["fill", "fuse"])
def test_a_fill_or_fuse_that_raises_fails_the_op_on_every_node(raising: str) -> None:
    n, count = 3, 20000
    engines = make_engines(n, chunk_bytes=16 << 10, timeout_s=5.0)
    try:
        # the failing node: for fuse, one that has children (only such a node calls it)
        bad = 2 if raising == "fill" else next(i for i in range(n) if any(engines[i]._children))

        def fill(i: int, work: np.ndarray, a: int, b: int, children: Sequence[np.ndarray] = ()) -> None:
            if i == bad and a > 0 and (raising == "fuse") == bool(children):
                raise RuntimeError("rank buffer vanished")
            work[a:b] = 1.0
            for c in children:
                work[a:b] += c

        works = [np.zeros(count, dtype=np.float32) for _ in range(n)]
        fns = [lambda i=i: engines[i].allreduce(
            works[i], "sum", Fingerprint("c", 0, "sum", "float32", count),
            fill=lambda a, b, i=i: fill(i, works[i], a, b),
            fuse=lambda a, b, ch, i=i: fill(i, works[i], a, b, ch)) for i in range(n)]
        res = run_all(fns, 15)
        assert all(isinstance(r, BaseException) for r in res), res
        assert f"{raising}(" in str(res[bad]) and "rank buffer vanished" in str(res[bad]), res[bad]
        assert all(f"node {bad}" in str(r) for i, r in enumerate(res) if i != bad), res
    finally:
        close_all(engines)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("count", [7, 5000])  # one chunk (inline steps on the readers), several chunks per tree
def test_on_done_runs_once_with_the_final_result_before_the_call_returns(n: int, count: int) -> None:
    """The worker releases its ranks from on_done: it must see the result and the call's own stats."""
    engines = make_engines(n)
    try:
        arrs = inputs(n, count, np.dtype(np.float32), seed=3)
        ref = reference(arrs, "sum")
        calls: list[list[tuple[object, str, bytes]]] = [[] for _ in range(n)]
        events: list[tuple[str, int]] = []  # (list.append is atomic: the order the threads got there)

        def on_done(i: int, stats: OpStats) -> None:
            calls[i].append((stats, threading.current_thread().name, arrs[i].tobytes()))
            events.append(("done", i))

        def call(i: int) -> tuple[str, OpStats]:
            stats = engines[i].allreduce(arrs[i], "sum", Fingerprint("c", 0, "sum", "float32", count),
                                         on_done=lambda s: on_done(i, s))
            events.append(("returned", i))
            return threading.current_thread().name, stats

        res = run_all([lambda i=i: call(i) for i in range(n)], 30)
        check([r[1] for r in res], arrs, ref, "sum")
        for i, (caller, stats) in enumerate(res):
            assert len(calls[i]) == 1, f"node {i}: on_done ran {len(calls[i])} times"
            got, thread, seen = calls[i][0]
            assert got is stats, f"node {i}: on_done saw other stats than the call returned"
            assert seen == arrs[i].tobytes(), f"node {i}: on_done ran before the result was final"
            assert events.index(("done", i)) < events.index(("returned", i)), events
            # on the thread that ran the op's last step: usually a reader (the final came down), but the
            # caller's own up step when the caller was held between its send and its count-down while
            # the whole round trip finished -- so either, never another thread
            assert thread == caller or thread.startswith("hfr-"), thread
    finally:
        close_all(engines)


def test_two_nodes_exchange_small_ops_in_one_hop_with_identical_bits() -> None:
    """Two nodes: a small op sends each partial once (no down pass), both nodes reduce them in the
    root's order (NaN payloads and signed zeros agree), whoever calls first, op after op."""
    import time as _time

    engines = make_engines(2)
    root = engines[0].roots[0]
    child = 1 - root
    sent: list[tuple[int, str]] = []
    for i, eng in enumerate(engines):
        for lk in eng._links:
            def spy(hdr, payload=None, _send=lk.send, i=i):  # type: ignore[no-untyped-def]
                sent.append((i, hdr.op))
                return _send(hdr, payload)
            lk.send = spy  # type: ignore[method-assign]
    try:
        assert engines[0].exchange and engines[1].exchange
        rng = np.random.default_rng(5)
        for k in range(12):
            count = (0, 1, 5, 1024)[k % 4]  # 1024 float32 = the inline bound at 4 KiB chunks
            op = ("sum", "avg", "max", "min")[k % 4]
            arrs = [rng.standard_normal(count).astype(np.float32) for _ in range(2)]
            if count >= 5:  # two different NaN payloads and a -0.0 against +0.0
                arrs[0][:3] = np.array([0x7FC00001, 0x7FC00002, 0x80000000], np.uint32).view(np.float32)
                arrs[1][:3] = np.array([0x7FC00003, 0x3F800000, 0x00000000], np.uint32).view(np.float32)
            late = (child, root)[k % 2]  # the root's partial may reach the child before the child calls

            def call(i: int, arrs: list[np.ndarray], fp: Fingerprint, late: int) -> OpStats:
                if i == late:
                    _time.sleep(0.05)
                return engines[i].allreduce(arrs[i], fp.op, fp)

            fp = Fingerprint("c", k, op, "float32", count)
            res = run_all([lambda i=i, a=arrs, fp=fp, late=late: call(i, a, fp, late) for i in range(2)], 30)
            assert not [r for r in res if isinstance(r, BaseException)], res
            assert arrs[0].tobytes() == arrs[1].tobytes(), f"op {k} ({op}, {count} el): nodes disagree bitwise"
            for i, st in enumerate(res):
                (peer,) = st.peers.values()
                # one frame each way carrying one partial: nothing is sent twice
                assert peer.bytes_sent == peer.bytes_received == count * 4, (i, peer)
        data = [(i, op) for i, op in sent if op != "hfr.wait"]
        assert sorted(set(data)) == sorted({(root, "hfr.xchg"), (child, "hfr.up")}), set(data)
        assert len(data) == 24
    finally:
        close_all(engines)


@pytest.mark.parametrize("n", [2, 3])
def test_posted_ops_chain_from_on_done_and_wait_returns_their_stats(n: int) -> None:
    """post() returns before the op completes; on_done reports it and may post the next op (the
    worker's chaining); wait() returns the stats, at once for an op that already completed."""
    engines = make_engines(n)
    try:
        nops, count = 40, 5
        results: list[list[np.ndarray]] = [[] for _ in range(n)]
        states: list[list[object]] = [[] for _ in range(n)]
        finished = [threading.Event() for _ in range(n)]

        def post(i: int, k: int) -> None:
            x = np.full(count, float(i + k), np.float32)

            def done(stats: OpStats, i: int = i, k: int = k, x: np.ndarray = x) -> None:
                assert stats.seq == k
                results[i].append(x)
                if k + 1 < nops:
                    post(i, k + 1)  # from the completing thread, like the worker
                else:
                    finished[i].set()

            states[i].append(engines[i].post(x, "sum", Fingerprint("c", k, "sum", "float32", count), on_done=done))

        run_all([lambda i=i: post(i, 0) for i in range(n)], 30)
        for ev in finished:
            assert ev.wait(30), "the posted chain stalled"
        for i in range(n):
            assert [float(x[0]) for x in results[i]] == [sum(j + k for j in range(n)) for k in range(nops)]
            assert engines[i].wait(states[i][-1]).seq == nops - 1  # completed: returns at once
        # a big op cannot be posted; the engine is unharmed and the next call works
        with pytest.raises(InvalidArgument, match="small ops"):
            engines[0].post(np.zeros(1 << 20, np.float32), "sum", Fingerprint("c", nops, "sum", "float32", 1 << 20),
                            on_done=lambda s: None)
        res = allreduce_all(engines, [np.ones(3, np.float32) for _ in range(n)], "sum", seq=nops)
        assert all(not isinstance(r, BaseException) for r in res), res
    finally:
        close_all(engines)


def test_on_failure_tells_the_owner_of_a_posted_op_nobody_waits_for() -> None:
    engines = make_engines(2)
    try:
        told = threading.Event()
        engines[0].on_failure = told.set
        st = engines[0].post(np.ones(3, np.float32), "sum", Fingerprint("c", 0, "sum", "float32", 3),
                             on_done=lambda s: None)
        engines[1].abort("test abort")  # node 1 never runs op 0
        assert told.wait(10), "on_failure was not called"
        with pytest.raises(HFReduceError, match="test abort"):
            engines[0].wait(st, 5.0)
    finally:
        close_all(engines)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_nodes_running_ahead_through_small_and_large_ops_get_every_result(n: int) -> None:
    """Each node runs the whole sequence on its own thread, so nodes drift apart: a node that
    finished op k sends op k+1's frames (a large op's parked ones, a small op's ring ones) to
    a neighbour still in op k.  Every result must still be right, bit-identical everywhere."""
    engines = make_engines(n)
    plan = [(np.dtype(np.float32), 5000), (np.dtype(np.int32), 1), (np.dtype(np.float32), 7),
            (BF16, 5000), (np.dtype(np.int64), 3 * 1024 + 5), (np.dtype(np.float32), 1024)] * 4
    data = [[inputs(n, count, dtype, seed=k) for k, (dtype, count) in enumerate(plan)]]
    refs = [reference(arrs, "sum") for arrs in data[0]]
    mine = [[arrs[i] for arrs in data[0]] for i in range(n)]

    def run(i: int) -> list[object]:
        out = []
        for k, x in enumerate(mine[i]):
            out.append(engines[i].allreduce(x, "sum", Fingerprint("c", k, "sum", str(x.dtype), x.size)))
        return out

    try:
        res = run_all([lambda i=i: run(i) for i in range(n)], 60)
        assert not any(isinstance(r, BaseException) for r in res), res
        for k, ref in enumerate(refs):
            check([r[k] for r in res], [mine[i][k] for i in range(n)], ref, "sum")  # type: ignore[index]
    finally:
        close_all(engines)


@pytest.mark.parametrize("prefs", [(), ("no_such_cc", "reno")])
def test_links_use_the_congestion_control_asked_for_at_both_ends(prefs: tuple[str, ...]) -> None:
    """Every link of every node (each end sets its own) runs the first allowed control of
    ``tcp_congestion``; without one the links keep the system default.  The op still works."""
    import socket

    from fireflyer.wire.conn import congestion_of

    with socket.socket() as fresh:
        want = "reno" if prefs else congestion_of(fresh)
    engines = make_engines(3, tcp_congestion=prefs)
    try:
        links = [c for e in engines for c in e.link_congestion().values()]
        assert len(links) == 8  # 2 edges per tree, 2 trees, an end at each node
        assert set(links) == {want}, links
        arrs = [np.full(5000, i + 1, dtype=np.float32) for i in range(3)]
        res = allreduce_all(engines, arrs, "sum")
        assert all(isinstance(r, OpStats) for r in res), res
        assert all(np.all(a == 6) for a in arrs)
    finally:
        close_all(engines)


def test_engine_threads_carry_their_names_in_the_kernel() -> None:
    """top -H / perf / /proc show which engine thread is which (not 15 threads called python)."""
    import os
    import threading
    import time

    def names() -> dict[str, str]:
        comms = {}
        for th in threading.enumerate():
            if th.name.startswith("hfr-") and th.native_id is not None and th.is_alive():
                with open(f"/proc/{os.getpid()}/task/{th.native_id}/comm") as f:
                    comms[th.name] = f.read().strip()
        return comms

    engines = make_engines(3)
    try:
        # each thread names itself as it starts: one just started may not have yet
        deadline = time.monotonic() + 10
        while "python" in (comms := names()).values() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert comms["hfr-up-0-t1"] == "up-0-t1" and comms["hfr-fill-2"] == "fill-2"
        assert sum(c.startswith("read-") for c in comms.values()) == 8, comms  # a reader per link end
        assert all(c == n.removeprefix("hfr-")[:15] for n, c in comms.items()), comms
    finally:
        close_all(engines)


def test_link_congestion_of_a_closed_engine_is_unknown_not_an_error() -> None:
    engines = make_engines(2, tcp_congestion=("reno",))
    assert [e.congestion_summary() for e in engines] == [["reno"], ["reno"]]
    close_all(engines)
    assert [e.congestion_summary() for e in engines] == [["?"], ["?"]]  # (worker.info() may ask any time)
