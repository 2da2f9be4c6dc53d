"""The asyncio wire peers: FrameSplitter alone, then AioWireServer and AioConnection over loopback."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from fireflyer.core.errors import (
    DeadlineExceeded,
    FsError,
    Internal,
    NotFound,
    ProtocolError,
    Unauthenticated,
    Unavailable,
)
from fireflyer.testing.poll import wait_for
from fireflyer.wire.aio import AioConnection, AioRequest, AioWireServer, FrameSplitter
from fireflyer.wire.frame import (
    MAGIC,
    PREFIX,
    VERSION,
    ErrorFrame,
    FrameLimits,
    Header,
    Hello,
    Request,
    Response,
    Welcome,
    decode_header,
    encode_head,
    parse_prefix,
)

TOKEN = "tok-alice"


def authenticate(token: str) -> str | None:
    return {"tok-alice": "alice", "tok-bob": "bob"}.get(token)


def frame(header: Header, payload: bytes = b"") -> bytes:
    return bytes(encode_head(header, len(payload))) + payload


async def echo(req: AioRequest) -> bytes:
    return req.payload


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[AioWireServer]]]:
    """``await serve(handler, **kw)`` -> a started server on 127.0.0.1; all stopped at teardown."""
    started: list[AioWireServer] = []

    async def make(handler: Callable[[AioRequest], Awaitable[bytes]], **kw: Any) -> AioWireServer:
        kw.setdefault("authenticate", authenticate)
        kw.setdefault("host", "127.0.0.1")
        server = AioWireServer(handler, **kw)
        await server.start()
        started.append(server)
        return server

    yield make
    for s in started:
        await s.stop()


@pytest.fixture
async def dial() -> AsyncIterator[Callable[..., Awaitable[AioConnection]]]:
    """``await dial(server, **kw)`` -> an AioConnection closed at teardown."""
    conns: list[AioConnection] = []

    async def make(server: AioWireServer, **kw: Any) -> AioConnection:
        kw.setdefault("token", TOKEN)
        kw.setdefault("timeout_s", 5.0)
        conn = await AioConnection.connect("127.0.0.1", server.port, **kw)
        conns.append(conn)
        return conn

    yield make
    for c in conns:
        c.close()


async def _close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


class AioRawPeer:
    """A hand-driven client, for frames a real AioConnection never sends."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> AioRawPeer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read_frame(self, timeout_s: float = 5.0) -> tuple[Header, bytes]:
        async with asyncio.timeout(timeout_s):
            hlen, plen = parse_prefix(await self.reader.readexactly(PREFIX.size), FrameLimits())
            header = decode_header(await self.reader.readexactly(hlen))
            return header, await self.reader.readexactly(plen)

    async def wait_closed(self, timeout_s: float = 5.0) -> None:
        """Read (and drop) until the server closes the stream; fails on timeout."""
        async with asyncio.timeout(timeout_s):
            try:
                while await self.reader.read(1 << 16):
                    pass
            except ConnectionResetError:
                pass

    async def close(self) -> None:
        await _close_writer(self.writer)


@pytest.fixture
async def raw_peer() -> AsyncIterator[Callable[[int], Awaitable[AioRawPeer]]]:
    peers: list[AioRawPeer] = []

    async def make(port: int) -> AioRawPeer:
        p = await AioRawPeer.open(port)
        peers.append(p)
        return p

    yield make
    for p in peers:
        await p.close()


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the running loop's exception handler (collected, not logged) until teardown.

    Futures whose exception nobody retrieved report it when they are collected; this collects them
    here rather than at some later, random point of the run (in CPython 3.11 a report that lands
    inside pytest's ``ast.parse`` of a traceback crashes the session with an INTERNALERROR).
    """
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    yield seen
    await _collect()
    loop.set_exception_handler(old)


async def _collect() -> None:
    """Let the loop drop what its callbacks still hold for one turn, then collect."""
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()


def _never_retrieved(contexts: list[dict[str, Any]]) -> list[str]:
    return [str(c.get("exception") or c.get("message")) for c in contexts
            if "never retrieved" in str(c.get("message", ""))]


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port bound on 127.0.0.1 but not listening: connecting to it is refused, every time."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


# -- FrameSplitter ------------------------------------------------------------------------------


def test_splitter_byte_by_byte_yields_the_frame_only_at_its_last_byte():
    data = frame(Request(rid=7, op="stat", meta={"path": "/a/b"}), b"payload!")
    sp = FrameSplitter(FrameLimits())
    for i, b in enumerate(data[:-1]):
        assert sp.feed(bytes([b])) == [], f"a frame came out after byte {i} of {len(data)}"
        assert sp.buffered == i + 1
    out = sp.feed(data[-1:])
    assert len(out) == 1
    header, payload = out[0]
    assert header == Request(rid=7, op="stat", meta={"path": "/a/b"})
    assert payload == b"payload!" and type(payload) is bytes
    assert sp.buffered == 0


def test_splitter_two_frames_in_one_feed_come_out_in_order():
    data = frame(Request(rid=1, op="a"), b"first") + frame(Response(rid=2, meta={"k": 1}), b"second!")
    sp = FrameSplitter(FrameLimits())
    out = sp.feed(data)
    assert [(h, p) for h, p in out] == [
        (Request(rid=1, op="a"), b"first"),
        (Response(rid=2, meta={"k": 1}), b"second!"),
    ]
    assert sp.buffered == 0


def test_splitter_frames_split_across_feeds():
    f1 = frame(Request(rid=1, op="one"), b"x" * 100)
    f2 = frame(Request(rid=2, op="two"), b"")  # an empty payload
    f3 = frame(Hello(token="t", client="c"), b"")
    data = f1 + f2 + f3
    sp = FrameSplitter(FrameLimits())
    # cut inside f1's prefix, inside its header, inside its payload, then one feed that ends f1,
    # holds all of f2 and starts f3
    cuts = [5, PREFIX.size + 3, len(f1) - 10, len(f1) + len(f2) + 7, len(data)]
    got: list[tuple[Header, bytes]] = []
    prev = 0
    per_feed = []
    for cut in cuts:
        out = sp.feed(data[prev:cut])
        per_feed.append(len(out))
        got += out
        prev = cut
        assert sp.buffered == cut - sum(len(f) for f in (f1, f2, f3)[: sum(per_feed)])
    assert per_feed == [0, 0, 0, 2, 1]
    assert got == [(Request(rid=1, op="one"), b"x" * 100), (Request(rid=2, op="two"), b""),
                   (Hello(token="t", client="c"), b"")]
    assert sp.buffered == 0


def test_splitter_keeps_only_the_incomplete_tail_buffered():
    f1 = frame(Request(rid=1, op="a"), b"abc")
    f2 = frame(Request(rid=2, op="b"), b"defgh")
    sp = FrameSplitter(FrameLimits())
    assert len(sp.feed(f1 + f2[:4])) == 1
    assert sp.buffered == 4  # f1 is gone; only f2's first bytes wait
    assert sp.feed(f2[4:]) == [(Request(rid=2, op="b"), b"defgh")]
    assert sp.buffered == 0


def test_splitter_bad_magic_is_a_protocol_error():
    sp = FrameSplitter(FrameLimits())
    bad = PREFIX.pack(b"HTTP", VERSION, 0, 12, 0) + b"x" * 12
    with pytest.raises(ProtocolError) as ei:
        sp.feed(bad)
    assert ei.value.fields["reason"] == "bad_magic"


def test_splitter_garbage_header_is_a_protocol_error():
    sp = FrameSplitter(FrameLimits())
    with pytest.raises(ProtocolError) as ei:
        sp.feed(PREFIX.pack(MAGIC, VERSION, 0, 12, 0) + b"\xc1" * 12)
    assert ei.value.fields["reason"] == "bad_header"


def test_splitter_rejects_an_oversized_payload_from_its_prefix_alone():
    limits = FrameLimits(max_payload_bytes=1000)
    head = bytes(encode_head(Request(rid=1, op="put"), 1001))  # the payload is never sent
    sp = FrameSplitter(limits)
    assert sp.feed(head[: PREFIX.size - 1]) == []  # 19 bytes: nothing to judge yet
    with pytest.raises(ProtocolError) as ei:
        sp.feed(head[PREFIX.size - 1: PREFIX.size])  # the 20th byte completes the prefix
    assert ei.value.fields["reason"] == "oversized_payload"
    assert ei.value.fields["size"] == 1001 and ei.value.fields["limit"] == 1000


def test_splitter_accepts_a_payload_exactly_at_the_limit():
    sp = FrameSplitter(FrameLimits(max_payload_bytes=1000))
    out = sp.feed(frame(Request(rid=1, op="put"), b"z" * 1000))
    assert out == [(Request(rid=1, op="put"), b"z" * 1000)]


# -- server and client over loopback ------------------------------------------------------------


async def test_round_trip_reaches_the_handler_and_returns_its_bytes(serve, dial):
    seen: list[AioRequest] = []

    async def handle(req: AioRequest) -> bytes:
        seen.append(req)
        return b"reply:" + req.payload

    server = await serve(handle, name="meta-test")
    conn = await dial(server, client_name="pytest")
    assert conn.principal == "alice" and conn.server == "meta-test"
    assert await conn.request("Stat", payload=b"/a/b", meta={"flags": 3}, timeout_s=5) == b"reply:/a/b"
    assert len(seen) == 1
    req = seen[0]
    assert req.op == "Stat" and req.payload == b"/a/b" and req.meta == {"flags": 3}
    assert req.principal == "alice"
    assert req.peer.startswith("127.0.0.1:") and req.rid >= 1
    assert conn.outstanding() == 0 and not conn.closed

    bob = await dial(server, token="tok-bob")
    assert await bob.request("Whoami") == b"reply:"
    assert seen[-1].principal == "bob" and bob.principal == "bob"


async def test_empty_and_large_payloads_round_trip(serve, dial):
    server = await serve(echo)
    conn = await dial(server)
    assert await conn.request("e") == b""
    big = bytes(random.Random(1).randbytes(900_000))  # under the 1 MiB default limit
    assert await conn.request("e", payload=big) == big


async def test_concurrent_requests_are_matched_by_request_id(serve, dial):
    rng = random.Random(42)
    delays = {i: rng.uniform(0, 0.01) for i in range(50)}
    finished: list[int] = []
    running = 0
    most_running = 0

    async def handle(req: AioRequest) -> bytes:
        nonlocal running, most_running
        i = int(req.op)
        running += 1
        most_running = max(most_running, running)
        await asyncio.sleep(delays[i])
        running -= 1
        finished.append(i)
        return f"answer-{i}".encode() + req.payload

    server = await serve(handle)
    conn = await dial(server)
    replies = await asyncio.gather(*(conn.request(str(i), payload=bytes([i])) for i in range(50)))
    assert replies == [f"answer-{i}".encode() + bytes([i]) for i in range(50)]
    assert sorted(finished) == list(range(50))
    assert finished != list(range(50)), "the handlers finished in order: they did not overlap"
    assert most_running > 1
    assert conn.outstanding() == 0


async def test_a_fireflyer_error_arrives_as_the_same_type_and_the_connection_survives(serve, dial):
    async def handle(req: AioRequest) -> bytes:
        if req.op == "fs":
            raise FsError("nope", errno=errno.ENOENT, path="/x")
        if req.op == "missing":
            raise NotFound("chunk 7 not found", chunk=7, target="t1")
        return b"fine"

    server = await serve(handle)
    conn = await dial(server)
    with pytest.raises(FsError) as fe:
        await conn.request("fs", timeout_s=5)
    assert type(fe.value) is FsError
    assert fe.value.errno == errno.ENOENT and fe.value.fields["path"] == "/x"
    assert fe.value.message == "nope"
    with pytest.raises(NotFound) as nf:
        await conn.request("missing")
    assert type(nf.value) is NotFound and nf.value.fields == {"chunk": 7, "target": "t1"}
    assert not conn.closed
    assert await conn.request("ok") == b"fine"


async def test_a_handler_bug_is_internal_and_the_connection_survives(serve, dial, wire_logs):
    async def handle(req: AioRequest) -> bytes:
        if req.op == "buggy":
            raise RuntimeError("kaboom")
        return b"fine"

    server = await serve(handle)
    conn = await dial(server)
    with pytest.raises(Internal) as ei:
        await conn.request("buggy", timeout_s=5)
    assert type(ei.value) is Internal
    assert "RuntimeError" in str(ei.value) and "kaboom" in str(ei.value)
    assert ei.value.fields["op"] == "buggy"
    assert [r["op"] for r in wire_logs("wire.handler_failed")] == ["buggy"]
    assert not conn.closed
    assert await conn.request("ok") == b"fine"


async def test_a_deadline_exceeded_from_the_handler_keeps_its_message_and_fields(serve, dial):
    async def handle(req: AioRequest) -> bytes:
        raise DeadlineExceeded("lock wait on inode 9 took too long", inode=9)

    server = await serve(handle)
    conn = await dial(server)
    with pytest.raises(DeadlineExceeded) as ei:
        await conn.request("Lock", timeout_s=5)
    assert ei.value.message == "lock wait on inode 9 took too long"
    assert ei.value.fields == {"inode": 9}


async def test_a_bad_token_is_unauthenticated(serve, dial, wire_logs):
    server = await serve(echo)
    good = await dial(server)
    with pytest.raises(Unauthenticated) as ei:
        await dial(server, token="not-a-token")
    assert "invalid or expired token" in str(ei.value)
    rejected = wire_logs("wire.auth_rejected")
    assert rejected and rejected[0]["reason"] == "bad_token"
    assert await good.request("e", payload=b"still ok") == b"still ok"
    await wait_for(lambda: server.connection_count() == 1, timeout_s=2, what="rejected connection dropped")


async def test_an_authenticator_that_raises_rejects_without_crashing(serve, dial):
    def boom(token: str) -> str:
        raise KeyError(token)

    server = await serve(echo, authenticate=boom)
    with pytest.raises(Unauthenticated) as ei:
        await dial(server)
    assert "authenticator failed: KeyError" in str(ei.value)


async def test_connecting_where_nothing_listens_is_unavailable(refused_port, loop_errors):
    with pytest.raises(Unavailable) as ei:
        await AioConnection.connect("127.0.0.1", refused_port, token=TOKEN, timeout_s=2)
    assert ei.value.fields["peer"] == f"127.0.0.1:{refused_port}"


async def test_a_refused_connect_leaves_no_unretrieved_future(refused_port, loop_errors):
    async def attempt() -> None:
        try:
            await AioConnection.connect("127.0.0.1", refused_port, token=TOKEN, timeout_s=2)
        except Unavailable:
            pass
        else:
            raise AssertionError("connected to a port where nothing listens")

    await attempt()
    await _collect()
    assert _never_retrieved(loop_errors) == []


async def test_a_server_that_never_welcomes_is_a_deadline_on_connect():
    writers: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await reader.read()  # reads the hello, never answers

    srv = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        with pytest.raises(DeadlineExceeded) as ei:
            await AioConnection.connect("127.0.0.1", port, token=TOKEN, timeout_s=0.2)
        assert ei.value.fields["peer"] == f"127.0.0.1:{port}"
    finally:
        srv.close()
        for w in writers:
            await _close_writer(w)
        await srv.wait_closed()


async def test_a_request_timeout_is_a_deadline_and_the_connection_goes_on(serve, dial):
    release = asyncio.Event()

    async def handle(req: AioRequest) -> bytes:
        if req.op == "slow":
            await release.wait()
            return b"late answer"
        return b"fast:" + req.payload

    server = await serve(handle)
    conn = await dial(server)
    with pytest.raises(DeadlineExceeded) as ei:
        await conn.request("slow", timeout_s=0.2)
    assert ei.value.fields["op"] == "slow"
    assert conn.outstanding() == 0 and not conn.closed
    release.set()  # its late answer arrives for a request nobody waits for any more
    await asyncio.sleep(0.05)
    assert await conn.request("fast", payload=b"1", timeout_s=5) == b"fast:1"
    assert not conn.closed and conn.outstanding() == 0


async def test_stopping_the_server_fails_outstanding_requests_with_unavailable(serve, dial):
    entered = asyncio.Event()

    async def handle(req: AioRequest) -> bytes:
        entered.set()
        await asyncio.Event().wait()  # never answers
        return b""

    server = await serve(handle)
    conn = await dial(server)
    pending = asyncio.create_task(conn.request("hang", timeout_s=5))
    async with asyncio.timeout(5):
        await entered.wait()
    assert not conn.closed
    await server.stop()
    with pytest.raises(Unavailable) as ei:
        await asyncio.wait_for(pending, 5)
    assert ei.value.fields["peer"] == f"127.0.0.1:{server.port}"
    assert conn.closed
    with pytest.raises(Unavailable):
        await conn.request("after")  # fails at once: the connection is gone


async def test_stop_with_a_grace_lets_running_requests_answer_first(serve, dial, wire_logs):
    entered = asyncio.Event()

    async def handle(req: AioRequest) -> bytes:
        entered.set()
        await asyncio.sleep(0.2 if req.op == "short" else 30)
        return req.op.encode()

    server = await serve(handle)
    conn = await dial(server)
    short = asyncio.create_task(conn.request("short", timeout_s=5))
    async with asyncio.timeout(5):
        await entered.wait()
    await server.stop(grace_s=2.0)
    assert await short == b"short"  # answered before its connection was closed
    await wait_for(lambda: conn.closed, timeout_s=2, what="client saw the close")

    # a request still running when the grace ends is cancelled, and that is logged
    server = await serve(handle)
    conn = await dial(server)
    entered.clear()
    long = asyncio.create_task(conn.request("long", timeout_s=5))
    async with asyncio.timeout(5):
        await entered.wait()
    await server.stop(grace_s=0.1)
    with pytest.raises(Unavailable):
        await long
    assert wire_logs("wire.stop_cancelled_requests") == [{"server": "wire-aio", "requests": 1}]


async def test_a_request_before_hello_is_rejected_and_disconnected(serve, raw_peer, wire_logs):
    calls: list[str] = []

    async def handle(req: AioRequest) -> bytes:
        calls.append(req.op)
        return b""

    server = await serve(handle)
    peer = await raw_peer(server.port)
    await peer.send(frame(Request(rid=1, op="sneak"), b"data"))
    header, _ = await peer.read_frame()
    assert isinstance(header, ErrorFrame) and header.rid == 0
    assert header.error["kind"] == "ProtocolError" and header.error["fields"]["reason"] == "expected_hello"
    await peer.wait_closed()
    assert calls == []
    assert wire_logs("wire.frame_rejected")[0]["reason"] == "expected_hello"
    await wait_for(lambda: server.connection_count() == 0, timeout_s=2, what="rejected connection dropped")


async def test_a_client_that_sends_no_hello_is_dropped_after_the_handshake_timeout(serve, raw_peer):
    server = await serve(echo, handshake_timeout_s=0.2)
    peer = await raw_peer(server.port)
    header, _ = await peer.read_frame(timeout_s=2)
    assert isinstance(header, ErrorFrame) and header.error["fields"]["reason"] == "handshake_timeout"
    await peer.wait_closed(timeout_s=2)


async def test_an_authenticated_client_is_not_dropped_by_the_handshake_timer(serve, dial):
    server = await serve(echo, handshake_timeout_s=0.2)
    conn = await dial(server)
    await asyncio.sleep(0.35)
    assert not conn.closed
    assert await conn.request("e", payload=b"x", timeout_s=2) == b"x"


async def test_a_frame_a_client_may_not_send_closes_the_connection(serve, raw_peer):
    server = await serve(echo)
    peer = await raw_peer(server.port)
    await peer.send(frame(Hello(token=TOKEN)))
    welcome, _ = await peer.read_frame()
    assert isinstance(welcome, Welcome) and welcome.principal == "alice"
    await peer.send(frame(Response(rid=1), b""))
    header, _ = await peer.read_frame()
    assert isinstance(header, ErrorFrame) and header.error["fields"]["reason"] == "unexpected_frame"
    await peer.wait_closed()


async def test_an_oversized_request_closes_only_its_connection(serve, dial):
    server = await serve(echo, limits=FrameLimits(max_payload_bytes=100))
    other = await dial(server)
    conn = await dial(server)
    assert await conn.request("e", payload=b"x" * 100) == b"x" * 100  # at the limit: fine
    with pytest.raises(ProtocolError) as ei:
        await conn.request("e", payload=b"x" * 101, timeout_s=5)
    assert ei.value.fields["reason"] == "oversized_payload"
    assert conn.closed
    await wait_for(lambda: server.connection_count() == 1, timeout_s=2, what="bad connection dropped")
    assert await other.request("e", payload=b"still") == b"still" and not other.closed


async def test_an_oversized_response_fails_the_client_connection(serve, dial):
    async def handle(req: AioRequest) -> bytes:
        return b"r" * 2000

    server = await serve(handle)
    conn = await dial(server, limits=FrameLimits(max_payload_bytes=1000))
    with pytest.raises(ProtocolError) as ei:
        await conn.request("big", timeout_s=5)
    assert ei.value.fields["reason"] == "oversized_payload"
    assert conn.closed


async def test_max_inflight_bounds_the_handlers_running_on_one_connection(serve, dial):
    release = asyncio.Event()
    started: list[str] = []

    async def handle(req: AioRequest) -> bytes:
        started.append(req.op)
        await release.wait()
        return req.op.encode()

    server = await serve(handle, max_inflight=2)
    conn = await dial(server)
    calls = [asyncio.create_task(conn.request(f"r{i}", timeout_s=5)) for i in range(5)]
    await wait_for(lambda: len(started) >= 2, timeout_s=2, what="two handlers to start")
    await asyncio.sleep(0.1)  # room for any third handler to start, were flow control broken
    try:
        assert len(started) == 2
    finally:
        release.set()
    assert await asyncio.gather(*calls) == [f"r{i}".encode() for i in range(5)]
    assert sorted(started) == [f"r{i}" for i in range(5)]


async def test_max_inflight_bounds_requests_arriving_one_by_one(serve, dial):
    """The same bound when each request reaches the server in its own read."""
    release = asyncio.Event()
    started: list[str] = []

    async def handle(req: AioRequest) -> bytes:
        started.append(req.op)
        await release.wait()
        return req.op.encode()

    server = await serve(handle, max_inflight=2)
    conn = await dial(server)
    calls = []
    for i in range(5):
        calls.append(asyncio.create_task(conn.request(f"r{i}", timeout_s=5)))
        await asyncio.sleep(0.03)  # each frame its own data_received
    await asyncio.sleep(0.1)
    try:
        assert started == ["r0", "r1"]
    finally:
        release.set()
    assert await asyncio.gather(*calls) == [f"r{i}".encode() for i in range(5)]
    assert sorted(started) == [f"r{i}" for i in range(5)]


def test_max_inflight_must_be_positive():
    with pytest.raises(ValueError):
        AioWireServer(echo, authenticate=authenticate, max_inflight=0)


async def test_trace_context_reaches_the_handler(serve, dial):
    seen: dict[str, Any] = {}

    async def handle(req: AioRequest) -> bytes:
        seen.setdefault("trace_ids", []).append(trace.get_current_span().get_span_context().trace_id)
        seen.setdefault("carriers", []).append(dict(req.trace))
        return b""

    server = await serve(handle)
    conn = await dial(server)
    await conn.request("untraced")
    parent = SpanContext(trace_id=0x1234ABCD, span_id=0x42, is_remote=False, trace_flags=TraceFlags(1))
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
    try:
        await conn.request("traced")
    finally:
        otel_context.detach(token)
    assert seen["trace_ids"] == [0, 0x1234ABCD]
    assert seen["carriers"][0] == {} and "traceparent" in seen["carriers"][1]


async def test_trace_requests_off_runs_no_span(serve, dial):
    seen: list[int] = []

    async def handle(req: AioRequest) -> bytes:
        seen.append(trace.get_current_span().get_span_context().trace_id)
        return b""

    server = await serve(handle, trace_requests=False)
    conn = await dial(server)
    parent = SpanContext(trace_id=0x1234ABCD, span_id=0x42, is_remote=False, trace_flags=TraceFlags(1))
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
    try:
        await conn.request("traced")
    finally:
        otel_context.detach(token)
    assert seen == [0]


# -- address and connection count -------------------------------------------------------------


@pytest.mark.parametrize(("host", "port", "expected"), [
    ("127.0.0.1", 7000, "127.0.0.1:7000"),
    ("10.1.2.3", 80, "10.1.2.3:80"),
    ("meta.local", 9000, "meta.local:9000"),
    ("0.0.0.0", 7000, "127.0.0.1:7000"),  # a wildcard bind is dialled on loopback
    ("", 7000, "127.0.0.1:7000"),
    ("::1", 7000, "[::1]:7000"),
    ("[::1]", 7000, "[::1]:7000"),
    ("fe80::1", 1, "[fe80::1]:1"),
    ("::", 7000, "[::1]:7000"),  # an IPv6 wildcard listens IPv6-only
])
def test_address_formatting(host, port, expected):
    server = AioWireServer(echo, authenticate=authenticate, host=host, port=port)
    assert server.address == expected and server.port == port


async def test_address_names_the_bound_port_after_start(serve):
    server = await serve(echo)
    assert server.port > 0
    assert server.address == f"127.0.0.1:{server.port}"


async def test_a_wildcard_ipv6_server_is_reachable_at_its_address(serve, loop_errors):
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        server = await serve(echo, host="::")
    except Unavailable:
        pytest.skip("cannot bind ::")
    host, port = server.address.rsplit(":", 1)
    reply: bytes | str
    try:
        conn = await AioConnection.connect(host.strip("[]"), int(port), token=TOKEN, timeout_s=2)
    except Unavailable as e:
        reply = f"nothing answers at {server.address}: {e}"
    else:
        try:
            reply = await conn.request("e", payload=b"v6")
        finally:
            conn.close()
    assert reply == b"v6"


async def test_listening_on_a_taken_port_is_unavailable(serve):
    first = await serve(echo)
    with socket.socket() as s:  # a listener that does not allow reuse holds the port
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(Unavailable) as ei:
            await AioWireServer(echo, authenticate=authenticate, host="127.0.0.1", port=taken).start()
        assert ei.value.fields["port"] == taken
    assert first.port != taken


async def test_connection_count_follows_connects_and_closes(serve):
    server = await serve(echo)
    assert server.connection_count() == 0
    a = await AioConnection.connect("127.0.0.1", server.port, token=TOKEN, timeout_s=5)
    await wait_for(lambda: server.connection_count() == 1, timeout_s=2, what="one connection")
    b = await AioConnection.connect("127.0.0.1", server.port, token="tok-bob", timeout_s=5)
    await wait_for(lambda: server.connection_count() == 2, timeout_s=2, what="two connections")
    a.close()
    assert a.closed
    await wait_for(lambda: server.connection_count() == 1, timeout_s=2, what="a's close seen by the server")
    assert await b.request("e", payload=b"b") == b"b"
    async with b:
        pass
    assert b.closed
    await wait_for(lambda: server.connection_count() == 0, timeout_s=2, what="every connection closed")
    with pytest.raises(Unavailable):
        await a.request("e")


async def test_stop_closes_every_connection_and_refuses_new_ones(serve):
    server = await serve(echo)
    port = server.port
    conns = [await AioConnection.connect("127.0.0.1", port, token=TOKEN, timeout_s=5) for _ in range(3)]
    await wait_for(lambda: server.connection_count() == 3, timeout_s=2, what="three connections")
    await server.stop()
    await wait_for(lambda: all(c.closed for c in conns), timeout_s=2, what="clients to see the close")
    assert server.connection_count() == 0
    with pytest.raises(Unavailable):
        await AioConnection.connect("127.0.0.1", port, token=TOKEN, timeout_s=2)
    await server.stop()  # a second stop is harmless


# -- hostile peers (issue 48, point 6) ----------------------------------------------------------

async def test_a_hello_with_a_payload_is_told_so(serve, raw_peer):
    server = await serve(echo)
    peer = await raw_peer(server.port)
    await peer.send(frame(Hello(token=TOKEN), b"payload"))
    header, _ = await peer.read_frame()
    assert isinstance(header, ErrorFrame) and header.error["fields"]["reason"] == "hello_with_payload"
    assert "carries no payload" in header.error["message"] and "got Hello" not in header.error["message"]
    await peer.wait_closed()


@pytest.mark.parametrize("cut", [7, PREFIX.size + 2, "payload"])
async def test_a_truncated_frame_is_dropped_at_the_frame_deadline(cut, serve, raw_peer, wire_logs):
    server = await serve(echo, frame_timeout_s=0.3)
    peer = await raw_peer(server.port)
    await peer.send(frame(Hello(token=TOKEN)))
    assert isinstance((await peer.read_frame())[0], Welcome)
    data = frame(Request(rid=1, op="echo"), b"x" * 100)
    await peer.send(data[:-10] if cut == "payload" else data[:cut])
    header, _ = await peer.read_frame(timeout_s=3)  # well before any idle timeout
    assert isinstance(header, ErrorFrame) and header.error["fields"]["reason"] == "frame_timeout"
    await peer.wait_closed(timeout_s=2)


async def test_whole_frames_in_pieces_are_served_despite_the_deadline(serve, dial):
    server = await serve(echo, frame_timeout_s=0.5)
    conn = await dial(server)
    for _ in range(3):
        assert await conn.request("echo", payload=b"abc", timeout_s=2) == b"abc"


async def test_connections_over_the_node_and_user_caps_are_refused(serve, raw_peer):
    server = await serve(echo, max_connections=3, max_connections_per_user=1, handshake_timeout_s=30)
    first = await raw_peer(server.port)
    await first.send(frame(Hello(token=TOKEN)))
    assert isinstance((await first.read_frame())[0], Welcome)
    second = await raw_peer(server.port)
    await second.send(frame(Hello(token=TOKEN)))
    header, _ = await second.read_frame()
    assert isinstance(header, ErrorFrame) and header.error["fields"]["reason"] == "user_limit"
    await second.wait_closed()
    await wait_for(lambda: server.connection_count() == 1, timeout_s=2, what="refused connection dropped")
    others = [await raw_peer(server.port) for _ in range(2)]
    header, _ = await (await raw_peer(server.port)).read_frame()
    assert isinstance(header, ErrorFrame) and header.error["kind"] == "ResourceExhausted"
    assert header.error["fields"]["reason"] == "node_limit"
    assert len(others) == 2


async def test_an_authenticator_that_says_why_is_quoted_to_the_client(serve, dial):
    def expired(token: str) -> str:
        raise Unauthenticated("the token of user 'bob' expired at 2026-12-04T08:00:00Z")

    server = await serve(echo, authenticate=expired)
    with pytest.raises(Unauthenticated) as ei:
        await dial(server)
    assert "user 'bob' expired at" in str(ei.value) and "authenticator failed" not in str(ei.value)


async def test_an_open_connection_stops_working_once_its_token_is_revoked(serve, dial, monkeypatch):
    import fireflyer.wire.reauth as reauth

    monkeypatch.setattr(reauth, "REAUTH_INTERVAL_S", 0.0)
    valid = {"tok-alice": "alice", "tok-bob": "bob"}

    def expired(token: str) -> str | None:
        if token == "tok-bob" and "tok-bob" not in valid:
            raise Unauthenticated("the token of user 'bob' expired at 2026-12-04T08:00:00Z")
        return valid.get(token)

    server = await serve(echo, authenticate=expired)
    bob, alice = await dial(server, token="tok-bob"), await dial(server)
    assert await bob.request("e", payload=b"hi") == b"hi"
    del valid["tok-bob"]
    with pytest.raises(Unauthenticated, match="stopped working: the token of user 'bob' expired"):
        await bob.request("e", payload=b"hi")
    assert await alice.request("e", payload=b"ok") == b"ok"
