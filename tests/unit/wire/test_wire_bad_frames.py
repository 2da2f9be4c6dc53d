"""Each bad frame closes only its own connection, with a logged reason; other clients go on."""

import msgspec
import pytest

from fireflyer.core.errors import ProtocolError
from fireflyer.testing.poll import wait_until
from fireflyer.wire import ServerRequest
from fireflyer.wire.frame import MAGIC, PREFIX, VERSION, ErrorFrame, Request, Response, encode_head


def _echo(req: ServerRequest) -> None:
    req.reply(req.recv_payload())


def _request_head(size: int, **kw) -> bytes:
    return bytes(encode_head(Request(rid=1, op="put", **kw), size))


BAD_FRAMES = {
    # name: (bytes sent after a valid hello, expected reason)
    "oversized_payload": (bytes(encode_head(Request(rid=1, op="put"), 10 << 30)), "oversized_payload"),
    "oversized_header": (PREFIX.pack(MAGIC, VERSION, 0, 10 << 20, 0), "oversized_header"),
    "garbage_header": (PREFIX.pack(MAGIC, VERSION, 0, 12, 0) + b"\xc1" * 12, "bad_header"),
    "bad_magic": (PREFIX.pack(b"HTTP", VERSION, 0, 12, 0) + b"x" * 12, "bad_magic"),
    "bad_version": (PREFIX.pack(MAGIC, 7, 0, 12, 0) + b"x" * 12, "bad_version"),
    "response_from_client": (bytes(encode_head(Response(rid=1), 0)), "unexpected_frame"),
    "truncated_header": (PREFIX.pack(MAGIC, VERSION, 0, 100, 0) + b"\x81", "truncated"),
    "truncated_payload": (_request_head(1 << 20) + b"p" * 1000, "truncated"),
}


@pytest.mark.parametrize("case", sorted(BAD_FRAMES))
def test_bad_frame_closes_only_that_connection(case, wire_server, connect, raw_peer, wire_logs):
    data, reason = BAD_FRAMES[case]
    server = wire_server(_echo)
    other = connect(server)
    assert bytes(other.request("echo", b"before").payload) == b"before"

    bad = raw_peer(server.port)
    bad.hello()
    bad.send(data)
    if reason == "truncated":
        bad.sock.shutdown(2)  # the peer goes away in the middle of the frame
    else:
        # the server says why before it closes; then the stream ends
        header, _ = bad.read_frame()
        assert isinstance(header, ErrorFrame) and header.rid == 0
        assert header.error["kind"] == "ProtocolError" and header.error["fields"]["reason"] == reason
        bad.wait_closed()
        bad.close()

    rejected = wait_until(lambda: wire_logs("wire.frame_rejected"), timeout_s=5, what="rejection logged")
    assert rejected[0]["reason"] == reason and rejected[0]["peer"].startswith("127.0.0.1:")
    wait_until(lambda: server.connection_count() == 1, timeout_s=5, what="bad connection dropped")
    assert bytes(other.request("echo", b"after").payload) == b"after"
    assert not other.closed


def test_frames_before_hello_are_rejected(wire_server, raw_peer, wire_logs):
    server = wire_server(_echo)
    bad = raw_peer(server.port)
    bad.send(_request_head(0))
    header, _ = bad.read_frame()
    assert isinstance(header, ErrorFrame) and header.error["fields"]["reason"] == "expected_hello"
    bad.wait_closed()
    assert wait_until(lambda: wire_logs("wire.frame_rejected"), timeout_s=5)[0]["reason"] == "expected_hello"


def test_garbage_instead_of_hello(wire_server, raw_peer, wire_logs):
    server = wire_server(_echo)
    bad = raw_peer(server.port)
    bad.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    bad.wait_closed()
    assert wait_until(lambda: wire_logs("wire.frame_rejected"), timeout_s=5)[0]["reason"] == "bad_magic"


def test_a_silent_client_is_dropped_after_the_handshake_timeout(wire_server, raw_peer, wire_logs):
    server = wire_server(_echo, handshake_timeout_s=0.2)
    bad = raw_peer(server.port)
    bad.wait_closed()
    assert wait_until(lambda: wire_logs("wire.frame_rejected"), timeout_s=5)[0]["reason"] == "handshake_timeout"


def test_a_client_stalling_inside_a_frame_is_dropped(wire_server, connect, raw_peer, wire_logs):
    server = wire_server(_echo, io_timeout_s=0.2)
    other = connect(server)
    bad = raw_peer(server.port)
    bad.hello()
    bad.send(_request_head(1000) + b"x" * 10)  # and then nothing
    bad.wait_closed()
    assert wait_until(lambda: wire_logs("wire.frame_rejected"), timeout_s=5)[0]["reason"] == "stalled"
    assert bytes(other.request("echo", b"ok").payload) == b"ok"


def test_wrong_payload_checksum_fails_the_request_not_the_connection(wire_server, raw_peer):
    server = wire_server(_echo)
    peer = raw_peer(server.port)
    peer.hello()
    peer.send(_request_head(5, crc32=12345) + b"hello")
    header, _ = peer.read_frame()
    assert isinstance(header, ErrorFrame) and header.rid == 1
    assert header.error["fields"]["reason"] == "checksum_mismatch"
    peer.send(bytes(encode_head(Request(rid=2, op="echo"), 3)) + b"abc")
    header, payload = peer.read_frame()
    assert isinstance(header, Response) and header.rid == 2 and payload == b"abc"


def test_an_unreadable_response_closes_the_client_connection(raw_peer):
    # the client side checks frames too: a server sending garbage fails its requests
    import socket
    import threading

    from fireflyer.core.errors import Unavailable
    from fireflyer.wire import Connection
    from fireflyer.wire.frame import Welcome

    listener = socket.create_server(("127.0.0.1", 0))

    def fake_server() -> None:
        s, _ = listener.accept()
        s.recv(4096)  # the hello
        s.sendall(bytes(encode_head(Welcome(principal="x"), 0)))
        s.recv(4096)  # the request
        s.sendall(PREFIX.pack(MAGIC, VERSION, 0, 3, 0) + b"\xc1\xc1\xc1")
        s.recv(1)
        s.close()

    t = threading.Thread(target=fake_server, daemon=True)
    t.start()
    conn = Connection.connect("127.0.0.1", listener.getsockname()[1], token="t", timeout_s=5)
    with pytest.raises(Unavailable) as ei:
        conn.request("x", timeout_s=5)
    assert ei.value.reason == "bad_header" and ei.value.peer == conn.peer
    with pytest.raises(Unavailable):
        conn.request("y")
    conn.close()
    t.join(5)
    listener.close()


def test_protocol_error_type_is_what_server_errors_decode_to():
    # an error frame's dict rebuilds the typed error on the client
    from fireflyer.core.errors import error_from_dict

    err = ProtocolError("bad", reason="bad_magic")
    assert isinstance(error_from_dict(msgspec.msgpack.decode(msgspec.msgpack.encode(err.to_dict()))), ProtocolError)
