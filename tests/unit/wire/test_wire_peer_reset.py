"""A client that goes away is routine (DEBUG); a frame it got wrong is a WARNING (issue 47, point 5)."""

from __future__ import annotations

import logging
import socket
import struct

import pytest

from fireflyer.core.errors import ProtocolError, Unavailable
from fireflyer.testing.poll import wait_until
from fireflyer.wire import ServerRequest
from fireflyer.wire.conn import PeerClosed
from fireflyer.wire.frame import MAGIC, PREFIX, VERSION, Request, encode_head
from fireflyer.wire.server import connection_lost


def _echo(req: ServerRequest) -> None:
    req.reply(req.recv_payload())


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the kernel sends RST, the server's recv fails with ECONNRESET."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _wire_records(caplog: pytest.LogCaptureFixture, min_level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("fireflyer.wire") and r.levelno >= min_level]


@pytest.mark.parametrize("inside_frame", [False, True], ids=["between_frames", "inside_a_frame"])
def test_a_reset_by_the_peer_is_logged_at_debug(wire_server, raw_peer, wire_logs, caplog, inside_frame):
    server = wire_server(_echo)
    peer = raw_peer(server.port)
    peer.hello()
    if inside_frame:  # a request head announcing 1000 payload bytes, then only 10
        peer.send(bytes(encode_head(Request(rid=1, op="put"), 1000)) + b"x" * 10)
    wait_until(lambda: server.connection_count() == 1, timeout_s=5, what="connection served")
    _reset(peer.sock)
    lost = wait_until(lambda: wire_logs("wire.conn_lost"), timeout_s=5, what="conn_lost logged")
    assert "reset" in lost[0]["error"].lower(), lost
    rec = next(r for r in caplog.records if getattr(r, "ff_event", None) == "wire.conn_lost")
    assert rec.levelno == logging.DEBUG
    wait_until(lambda: server.connection_count() == 0, timeout_s=5, what="connection dropped")
    assert not wire_logs("wire.frame_rejected")
    assert _wire_records(caplog, logging.WARNING) == []


def test_a_malformed_frame_is_still_a_warning(wire_server, raw_peer, wire_logs, caplog):
    server = wire_server(_echo)
    peer = raw_peer(server.port)
    peer.hello()
    peer.send(PREFIX.pack(b"HTTP", VERSION, 0, 12, 0) + b"x" * 12)
    peer.wait_closed()
    wait_until(lambda: wire_logs("wire.frame_rejected"), timeout_s=5, what="rejection logged")
    rec = next(r for r in caplog.records if getattr(r, "ff_event", None) == "wire.frame_rejected")
    assert rec.levelno == logging.WARNING and rec.ff_fields["reason"] == "bad_magic"
    assert MAGIC != b"HTTP"


def test_connection_lost_classification() -> None:
    assert connection_lost(PeerClosed("p closed the connection", peer="p"))
    assert connection_lost(Unavailable("connection to p failed: [Errno 104] Connection reset by peer",
                                       peer="p", reason="recv_failed"))
    assert not connection_lost(ProtocolError("p closed the connection inside a frame", reason="truncated"))
    assert not connection_lost(Unavailable("something else", reason="no_route"))
