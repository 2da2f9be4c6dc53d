"""Pure encode/parse of frames: no sockets."""

import pytest

from fireflyer.core.errors import ProtocolError
from fireflyer.wire.frame import (
    MAGIC,
    PREFIX,
    VERSION,
    ErrorFrame,
    FrameLimits,
    Hello,
    Request,
    Response,
    crc32,
    decode_header,
    encode_head,
    parse_prefix,
)


def test_head_round_trips_every_frame_type():
    headers = [
        Hello(token="t", client="c"),
        Request(rid=7, op="read", meta={"chunk": 3, "path": "/a"}, crc32=123, trace={"traceparent": "x"}),
        Response(rid=7, meta={"v": [1, 2]}),
        ErrorFrame(rid=0, error={"kind": "NotFound", "code": "NOT_FOUND", "message": "m", "fields": {}}),
    ]
    for h in headers:
        head = encode_head(h, 4096)
        hlen, plen = parse_prefix(head[:PREFIX.size], FrameLimits())
        assert (hlen, plen) == (len(head) - PREFIX.size, 4096)
        assert decode_header(head[PREFIX.size:]) == h


def _prefix(magic=MAGIC, version=VERSION, flags=0, hlen=10, plen=0):
    return PREFIX.pack(magic, version, flags, hlen, plen)


@pytest.mark.parametrize(
    "prefix, reason",
    [
        (_prefix(magic=b"GET "), "bad_magic"),
        (_prefix(version=99), "bad_version"),
        (_prefix(flags=1), "bad_flags"),
        (_prefix(hlen=0), "oversized_header"),
        (_prefix(hlen=1 << 20), "oversized_header"),
        (_prefix(plen=(1 << 30) + 1), "oversized_payload"),
    ],
)
def test_bad_prefixes_name_their_reason(prefix, reason):
    with pytest.raises(ProtocolError) as ei:
        parse_prefix(prefix, FrameLimits())
    assert ei.value.reason == reason


def test_limits_are_configurable():
    limits = FrameLimits(max_header_bytes=16, max_payload_bytes=100)
    assert parse_prefix(_prefix(hlen=16, plen=100), limits) == (16, 100)
    with pytest.raises(ProtocolError):
        parse_prefix(_prefix(hlen=16, plen=101), limits)


@pytest.mark.parametrize("garbage", [b"\xff" * 10, b"\x81\xa1t\xa3bad", b"\x80", b"\x81\xa1t\xa3req"])
def test_garbage_headers_are_protocol_errors(garbage):
    # undecodable msgpack, an unknown tag, no tag, a request missing its fields
    with pytest.raises(ProtocolError) as ei:
        decode_header(garbage)
    assert ei.value.reason == "bad_header"


def test_crc32_is_stable_and_unsigned():
    assert crc32(b"123456789") == 0xCBF43926  # the CRC-32 check value
    assert crc32(memoryview(bytearray(b"123456789"))) == 0xCBF43926
