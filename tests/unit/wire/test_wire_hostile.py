"""Hostile peers of the threaded wire server (issue 48, point 6), over raw sockets speaking the
framed protocol as the probe did: idle unauthenticated connections, connection caps per node and
per user, payloads announced and never sent, truncated and trickled frames, a hello with a payload."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from fireflyer.testing.poll import wait_until
from fireflyer.wire import ServerRequest, WireServer
from fireflyer.wire.frame import PREFIX, ErrorFrame, FrameLimits, Hello, Request, Response, encode_head

MiB = 1 << 20


def _echo(req: ServerRequest) -> None:
    req.reply(req.recv_payload())


def _request_head(size: int, rid: int = 1) -> bytes:
    return bytes(encode_head(Request(rid=rid, op="put"), size))


def _error_of(peer) -> dict:
    header, _ = peer.read_frame()
    assert isinstance(header, ErrorFrame), header
    return header.error


def test_idle_unauthenticated_connections_cost_no_thread(wire_server, raw_peer):
    server = wire_server(_echo, handshake_timeout_s=30)
    threads_before = threading.active_count()
    peers = [raw_peer(server.port) for _ in range(200)]
    wait_until(lambda: server.connection_count() == 200, timeout_s=10, what="200 connections accepted")
    # the probe saw one thread per connection (436 for 400); a hello reader needs none
    assert threading.active_count() - threads_before <= 2
    assert server.thread_count() == 0
    # and they still get served once they say hello
    peers[0].hello()
    wait_until(lambda: server.thread_count() == 1, timeout_s=5, what="a thread for the authenticated one")


def test_defaults_bound_every_connection():
    server = WireServer(_echo, authenticate=lambda t: None)
    assert server.handshake_timeout_s == 5.0
    assert server.frame_timeout_s == 5.0
    assert server.max_connections == 1024
    assert server.max_connections_per_user == 256
    assert server.payload_budget is not None and server.payload_budget.max_bytes == 1 << 30


def test_connections_over_the_node_cap_are_refused(wire_server, raw_peer, connect, caplog):
    caplog.set_level(logging.INFO, logger="fireflyer.wire")
    server = wire_server(_echo, max_connections=4, handshake_timeout_s=30)
    held = [raw_peer(server.port) for _ in range(3)]
    client = connect(server)  # authenticated connections count too
    wait_until(lambda: server.connection_count() == 4, timeout_s=5, what="4 connections")
    extra = raw_peer(server.port)
    err = _error_of(extra)
    assert err["kind"] == "ResourceExhausted" and err["fields"]["reason"] == "node_limit"
    assert "limit" in err["message"] and "retry later" in err["message"]
    extra.wait_closed()
    refused = [r for r in caplog.records if getattr(r, "ff_event", None) == "wire.conn_refused"]
    assert refused and refused[0].levelno == logging.INFO and refused[0].ff_fields["reason"] == "node_limit"
    # the ones inside the cap are unharmed, and a freed slot is usable again
    assert bytes(client.request("echo", b"ok").payload) == b"ok"
    held[0].close()
    wait_until(lambda: server.connection_count() == 3, timeout_s=5, what="a slot freed")
    raw_peer(server.port).hello()


def test_connections_over_the_per_user_cap_are_refused(wire_server, raw_peer, caplog):
    caplog.set_level(logging.INFO, logger="fireflyer.wire")
    server = wire_server(_echo, max_connections_per_user=2)
    alice = [raw_peer(server.port) for _ in range(2)]
    for p in alice:
        p.hello("tok-alice")
    third = raw_peer(server.port)
    third.send(encode_head(Hello(token="tok-alice"), 0))
    err = _error_of(third)
    assert err["kind"] == "ResourceExhausted" and err["fields"]["reason"] == "user_limit"
    assert err["fields"]["user"] == "alice"
    third.wait_closed()
    assert any(getattr(r, "ff_event", None) == "wire.conn_refused" and r.levelno == logging.INFO
               for r in caplog.records)
    raw_peer(server.port).hello("tok-bob")  # another user is not affected
    alice[0].close()
    wait_until(lambda: server.thread_count() == 2, timeout_s=5, what="alice's first connection gone")
    raw_peer(server.port).hello("tok-alice")


def test_admins_and_services_are_not_capped_per_user(wire_server, raw_peer):
    from fireflyer.rpc.auth import Principal

    principals = {"tok-alice": Principal("alice", frozenset({"user"})),
                  "tok-svc": Principal("storage", frozenset({"admin", "user"}))}
    server = wire_server(_echo, authenticate=principals.get, max_connections_per_user=1)
    for _ in range(3):
        raw_peer(server.port).hello("tok-svc")
    raw_peer(server.port).hello("tok-alice")
    again = raw_peer(server.port)
    again.send(encode_head(Hello(token="tok-alice"), 0))
    assert _error_of(again)["fields"]["reason"] == "user_limit"


def test_a_hello_with_a_payload_is_told_so(wire_server, raw_peer, wire_logs):
    server = wire_server(_echo)
    bad = raw_peer(server.port)
    bad.send(bytes(encode_head(Hello(token="tok-alice"), 10)) + b"x" * 10)
    err = _error_of(bad)
    assert err["fields"]["reason"] == "hello_with_payload"
    assert "hello frame carries no payload" in err["message"] and "10 bytes" in err["message"]
    assert "got Hello" not in err["message"]
    bad.wait_closed()


def test_announced_payloads_that_never_arrive_allocate_nothing(wire_server, raw_peer):
    entered = []

    def handler(req: ServerRequest) -> None:
        entered.append(req.size)
        req.reply(req.recv_payload())

    # (at the default 1 MiB/s, 64 MiB buys a minute to send; the first byte must still come in 1 s)
    server = wire_server(handler, limits=FrameLimits(max_payload_bytes=128 * MiB), frame_timeout_s=1.0,
                         payload_budget_bytes=1 << 30)
    peers = [raw_peer(server.port) for _ in range(8)]
    for p in peers:
        p.hello()
        p.send(_request_head(64 * MiB))  # and not a byte of it
    wait_until(lambda: len(entered) == 8, timeout_s=5, what="8 handlers waiting for their payload")
    budget = server.payload_budget
    assert budget is not None
    assert budget.in_use == 0 and budget.peak == 0  # (the probe: +512 MiB held 31 s)
    t0 = time.monotonic()
    for p in peers:
        p.wait_closed()  # the frame deadline closes them
    assert time.monotonic() - t0 < 4.0
    assert budget.peak == 0 and budget.in_use == 0


def test_payload_budget_bounds_what_arriving_payloads_hold(wire_server, raw_peer):
    server = wire_server(_echo, payload_budget_bytes=3 * MiB, payload_budget_wait_s=0.3, frame_timeout_s=2.0,
                         min_payload_rate=1e12)
    budget = server.payload_budget
    assert budget is not None
    first, second = raw_peer(server.port), raw_peer(server.port)
    first.hello()
    second.hello()
    first.send(_request_head(2 * MiB) + b"a")
    wait_until(lambda: budget.in_use == 2 * MiB, timeout_s=5, what="the first payload leased")
    second.send(_request_head(2 * MiB) + b"b")
    err = _error_of(second)  # no room within 0.3 s: refused, not allocated
    assert err["kind"] == "ResourceExhausted" and err["fields"]["reason"] == "payload_budget"
    assert budget.peak <= 3 * MiB
    first.send(b"a" * (2 * MiB - 1))
    header, payload = first.read_frame()
    assert isinstance(header, Response) and payload == b"a" * (2 * MiB)
    wait_until(lambda: budget.in_use == 0, timeout_s=5, what="the lease returned")


@pytest.mark.parametrize("sent", ["prefix_part", "header_part", "payload_part"])
def test_a_truncated_frame_is_dropped_at_the_frame_deadline(sent, wire_server, raw_peer, wire_logs):
    server = wire_server(_echo, io_timeout_s=30, frame_timeout_s=0.3, min_payload_rate=1e12)
    bad = raw_peer(server.port)
    bad.hello()
    head = _request_head(1000)
    data = {"prefix_part": head[:7], "header_part": head[:PREFIX.size + 2],
            "payload_part": head + b"x" * 10}[sent]
    t0 = time.monotonic()
    bad.send(data)
    bad.wait_closed()
    # not the 10 s (handshake) or 30 s (I/O) idle timeouts the probe waited out
    assert time.monotonic() - t0 < 3.0
    assert wait_until(lambda: wire_logs("wire.frame_rejected"), timeout_s=5)[0]["reason"] == "frame_timeout"


def test_a_trickled_header_is_dropped_at_the_frame_deadline(wire_server, raw_peer, wire_logs):
    # a byte now and then is progress, so no I/O timeout ever fires; the frame deadline does
    server = wire_server(_echo, io_timeout_s=30, frame_timeout_s=0.5)
    bad = raw_peer(server.port)
    bad.hello()
    head = _request_head(0)
    t0 = time.monotonic()
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        for i in range(len(head)):
            bad.send(head[i:i + 1])
            if wire_logs("wire.frame_rejected"):
                raise BrokenPipeError("rejected")
            time.sleep(0.1)  # (the trickle itself, not synchronisation)
    assert time.monotonic() - t0 < 3.0
    assert wait_until(lambda: wire_logs("wire.frame_rejected"), timeout_s=5)[0]["reason"] == "frame_timeout"


def test_a_handshake_that_never_completes_is_dropped(wire_server, raw_peer, wire_logs):
    server = wire_server(_echo, handshake_timeout_s=0.3)
    bad = raw_peer(server.port)
    bad.send(bytes(encode_head(Hello(token="tok-alice"), 0))[:10])
    t0 = time.monotonic()
    assert _error_of(bad)["fields"]["reason"] == "handshake_timeout"
    assert time.monotonic() - t0 < 3.0


def test_raw_socket_hello_then_request_in_one_send(wire_server, raw_peer):
    # bytes that follow the hello in the same segment belong to the connection's stream
    server = wire_server(_echo)
    peer = raw_peer(server.port)
    peer.send(bytes(encode_head(Hello(token="tok-alice"), 0)) + _request_head(3) + b"abc")
    peer.read_frame()  # welcome
    header, payload = peer.read_frame()
    assert isinstance(header, Response) and payload == b"abc"
