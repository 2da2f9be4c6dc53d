"""Worker telemetry: status() shows pending ops with their phase and missing ranks, finished
ops with arrivals and timings; batches reach NATS on ff.coord.v1.comm.<id>.telemetry.

The worker runs in this process (its own threads) and the ranks are threads too: the
control socket and shared memory are the same as across processes.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

from fireflyer.bus.connection import Bus
from fireflyer.bus.subjects import subject
from fireflyer.hfreduce import init
from fireflyer.hfreduce.settings import WorkerSettings
from fireflyer.hfreduce.shm import list_segments
from fireflyer.hfreduce.telemetry import TelemetryBatch, comm_token
from fireflyer.hfreduce.worker import Worker
from fireflyer.testing.poll import wait_for, wait_until


def _ranks(sock: str, job: str, k: int = 2, *, op_records: bool = True) -> list:
    out: list = [None] * k

    def one(i: int) -> None:
        out[i] = init(rank=i, world_size=k, local_rank=i, local_world_size=k, node_rank=0, nnodes=1, socket=sock,
                      job_id=job, timeout_s=10, op_records=op_records and i == 0)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(k)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    return out


async def test_worker_status_and_nats_telemetry(nats_settings, bus: Bus) -> None:
    sock = tempfile.mktemp(prefix="hfr", suffix=".sock", dir="/tmp")
    w = Worker(node_rank=0, nnodes=1, local_world_size=2, socket_path=sock,
               settings=WorkerSettings(nats_url=nats_settings.url, telemetry_interval_s=0.1, chunk_size="4k"))
    got: list[TelemetryBatch] = []

    async def on_batch(ev: TelemetryBatch, _msg: object) -> None:
        got.append(ev)

    await bus.subscribe(subject("coord", "comm", comm_token("tele/default"), "telemetry"), on_batch,
                        types=TelemetryBatch)
    w.start()
    try:
        c0, c1 = await asyncio.to_thread(_ranks, sock, "tele")
        # rank 0 alone: the op waits for local rank 1, and status says so
        x0 = np.ones(10000, np.float32)
        work = c0.allreduce(x0, async_op=True)
        st = await asyncio.to_thread(c0.status)
        assert st.rank_pending == [0]
        (p,) = st.pending
        assert p.phase == "waiting_ranks" and p.missing == [1] and list(p.arrivals) == [0]
        x1 = np.full(10000, 2, np.float32)
        await asyncio.to_thread(c1.allreduce, x1)
        assert await asyncio.to_thread(work.wait, 10) is x0 and np.all(x0 == 3)
        for _ in range(3):
            await asyncio.gather(asyncio.to_thread(c0.allreduce, x0), asyncio.to_thread(c1.allreduce, x1))
        st = await asyncio.to_thread(c1.status)
        assert [r.seq for r in st.recent] == [0, 1, 2, 3] and st.pending == []
        r = st.recent[0]
        assert r.phase == "done" and sorted(r.arrivals) == [0, 1] and r.nbytes == 40000
        assert r.finished_at >= max(r.arrivals.values()) and r.local_reduce_s > 0
        assert work.record is not None and work.record.seq == 0
        # only the rank that asked (init(op_records=True)) gets the records in its replies
        w0 = c0.allreduce(x0, async_op=True)
        w1 = c1.allreduce(x1, async_op=True)
        await asyncio.to_thread(w0.wait, 10)
        await asyncio.to_thread(w1.wait, 10)
        assert w0.record is not None and w0.record.seq == 4 and w0.record.phase == "done"
        assert w1.record is None
        await wait_for(lambda: sum(len(b.records) for b in got) >= 4, timeout_s=10, what="4 records on NATS")
        assert got[0].comm == "tele/default" and got[0].node_rank == 0
        assert [rec.seq for b in got for rec in b.records][:4] == [0, 1, 2, 3]
        c0.close()
        c1.close()
        wait_until(lambda: not w.info()["comms"], timeout_s=5, what="communicator retired")
    finally:
        w.stop()
    assert list_segments() == []



def test_worker_stop_ends_its_accept_thread() -> None:
    """stop() must wake the thread blocked in accept(): closing the socket alone does not."""
    sock = tempfile.mktemp(prefix="hfr", suffix=".sock", dir="/tmp")
    before = set(threading.enumerate())
    w = Worker(node_rank=0, nnodes=1, local_world_size=1, socket_path=sock, settings=WorkerSettings())
    w.start()
    mine = [t for t in set(threading.enumerate()) - before if t.name == "hfr-accept"]
    assert mine, "the worker did not start its accept thread"
    w.stop()
    for t in mine:
        t.join(timeout=5.0)
    assert not [t for t in mine if t.is_alive()]
    assert not Path(sock).exists()


def test_small_ops_run_on_the_last_ranks_thread_and_large_ones_on_the_op_thread() -> None:
    """Ops up to FAST_OP_BYTES skip the hand-off to the op thread; results are the same either way."""
    from fireflyer.hfreduce.nodecomm import FAST_OP_BYTES

    sock = tempfile.mktemp(prefix="hfr", suffix=".sock", dir="/tmp")
    w = Worker(node_rank=0, nnodes=1, local_world_size=2, socket_path=sock, settings=WorkerSettings())
    w.start()
    try:
        comms = _ranks(sock, "fast-path")
        small, large = FAST_OP_BYTES // 4, FAST_OP_BYTES // 4 + 1
        results: list = [None, None]

        def run(i: int) -> None:
            got = []
            for n in (small, 1, large, 7, large):
                x = np.full(n, float(i + 1), np.float32)
                comms[i].allreduce(x)
                got.append(x)
            comms[i].barrier()
            results[i] = got

        ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        for got in results:
            assert got is not None and all((x == 3.0).all() for x in got)
        # the ranks are released as soon as the result is in place; the worker's own bookkeeping follows
        wait_until(lambda: next(iter(w.info()["comms"].values()))["next_seq"] == 6, timeout_s=5,
                   what="the worker finished op 5")
        info = next(iter(w.info()["comms"].values()))
        # the two large ops went to the op thread; the small ones ran on a rank's thread, except that
        # a small op whose ranks arrived while the op thread ran a large one may be run by it (no hand-off)
        assert 2 <= info["fast_ops"] <= 4, info
        for c in comms:
            c.close()
    finally:
        w.stop()


def test_ranks_read_their_replies_on_the_waiting_thread_and_polling_alone_completes_ops() -> None:
    """No reader thread per communicator: wait() reads the Done itself, is_completed() polls, and
    a rank that only submits async ops drains the replies as it goes."""
    sock = tempfile.mktemp(prefix="hfr", suffix=".sock", dir="/tmp")
    w = Worker(node_rank=0, nnodes=1, local_world_size=1, socket_path=sock, settings=WorkerSettings())
    w.start()
    try:
        before = {t.ident for t in threading.enumerate()}
        (c,) = _ranks(sock, "no-reader", k=1)
        # (the worker runs in this process too: its threads are named hfr-rank / hfr-comm)
        assert not [t.name for t in threading.enumerate() if t.ident not in before
                    and not t.name.startswith(("hfr-rank", "hfr-comm"))]
        x = c.zeros(4, np.float32)
        x[:] = 3
        work = c.allreduce(x, async_op=True)
        wait_until(work.is_completed, timeout_s=10, what="an async op completed by polling alone")
        assert work.wait(0) is x and np.all(x == 3) and work.record is not None
        works = [c.allreduce(np.full(3, float(i), np.float32), async_op=True) for i in range(2000)]
        assert sum(wk.is_completed() for wk in works[:1000]) > 0, "submits drain the replies that arrived"
        assert all(np.all(wk.wait(10) == i) for i, wk in enumerate(works))
        assert c.status().pending == []
        c.close()
    finally:
        w.stop()


def test_ops_on_alternating_buffers_and_views_find_their_own_bytes() -> None:
    """The rank remembers the buffer it found last, and the worker its last view of a segment:
    switching buffers, views of one buffer and dtypes op after op must never reuse a stale one."""
    sock = tempfile.mktemp(prefix="hfr", suffix=".sock", dir="/tmp")
    w = Worker(node_rank=0, nnodes=1, local_world_size=2, socket_path=sock, settings=WorkerSettings())
    w.start()
    try:
        comms = _ranks(sock, "alternate", k=2)
        bufs = [[c.zeros(16, np.float32), c.zeros(16, np.float32), c.zeros(16, np.int32)] for c in comms]
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                a, b, n = bufs[i]
                for step in range(30):
                    a[:], b[:], n[:] = step + i, 100 + step + i, 1000 + step + i
                    x = (a, b, a[4:], a[1:9], n)[step % 5]
                    before = [a.copy(), b.copy(), n.copy()]
                    comms[i].allreduce(x)
                    want = before[[0, 1, 0, 0, 2][step % 5]]
                    sl = [slice(None), slice(None), slice(4, None), slice(1, 9), slice(None)][step % 5]
                    assert np.array_equal(x, (want[sl] - i) * 2 + 1), (i, step)  # rank 0 has v, rank 1 v + 1
                    # nothing else changed
                    for buf, old in zip((a, b, n), before, strict=True):
                        if buf is not x and buf.base is not x.base:
                            assert np.array_equal(buf, old), (i, step)
            except BaseException as e:  # noqa: BLE001 - reported by the test thread
                errors.append(e)

        ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not errors, errors
        for c in comms:
            c.close()
    finally:
        w.stop()


def test_ranks_closing_right_after_their_last_op_do_not_fail_it(caplog) -> None:
    """The ranks are released before the worker's bookkeeping of the op ends: a Bye that follows
    at once (from any rank) must find the op finished, not pending (which fails the communicator)."""
    from fireflyer.hfreduce.nodecomm import FAST_OP_BYTES

    sock = tempfile.mktemp(prefix="hfr", suffix=".sock", dir="/tmp")
    w = Worker(node_rank=0, nnodes=1, local_world_size=2, socket_path=sock, settings=WorkerSettings())
    w.start()
    try:
        with caplog.at_level("DEBUG"):
            for job in range(15):
                comms = _ranks(sock, f"quick-close-{job}")
                n = (4, FAST_OP_BYTES)[job % 2]  # a rank's thread or the op thread runs it

                def run(c, n=n) -> None:  # type: ignore[no-untyped-def]
                    x = np.ones(n // 4, np.float32)
                    c.allreduce(x)
                    assert (x == 2).all()
                    c.close()

                ts = [threading.Thread(target=run, args=(c,)) for c in comms]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join(20)
                wait_until(lambda: not w.info()["comms"], timeout_s=5, what="communicator retired")
        failed = [r.getMessage() for r in caplog.records if "comm_failed" in r.getMessage()]
        assert not failed, failed
    finally:
        w.stop()


def test_ops_become_spans_once_tracing_is_set_up(monkeypatch) -> None:
    """An op is an ``hfreduce.<kind>`` span with its phase times when tracing is on (decided once,
    by refresh_tracing, not per op); with tracing off the worker makes none."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import fireflyer.telemetry as ff_telemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()  # a private provider: the process-wide one stays as it is
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(ff_telemetry, "tracer", lambda name: provider.get_tracer(name))
    sock = tempfile.mktemp(prefix="hfr", suffix=".sock", dir="/tmp")
    w = Worker(node_rank=0, nnodes=1, local_world_size=1, socket_path=sock, settings=WorkerSettings())
    w.start()
    try:
        (c,) = _ranks(sock, "spans", k=1)
        w.tracing = False
        c.allreduce(np.ones(8, np.float32))
        w.tracing = True
        c.allreduce(np.ones(8, np.float32))
        c.barrier()
        wait_until(lambda: len(exporter.get_finished_spans()) >= 2, timeout_s=5, what="two spans")
        spans = exporter.get_finished_spans()
        assert [s.name for s in spans] == ["hfreduce.allreduce", "hfreduce.barrier"]
        a = spans[0].attributes
        assert a["hfreduce.seq"] == 1 and a["hfreduce.count"] == 8 and a["hfreduce.dtype"] == "float32"
        assert a["hfreduce.comm"] == "spans/default" and "hfreduce.local_reduce_s" in a
        c.close()
    finally:
        w.stop()


def _two_node_workers(settings: WorkerSettings) -> tuple[list[Worker], list[str]]:
    """Two started workers (nodes 0 and 1, one local rank each) in this process; their sockets."""
    socks = [tempfile.mktemp(prefix="hfr", suffix=".sock", dir="/tmp") for _ in range(2)]
    listeners = [__import__("socket").create_server(("127.0.0.1", 0)) for _ in range(2)]
    peers = [f"127.0.0.1:{s.getsockname()[1]}" for s in listeners]
    for s in listeners:
        s.close()
    ws = [Worker(node_rank=i, nnodes=2, local_world_size=1, socket_path=socks[i], peers=peers, settings=settings)
          for i in range(2)]
    for w in ws:
        w.start()
    return ws, socks


def _stop(ws: list[Worker]) -> None:
    for w in ws:
        w.stop()


def _two_ranks(socks: list[str], job: str, sizes: tuple[int, ...], **init_kw: object) -> list:
    """One rank per node (threads here), each allreducing ``i + 1`` over each size in turn; the
    communicators, which the caller closes."""
    comms: list = [None, None]

    def rank(i: int) -> None:
        comms[i] = init(rank=i, world_size=2, local_rank=0, local_world_size=1, node_rank=i, nnodes=2,
                        socket=socks[i], job_id=job, timeout_s=10, **init_kw)
        for n in sizes:
            x = np.full(n, i + 1, np.float32)
            comms[i].allreduce(x, async_op=True).wait(10)
            assert np.all(x == 3)

    ts = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert all(c is not None for c in comms)
    return comms


def test_two_workers_links_use_the_configured_congestion_control_and_send_buffer() -> None:
    """FF_HFREDUCE_TCP_CONGESTION, FF_HFREDUCE_SEND_BUF_SIZE and FF_HFREDUCE_EXPRESS_POLL_US reach
    the engine: an unknown name is skipped, reno (allowed to every process) is used on every link,
    every link's SO_SNDBUF is the one asked for (doubled by the kernel), the express link polls
    as long as asked, and the worker's info() says so."""
    ws, socks = _two_node_workers(WorkerSettings(tcp_congestion="no_such_cc,reno", chunk_size="4k",
                                                 send_buf_size="96K", express_poll_us=50))
    try:
        comms = _two_ranks(socks, "cc", (100000,))
        for w in ws:
            (info,) = w.info()["comms"].values()
            assert info["congestion"] == ["reno"], info
            assert info["send_buffers"] == [2 * 96 * 1024], info
            assert info["express_poll_us"] == pytest.approx(50), info
        for c in comms:
            c.close()
    finally:
        _stop(ws)
    assert list_segments() == []


def test_two_node_small_allreduces_go_express_with_records_and_spans(monkeypatch) -> None:
    """Two workers (in this process), one rank each, tracing on: small allreduces take the express
    path (info counts them), each is an ``hfreduce.allreduce`` span with its times, and its record
    has the exchange as tree 0's phase and the peer's bytes; a large one takes the engine."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import fireflyer.telemetry as ff_telemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(ff_telemetry, "tracer", lambda name: provider.get_tracer(name))
    ws, socks = _two_node_workers(WorkerSettings(chunk_size="64k"))
    for w in ws:
        w.tracing = True
    try:
        comms = _two_ranks(socks, "xp", (3, 3, 40000), op_records=True)  # two express ops, one too large
        for w in ws:
            (info,) = w.info()["comms"].values()
            assert info["express_ops"] == 2, info
        rec = comms[0].status().recent[1]
        assert rec.seq == 1 and rec.phase == "done" and rec.stats is not None
        assert rec.stats.peers[1].bytes_sent == 12 and rec.stats.peers[1].bytes_received == 12
        assert rec.stats.trees[0].up_s > 0 and rec.tree_s > 0
        wait_until(lambda: len(exporter.get_finished_spans()) >= 6, timeout_s=5, what="six spans")
        spans = [s for s in exporter.get_finished_spans() if s.attributes["hfreduce.node"] == 0]
        assert [s.attributes["hfreduce.seq"] for s in spans] == [0, 1, 2]
        assert all(s.name == "hfreduce.allreduce" and s.end_time >= s.start_time for s in spans)
        assert spans[0].attributes["hfreduce.tree_s"] > 0
        for c in comms:
            c.close()
    finally:
        _stop(ws)
    assert list_segments() == []


async def test_a_failed_op_reaches_nats_at_once_not_at_the_end_of_the_interval(nats_settings, bus: Bus) -> None:
    """When coord aborts the communicator, the op in flight is published as failed right away: it is
    what the health service judges a hang by, and a failing worker may be stopped within the interval."""
    sock = tempfile.mktemp(prefix="hfr", suffix=".sock", dir="/tmp")
    w = Worker(node_rank=0, nnodes=1, local_world_size=2, socket_path=sock,
               settings=WorkerSettings(nats_url=nats_settings.url, telemetry_interval_s=30.0, chunk_size="4k"))
    got: list[TelemetryBatch] = []

    async def on_batch(ev: TelemetryBatch, _msg: object) -> None:
        got.append(ev)

    await bus.subscribe(subject("coord", "comm", comm_token("abrt/default"), "telemetry"), on_batch,
                        types=TelemetryBatch)
    w.start()
    try:
        c0, c1 = await asyncio.to_thread(_ranks, sock, "abrt")
        x0 = np.ones(1000, np.float32)
        work = c0.allreduce(x0, async_op=True)  # rank 1 never comes: the op waits
        await wait_for(lambda: w.ring_pending(next(iter(w._comms.values()))) == [0], timeout_s=5,
                       what="the op pending in the worker")
        w.coord_aborted("node n2 missed heartbeats", "n2")
        with pytest.raises(Exception, match="aborted by the coordination service"):
            await asyncio.to_thread(work.wait, 10)
        await wait_for(lambda: any(r.phase == "failed" for b in got for r in b.records), timeout_s=5,
                       what="the failed op's record on NATS well inside the 30 s interval")
        (rec,) = [r for b in got for r in b.records]
        assert rec.seq == 0 and rec.missing == [1] and "missed heartbeats" in rec.error
        c0.close()
        c1.close()
    finally:
        w.stop()
