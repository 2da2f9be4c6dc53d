"""Requests and responses over real loopback sockets: payload sizes, zero copy, multiplexing."""

import threading

import numpy as np
import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from fireflyer.core.errors import ResourceExhausted, Unauthenticated
from fireflyer.wire import ServerRequest


def _addr(buf) -> int:
    return np.frombuffer(buf, dtype=np.uint8).__array_interface__["data"][0]


@pytest.mark.parametrize("size", [0, 1, 4096, 5 * (1 << 20) + 3])
def test_payload_lands_in_the_callers_buffers(wire_server, connect, size):
    server_sink = np.zeros(size + 16, dtype=np.uint8)
    seen = {}

    def handle(req: ServerRequest) -> None:
        got = req.recv_payload(into=server_sink)
        seen.update(principal=req.principal, op=req.op, meta=req.meta, size=req.size, addr=_addr(got) if size else 0)
        # echo back from the server's own buffer, plus a header field
        req.reply(server_sink[:size], meta={"n": req.size})

    server = wire_server(handle)
    conn = connect(server)
    assert conn.principal == "alice"
    src = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size + 100, dtype=np.uint8)
    reply = conn.request("put", src, meta={"chunk": 9}, into=dst, checksum=True)

    assert seen["principal"] == "alice" and seen["op"] == "put" and seen["meta"] == {"chunk": 9}
    assert seen["size"] == size and np.array_equal(server_sink[:size], src)
    if size:
        assert seen["addr"] == server_sink.ctypes.data  # received into the handler's buffer, not a copy
        assert _addr(reply.payload) == dst.ctypes.data  # and into ours
    assert reply.meta == {"n": size} and reply.size == size
    assert np.array_equal(dst[:size], src) and not dst[size:].any()


def test_payloads_of_other_dtypes_and_a_fresh_buffer_when_none_given(wire_server, connect):
    server = wire_server(lambda req: req.reply(req.recv_payload()))
    conn = connect(server)
    src = np.arange(1000, dtype=np.float32)
    reply = conn.request("echo", src)
    assert isinstance(reply.payload.obj, bytearray)
    assert np.array_equal(np.frombuffer(reply.payload, dtype=np.float32), src)


def test_a_response_larger_than_the_buffer_fails_only_that_request(wire_server, connect):
    server = wire_server(lambda req: req.reply(b"x" * 100))
    conn = connect(server)
    with pytest.raises(ResourceExhausted) as ei:
        conn.request("get", into=bytearray(10))
    assert ei.value.size == 100 and ei.value.buffer == 10
    assert bytes(conn.request("get").payload) == b"x" * 100  # connection still fine


def test_concurrent_requests_on_one_connection_are_matched_by_request_id(wire_server, connect):
    n_threads = 8
    held: list[tuple[ServerRequest, bytes]] = []

    def handle(req: ServerRequest) -> None:
        # hold every request until all have arrived, then answer them in reverse order: the
        # client can only get this right by matching request ids, not by arrival order
        data = bytes(req.recv_payload())
        req.defer()
        held.append((req, data))
        if len(held) == n_threads:
            for r, d in reversed(held):
                r.reply(d[::-1], meta={"tag": r.meta["tag"]})

    server = wire_server(handle)
    conn = connect(server)
    results: dict[int, tuple[dict, bytes, bool]] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            payload = bytes([i]) * (1000 + i) + b"end"
            buf = bytearray(4096)
            reply = conn.request("rev", payload, meta={"tag": i}, into=buf, timeout_s=10)
            results[i] = (reply.meta, bytes(reply.payload), reply.payload.obj is buf)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    for i in range(n_threads):
        meta, data, in_own_buffer = results[i]
        assert meta == {"tag": i} and data == (bytes([i]) * (1000 + i) + b"end")[::-1] and in_own_buffer
    assert conn.outstanding() == 0


def test_many_submits_from_one_thread(wire_server, connect):
    server = wire_server(lambda req: req.reply(meta={"i": req.meta["i"]}))
    conn = connect(server)
    pending = [conn.submit("n", meta={"i": i}) for i in range(200)]
    assert [p.result().meta["i"] for p in pending] == list(range(200))


def test_trace_context_reaches_the_handler(wire_server, connect):
    seen = {}

    def handle(req: ServerRequest) -> None:
        seen["trace_id"] = trace.get_current_span().get_span_context().trace_id

    server = wire_server(handle)
    conn = connect(server)
    parent = SpanContext(trace_id=0x1234ABCD, span_id=0x42, is_remote=False, trace_flags=TraceFlags(1))
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
    try:
        conn.request("traced")
    finally:
        otel_context.detach(token)
    assert seen["trace_id"] == 0x1234ABCD


def test_wrong_token_is_unauthenticated_and_logged(wire_server, connect, wire_logs):
    server = wire_server(lambda req: None)
    good = connect(server)
    with pytest.raises(Unauthenticated) as ei:
        connect(server, token="not-a-token")
    assert "invalid or expired token" in str(ei.value)
    rejected = wire_logs("wire.auth_rejected")
    assert rejected and rejected[0]["reason"] == "bad_token" and "not-a-token" not in str(rejected)
    assert good.request("still-ok").size == 0


def test_an_authenticator_that_raises_rejects_without_crashing(wire_server, connect):
    def boom(token: str) -> str:
        raise RuntimeError("token store down")

    server = wire_server(lambda req: None, authenticate=boom)
    with pytest.raises(Unauthenticated):
        connect(server)


def test_an_authenticator_that_says_why_is_quoted_to_the_client(wire_server, connect):
    """A token store refuses a revoked or expired token with Unauthenticated naming the reason."""
    def revoked(token: str) -> str:
        raise Unauthenticated("the token of user 'bob' was revoked at 2026-12-04T08:00:00Z")

    server = wire_server(lambda req: None, authenticate=revoked)
    with pytest.raises(Unauthenticated, match="user 'bob' was revoked"):
        connect(server)


def test_an_open_connection_stops_working_once_its_token_is_revoked(wire_server, connect, monkeypatch):
    """A connection authenticates at its hello; the token is looked up again (at most every
    REAUTH_INTERVAL_S) so revoking it refuses the next requests on connections already open."""
    import fireflyer.wire.reauth as reauth

    monkeypatch.setattr(reauth, "REAUTH_INTERVAL_S", 0.0)
    valid = {"tok-alice": "alice", "tok-bob": "bob"}
    server = wire_server(lambda req: None, authenticate=lambda t: valid.get(t))
    bob, alice = connect(server, token="tok-bob"), connect(server)
    assert bob.request("x", payload=b"1").size == 0
    del valid["tok-bob"]
    with pytest.raises(Unauthenticated, match="token stopped working"):
        bob.request("x", payload=b"12")
    with pytest.raises(Unauthenticated, match="token stopped working"):
        bob.request("x")  # stays refused
    assert alice.request("x", payload=b"123").size == 0  # the others are untouched
