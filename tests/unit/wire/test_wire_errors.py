"""Typed errors across the wire, timeouts, and dropped connections."""

import errno
import socket
import threading

import pytest

from fireflyer.core.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    FsError,
    Internal,
    NotFound,
    Unavailable,
)
from fireflyer.testing.poll import wait_until
from fireflyer.wire import Connection, ServerRequest


def test_handler_errors_arrive_as_the_same_type_with_fields(wire_server, connect):
    def handle(req: ServerRequest) -> None:
        if req.op == "missing":
            raise NotFound("chunk 7 not found on target t1", chunk=7, target="t1")
        if req.op == "fs":
            raise FsError("no such file", errno=errno.ENOENT, path="/x")
        req.reply(b"ok")

    server = wire_server(handle)
    conn = connect(server)
    with pytest.raises(NotFound) as ei:
        conn.request("missing", b"payload the handler never read")
    assert str(ei.value) == "chunk 7 not found on target t1"
    assert ei.value.fields == {"chunk": 7, "target": "t1"}
    with pytest.raises(FsError) as fe:
        conn.request("fs")
    assert fe.value.errno == errno.ENOENT and fe.value.path == "/x"
    assert bytes(conn.request("fine").payload) == b"ok"  # the connection survived both


def test_a_handler_bug_is_internal_and_logged(wire_server, connect, wire_logs):
    def handle(req: ServerRequest) -> None:
        raise KeyError("oops")

    server = wire_server(handle)
    conn = connect(server)
    with pytest.raises(Internal) as ei:
        conn.request("buggy")
    assert "KeyError" in str(ei.value) and ei.value.op == "buggy"
    assert wire_logs("wire.handler_failed")
    with pytest.raises(Internal):
        conn.request("again")  # still connected


def test_replying_twice_is_refused(wire_server, connect):
    outcome = {}

    def handle(req: ServerRequest) -> None:
        req.reply(b"first")
        try:
            req.reply(b"second")
        except FailedPrecondition as e:
            outcome["second"] = e

    server = wire_server(handle)
    conn = connect(server)
    assert bytes(conn.request("x").payload) == b"first"
    wait_until(lambda: "second" in outcome, timeout_s=5, what="second reply attempted")
    assert isinstance(outcome["second"], FailedPrecondition)


def test_request_timeout_is_deadline_exceeded_and_the_late_answer_is_dropped(wire_server, connect):
    release = threading.Event()

    def handle(req: ServerRequest) -> None:
        if req.op == "slow":
            release.wait(10)
        req.reply(req.op.encode())

    server = wire_server(handle)
    conn = connect(server)
    buf = bytearray(16)
    pending = conn.submit("slow", timeout_s=0.1, into=buf)
    with pytest.raises(DeadlineExceeded) as ei:
        pending.result()
    assert ei.value.op == "slow" and ei.value.peer == conn.peer
    with pytest.raises(DeadlineExceeded):
        pending.result(timeout_s=0)  # asking again gives the same answer, it does not hang
    assert conn.outstanding() == 0
    release.set()
    # the late answer to "slow" is read and dropped; the next answer is this request's own
    assert bytes(conn.request("next", timeout_s=5).payload) == b"next"
    assert buf == bytearray(16)  # the abandoned buffer was never written


def test_connect_timeout_and_refusal(raw_peer):
    # a listener that accepts TCP but never answers the hello
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(DeadlineExceeded):
            Connection.connect("127.0.0.1", silent.getsockname()[1], token="t", timeout_s=0.2)
    finally:
        silent.close()
    # a port nobody listens on
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(Unavailable) as ei:
        Connection.connect("127.0.0.1", port, token="t", timeout_s=2)
    assert ei.value.peer == f"127.0.0.1:{port}"


def test_a_dropped_connection_fails_every_outstanding_request(wire_server, connect):
    entered = threading.Event()
    release = threading.Event()

    def handle(req: ServerRequest) -> None:
        entered.set()
        release.wait(10)

    server = wire_server(handle)
    conn = connect(server)
    pending = [conn.submit("hang", b"x" * 100, meta={"i": i}) for i in range(5)]
    assert entered.wait(5)
    stopper = threading.Thread(target=server.stop, kwargs={"timeout_s": 5})
    stopper.start()  # shuts every connection down under the blocked handler
    try:
        for p in pending:
            with pytest.raises(Unavailable) as ei:
                p.result(timeout_s=5)
            assert ei.value.peer == conn.peer and conn.peer in str(ei.value)
        assert conn.closed
        with pytest.raises(Unavailable):
            conn.request("after")
    finally:
        release.set()
        stopper.join(10)


def test_closing_the_client_fails_its_outstanding_requests(wire_server, connect):
    release = threading.Event()
    server = wire_server(lambda req: release.wait(10))
    conn = connect(server)
    p = conn.submit("hang")
    try:
        wait_until(lambda: server.connection_count() == 1, timeout_s=5)
        conn.close()
        with pytest.raises(Unavailable):
            p.result(timeout_s=5)
    finally:
        release.set()
