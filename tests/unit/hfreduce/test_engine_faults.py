"""NodeEngine failures: mismatched fingerprints, a sleeping node, missing peers, bad tokens, abort."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from engine_util import allreduce_all, close_all, make_engines, odd_one_out, run_all

from fireflyer.core.errors import Unauthenticated
from fireflyer.hfreduce.errors import (
    CollectiveAborted,
    CollectiveTimeout,
    FingerprintMismatch,
    HFReduceError,
    PeerLost,
)
from fireflyer.hfreduce.types import Fingerprint, OpStats


@pytest.mark.parametrize("count", [1000, 20000])  # one chunk per tree (inline path), many chunks
@pytest.mark.parametrize("what", ["count", "dtype", "seq", "op", "root"])
@pytest.mark.parametrize("n", [4, 2])  # two nodes: small ops are an exchange, checked on both sides
def test_fingerprint_mismatch_fails_every_node(what: str, count: int, n: int) -> None:
    bad = n // 2
    engines = make_engines(n)
    try:
        arrs, fps = odd_one_out(what, n, bad, count)
        ops = [fp.op for fp in fps]
        t0 = time.monotonic()
        res = run_all([lambda i=i: engines[i].allreduce(arrs[i], ops[i], fps[i]) for i in range(n)], 20)
        assert time.monotonic() - t0 < 5
        # every node fails with a mismatch naming the node whose fingerprint differs from its own
        assert all(isinstance(r, FingerprintMismatch) for r in res), res
        for i in range(n):
            if i != bad:
                assert res[i].peer == bad, res[i]
                assert res[i].ours == str(fps[i]) and res[i].theirs == str(fps[bad])
                assert f"node {bad}" in str(res[i])
        assert res[bad].peer != bad and res[bad].ours == str(fps[bad])
        # the engine is dead afterwards, with the same error
        with pytest.raises(HFReduceError):
            engines[0].allreduce(arrs[0], "sum", Fingerprint("c", 9, "sum", "float32", count))
    finally:
        close_all(engines)


@pytest.mark.parametrize("n,sleeper,count", [(4, 3, 20000), (5, 0, 20000), (5, 2, 20000), (5, 2, 10)])
def test_sleeping_node_is_named_within_deadline(n: int, sleeper: int, count: int) -> None:
    engines = make_engines(n, timeout_s=10)
    try:
        arrs = [None if i == sleeper else np.ones(count, dtype=np.float32) for i in range(n)]
        deadline = 1.0
        t0 = time.monotonic()
        res = allreduce_all(engines, arrs, "sum", deadline_s=deadline, join_s=deadline + 5)
        took = time.monotonic() - t0
        assert took < deadline + 2, took
        for i, r in enumerate(res):
            if i == sleeper:
                continue
            assert isinstance(r, CollectiveTimeout | CollectiveAborted), (i, r)
            if isinstance(r, CollectiveTimeout):
                assert r.peer == sleeper, r
                assert f"node {sleeper}" in str(r)
            else:
                assert r.culprit == sleeper, r
        assert any(isinstance(r, CollectiveTimeout) for r in res)
        # the sleeper wakes up: it fails too instead of hanging
        x = np.ones(20000, dtype=np.float32)
        with pytest.raises(HFReduceError):
            engines[sleeper].allreduce(x, "sum", Fingerprint("c", 0, "sum", "float32", x.size), deadline_s=2)
    finally:
        close_all(engines)


def test_start_names_the_missing_peer() -> None:
    n, missing = 3, 1
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeout) as ei:
        make_engines(n, timeout_s=1.0, skip=[missing])
    assert time.monotonic() - t0 < 4
    assert ei.value.phase == "connect" and ei.value.peer == missing
    assert str(missing) in ei.value.missing.split(",")


def test_start_with_a_wrong_token_fails() -> None:
    engines = make_engines(2, timeout_s=1.5, start=False, tokens=["right", "wrong"])
    try:
        res = run_all([e.start for e in engines], 10)
        assert all(isinstance(r, CollectiveTimeout | Unauthenticated) for r in res), res
        assert any(isinstance(r, Unauthenticated) for r in res)
    finally:
        close_all(engines)


def test_abort_propagates_to_idle_and_busy_nodes() -> None:
    engines = make_engines(5)
    try:
        engines[4].abort("operator asked")
        x = np.ones(10, dtype=np.float32)
        for e in engines[:4]:
            with pytest.raises(CollectiveAborted) as ei:
                t0 = time.monotonic()
                while True:  # the abort floods asynchronously; it arrives within moments
                    e.allreduce(x, "sum", Fingerprint("c", 0, "sum", "float32", 10), deadline_s=0.5)
                    assert time.monotonic() - t0 < 3
            assert ei.value.origin == 4 and "operator asked" in ei.value.reason
    finally:
        close_all(engines)


def test_closed_peer_makes_idle_engine_fail_cleanly() -> None:
    engines = make_engines(3)
    try:
        engines[1].close()
        x = np.ones(10, dtype=np.float32)
        with pytest.raises((CollectiveAborted, PeerLost)):
            t0 = time.monotonic()
            while time.monotonic() - t0 < 3:
                engines[0].allreduce(x, "sum", Fingerprint("c", 0, "sum", "float32", 10), deadline_s=0.5)
    finally:
        close_all(engines)


def test_a_peer_closing_between_ops_is_not_logged_as_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    """Nodes close one after the other at the end of a job: the ones still open record the
    close (their next call fails) but log no "engine failed" line, which read like a fault."""
    engines = make_engines(3)
    try:
        allreduce_all(engines, [np.ones(10, dtype=np.float32) for _ in engines], "sum")
        with caplog.at_level("DEBUG"):
            engines[1].close()
            t0 = time.monotonic()
            while not all(e.failed for e in engines) and time.monotonic() - t0 < 5:
                time.sleep(0.01)
        assert all(e.failed for e in engines)
        assert "closed its engine" in str(engines[0].failed)
        assert not [r for r in caplog.records if "engine failed" in r.getMessage()]
    finally:
        close_all(engines)


@pytest.mark.parametrize(("kind", "logged"), [("close", False), ("allreduce", True)])
def test_a_peer_closing_during_our_close_collective_is_not_logged(caplog: pytest.LogCaptureFixture, kind: str,
                                                                  logged: bool) -> None:
    """The node that finishes the last (``close``) collective first closes its engine while a peer
    may still be inside that op (its final chunk is on another link): not a fault.  During any
    other op the same abort is one, and is logged."""
    from types import SimpleNamespace

    engines = make_engines(2)
    try:
        e0 = engines[0]
        with e0._mu:  # white box: node 0 is inside an op of this kind when node 1 closes
            e0._in_op = True
            # inline: the engine's threads sit it out (a woken fill thread reads the flag; without
            # it one crashed on the stand-in, and the engine failed with that instead, once in CI)
            e0._op = SimpleNamespace(fp=Fingerprint("c", 5, "sum", "int32", 1, kind=kind), k=5, inline=True)
            e0._post_cv.notify_all()  # wake them now, so that they look at it before the close
        time.sleep(0.05)
        assert e0.failed is None
        with caplog.at_level("DEBUG"):
            engines[1].close()
            t0 = time.monotonic()
            while e0.failed is None and time.monotonic() - t0 < 5:
                time.sleep(0.01)
        assert e0.failed is not None and "closed its engine" in str(e0.failed)
        assert bool([r for r in caplog.records if "engine failed" in r.getMessage()]) is logged
    finally:
        with engines[0]._mu:
            engines[0]._in_op, engines[0]._op = False, None
        close_all(engines)


@pytest.mark.parametrize("bad_count,count", [(10, 20000), (20000, 10)])  # a small op against a large one
@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_small_op_against_a_large_one_is_a_mismatch_on_every_node(bad_count: int, count: int, n: int) -> None:
    """Small ops' frames go to the ring, large ops' are parked for the up thread: meeting the
    other kind is reported as the fingerprint mismatch it is, not a timeout."""
    bad = n - 1
    engines = make_engines(n)
    try:
        arrs = [np.ones(bad_count if i == bad else count, dtype=np.float32) for i in range(n)]
        t0 = time.monotonic()
        res = allreduce_all(engines, arrs, "sum", seq=3, join_s=20)
        assert time.monotonic() - t0 < 5
        assert all(isinstance(r, FingerprintMismatch) for r in res), res
        assert all(r.peer == bad for i, r in enumerate(res) if i != bad), res
    finally:
        close_all(engines)


def _when_streaming(engine: object, then: object) -> threading.Thread:
    """Call ``then()`` once one of ``engine``'s block loops has moved a few blocks (white box:
    the loops' status arrays), so it lands in the middle of the halves."""
    from fireflyer.hfreduce import _blocks as B

    def body() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            bufs = [*engine._up_bufs, *engine._down_bufs.values()]  # type: ignore[attr-defined]
            if any(b.busy and b.io[B.IO_DONE] >= 4 for b in bufs):
                break
            time.sleep(0.0005)
        then()  # type: ignore[operator]

    th = threading.Thread(target=body, daemon=True)
    th.start()
    return th


def _streaming_all(engines: list, count: int, seq: int = 0, **kw: object) -> list[object]:
    """Every engine allreduces ``count`` float32 (a streamed op: one frame per tree half)."""
    arrs = [np.ones(count, dtype=np.float32) for _ in engines]
    assert all(e.can_stream(a) for e, a in zip(engines, arrs, strict=True))
    return allreduce_all(engines, arrs, "sum", seq=seq, join_s=30, **kw)


@pytest.mark.parametrize("n,who", [(2, 0), (3, 1), (5, 2), (5, 4)])
def test_an_abort_in_the_middle_of_streamed_halves_reaches_every_node_with_its_reason(n: int, who: int) -> None:
    """The aborting node ends the frames it is sending with an aborted block: its peers stop at
    that block, read the abort frame behind it and report the origin and reason."""
    engines = make_engines(n, chunk_bytes=1 << 20)
    try:
        for e in engines:
            e.block_bytes = 64 << 10  # many blocks per half: the abort lands mid-frame
        count = (48 << 20) // 4
        t0 = time.monotonic()
        aborter = _when_streaming(engines[who], lambda: engines[who].abort("operator asked"))
        res = _streaming_all(engines, count)
        aborter.join()
        assert time.monotonic() - t0 < 10
        assert all(isinstance(r, HFReduceError) for r in res), res
        for i, r in enumerate(res):
            if i == who:
                continue
            assert isinstance(r, CollectiveAborted), (i, r)
            assert r.origin == who and "operator asked" in r.reason, r
    finally:
        close_all(engines)


@pytest.mark.parametrize("n,who", [(2, 1), (3, 0)])
def test_a_node_that_aborts_and_closes_mid_stream_is_reported_with_its_reason(n: int, who: int) -> None:
    """The worker's case when one of its ranks dies: the node aborts and closes the
    communicator at once.  Its peers' up loops then fail their sends (reset) while the abort
    frame still waits on the socket for the readers; here the readers are slowed so that the
    send error always comes first.  The peers must still report the abort and its reason."""
    engines = make_engines(n, chunk_bytes=1 << 20)
    try:
        for i, e in enumerate(engines):
            e.block_bytes = 64 << 10
            if i != who:
                real = e._on_abort

                def slow(lk: object, hdr: object, real: object = real) -> None:
                    time.sleep(0.3)  # the reader is late: the up loop's EPIPE/ECONNRESET comes first
                    real(lk, hdr)  # type: ignore[operator]

                e._on_abort = slow

        def abort_and_close() -> None:
            engines[who].abort("rank 3 died")
            engines[who].close()

        closer = _when_streaming(engines[who], abort_and_close)
        res = _streaming_all(engines, (48 << 20) // 4)
        closer.join()
        for i in range(n):
            if i == who:
                continue
            assert isinstance(res[i], CollectiveAborted), (i, res[i])
            assert res[i].origin == who and "rank 3 died" in res[i].reason, res[i]
    finally:
        close_all(engines)


def test_a_node_closed_in_the_middle_of_streamed_halves_is_named_by_the_others() -> None:
    n, victim = 3, 2
    engines = make_engines(n, chunk_bytes=1 << 20)
    try:
        for e in engines:
            e.block_bytes = 64 << 10
        closer = _when_streaming(engines[victim], engines[victim].close)
        t0 = time.monotonic()
        res = _streaming_all(engines, (48 << 20) // 4)
        closer.join()
        assert time.monotonic() - t0 < 10
        for i in range(n - 1):
            assert isinstance(res[i], PeerLost | CollectiveAborted), (i, res[i])
            culprit = res[i].peer if isinstance(res[i], PeerLost) else res[i].origin
            assert culprit == victim, (i, res[i])
    finally:
        close_all(engines)


def test_a_streamed_op_longer_than_the_timeout_is_not_a_stall_while_its_blocks_move() -> None:
    """``timeout_s`` bounds a wait *without progress*: a half moving block by block is progress,
    though it is a single frame and the Python threads see nothing of it until it ends."""
    engines = make_engines(3, timeout_s=5.0, chunk_bytes=1 << 20)
    try:
        for e in engines:  # (set after connecting, which gets the usual time)
            e.block_bytes = 16 << 10
            e.timeout_s = 0.1
            e.grace_s = 0.05  # without progress the op would fail 0.15 s in
        # the op must last at least twice the no-progress limit to show anything: 192 MiB takes
        # 0.3-0.5 s on a fast 2-core VM, so a machine that moves it quicker gets a bigger one
        count, took = (192 << 20) // 4, 0.0
        for seq in range(3):
            t0 = time.monotonic()
            res = _streaming_all(engines, count, seq=seq)
            took = time.monotonic() - t0
            assert all(isinstance(r, OpStats) for r in res), (count * 4, res)
            if took > 0.3:
                break
            count *= 2
        assert took > 0.3, f"an op of {count * 4 >> 20} MiB took {took:.2f} s: too quick to show anything"
    finally:
        close_all(engines)


@pytest.mark.parametrize("other", [{"block_bytes": 128 << 10}, {"streaming": False}, {"chunk_bytes": 8192},
                                   {"express_bytes": 1 << 10}])
def test_nodes_that_cut_buffers_differently_refuse_to_connect_and_say_why(other: dict[str, object],
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed op's frames carry blocks of the sender's block size; a node with another block
    size, streaming off or another chunk size would misread them, and one with another express
    limit (another version) would send express frames where the other runs the engine: the
    handshake refuses it."""
    import socket

    import fireflyer.hfreduce.engine as engine_mod
    from fireflyer.hfreduce.engine import NodeEngine

    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    addrs = [f"127.0.0.1:{s.getsockname()[1]}" for s in listeners]
    base = {"chunk_bytes": 4096, "block_bytes": 256 << 10}
    engines = []
    for i in range(2):
        kw = dict(base) if i == 0 else {**base, **other}
        if "express_bytes" in kw:
            monkeypatch.setattr(engine_mod, "EXPRESS_BYTES", kw.pop("express_bytes"))
        engines.append(NodeEngine(node_rank=i, addresses=addrs, listen=listeners[i], timeout_s=2, token="t", **kw))
    try:
        res = run_all([lambda e=e: e.start(2) for e in engines], 15)
        assert all(isinstance(r, HFReduceError | Unauthenticated) for r in res), res
        assert any("configuration differs" in str(r) for r in res), res  # the child is told why
    finally:
        close_all(engines)


@pytest.mark.parametrize("count", [1000, 20000])  # small and large
def test_nodes_reducing_different_narrow_dtypes_are_a_mismatch(count: int) -> None:
    """bfloat16 and float32 (or float16) ops both carry float32 partials: the fingerprint's dtype
    (the ranks' own) is what tells the nodes apart."""
    engines = make_engines(3)
    try:
        fps = [Fingerprint("c", 4, "sum", d, count) for d in ("bfloat16", "bfloat16", "float16")]
        arrs = [np.ones(count, dtype=np.float32) for _ in range(3)]
        res = allreduce_all(engines, arrs, "sum", fps=fps, join_s=20)
        assert all(isinstance(r, FingerprintMismatch) for r in res), res
        assert "float16" in str(res[0]) and "bfloat16" in str(res[0]), res[0]
    finally:
        close_all(engines)


def test_an_acceptor_whose_listener_closed_before_its_thread_ran_ends_quietly() -> None:
    """An engine whose start fails at once closes its listener, maybe before the accept thread
    first runs: the thread must end without an exception (it once raised EBADF there)."""
    import socket

    from fireflyer.hfreduce._links import Acceptor
    from fireflyer.wire.frame import FrameLimits

    errors: list[BaseException] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)  # type: ignore[assignment]
    try:
        listener = socket.create_server(("127.0.0.1", 0))
        acceptor = Acceptor(listener, me=0, nnodes=2, layout="x", token="t", expected={(1, 0)},
                            limits=FrameLimits(), buf_bytes=None, on_link=lambda c, t, fs: None)
        listener.close()
        acceptor.thread.start()
        acceptor.thread.join(5)
        assert not acceptor.thread.is_alive()
    finally:
        threading.excepthook = hook
    assert errors == []
