"""Payloads in parts: replies of several buffers and file regions (sendfile), scattered receives."""

from __future__ import annotations

import os
import random

import pytest

from fireflyer.core.errors import InvalidArgument, ProtocolError, ResourceExhausted
from fireflyer.wire import FileRegion, ServerRequest


@pytest.fixture
def blob(tmp_path):
    data = random.Random(3).randbytes(3 * (1 << 20) + 12345)  # odd length, several sendfile calls' worth
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


@pytest.mark.parametrize("region", [(0, -1), (1, 7), (4095, 1 << 20), (12345, 2 * (1 << 20) + 1)])
def test_buffers_and_file_regions_arrive_back_to_back(wire_server, connect, blob, region):
    fd, data = blob
    off, n = region
    n = len(data) - off if n < 0 else n
    head, tail = b"head-" * 7, bytearray(b"tail") * 1001

    def handle(req: ServerRequest) -> None:
        req.reply([head, FileRegion(fd, off, n), memoryview(tail)], meta={"n": n})

    reply = connect(wire_server(handle)).request("parts")
    assert bytes(reply.payload) == head + data[off:off + n] + bytes(tail)
    assert reply.meta == {"n": n} and reply.size == len(head) + n + len(tail)


def test_a_file_region_alone_and_an_empty_region(wire_server, connect, blob):
    fd, data = blob

    def handle(req: ServerRequest) -> None:
        req.reply(FileRegion(fd, 0, len(data)) if req.op == "all" else [FileRegion(fd, 5, 0)])

    conn = connect(wire_server(handle))
    assert bytes(conn.request("all").payload) == data
    assert conn.request("empty").size == 0
    assert bytes(conn.request("all").payload) == data  # the stream stayed framed


def test_a_file_shorter_than_its_region_pads_zeros_and_keeps_the_stream_framed(wire_server, connect, tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(b"x" * 1000)
    fd = os.open(path, os.O_RDONLY)
    regions = []

    def handle(req: ServerRequest) -> None:
        regions.append(FileRegion(fd, 0, 70_000 + 1))  # longer than one zero block
        req.reply([regions[-1], b"!"])

    try:
        conn = connect(wire_server(handle))
        got = bytes(conn.request("short").payload)
        assert got == b"x" * 1000 + bytes(69_001) + b"!"
        assert regions[0].short == 69_001
        assert conn.request("again").size == 70_002
    finally:
        os.close(fd)


def test_scattered_receive_fills_each_buffer_in_order(wire_server, connect):
    payload = random.Random(5).randbytes(10_000)

    def handle(req: ServerRequest) -> None:
        req.reply([payload[:3000], payload[3000:]], checksum=True)

    conn = connect(wire_server(handle))
    a, b, c = bytearray(4000), bytearray(5000), bytearray(2000)
    reply = conn.request("scatter", into=[a, b, c])
    assert [len(p) for p in reply.parts] == [4000, 5000, 1000] and reply.size == 10_000
    assert bytes(a) + bytes(b) + bytes(c[:1000]) == payload
    assert b"".join(bytes(p) for p in reply.parts) == payload
    # too little room: the reply is drained, the call fails, the connection goes on
    with pytest.raises(ResourceExhausted):
        conn.request("scatter", into=[bytearray(10), bytearray(10)])
    assert conn.request("scatter", into=[bytearray(10_000)]).size == 10_000


def test_a_checksum_over_parts_is_checked_and_needs_memory(wire_server, connect, blob):
    fd, _ = blob

    def handle(req: ServerRequest) -> None:
        if req.op == "file":
            req.reply([b"a", FileRegion(fd, 0, 10)], checksum=True)
        else:
            req.reply([b"abc", b"def"], checksum=True)

    conn = connect(wire_server(handle))
    assert bytes(conn.request("mem").payload) == b"abcdef"
    with pytest.raises(InvalidArgument):
        conn.request("file")


def test_a_scattered_payload_that_fails_its_checksum_is_refused(wire_server, connect):
    from fireflyer.wire import server as server_mod

    def handle(req: ServerRequest) -> None:
        req._send(server_mod.Response(rid=req.rid, crc32=123), [memoryview(b"abc"), memoryview(b"def")])

    conn = connect(wire_server(handle))
    with pytest.raises(ProtocolError) as ei:
        conn.request("bad", into=[bytearray(3), bytearray(3)])
    assert ei.value.fields["reason"] == "checksum_mismatch"
