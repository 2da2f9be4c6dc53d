"""Property-based fuzzing of the wire frame parser (pure functions, no sockets).

Whatever bytes arrive, the parse functions (:func:`parse_prefix`, :func:`decode_header`,
:func:`decode_frame_head`, :class:`FrameSplitter`) either return frames within the reader's
limits or raise :class:`ProtocolError`: no other exception, no buffer beyond what the limits
allow, no hang.  Bounded in time so it runs in CI.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fireflyer.core.errors import ProtocolError
from fireflyer.wire.aio import FrameSplitter
from fireflyer.wire.frame import (
    PREFIX,
    ErrorFrame,
    FrameLimits,
    Header,
    Hello,
    Request,
    Response,
    Welcome,
    decode_frame_head,
    decode_header,
    encode_head,
    hello_problem,
    parse_prefix,
)

LIMITS = FrameLimits(max_header_bytes=4096, max_payload_bytes=1 << 16)
#: the most a splitter may ever hold: one whole frame at the limits (plus one feed's worth)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: one example's wall-clock bound: a parse that loops or waits would blow it
EXAMPLE_S = 2.0

_plain = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True),
                   st.text(max_size=20), st.binary(max_size=20))
_meta = st.dictionaries(st.text(max_size=8), st.recursive(_plain, lambda c: st.lists(c, max_size=4)
                                                          | st.dictionaries(st.text(max_size=5), c, max_size=4),
                                                          max_leaves=20), max_size=5)
_headers = st.one_of(
    st.builds(Hello, token=st.text(max_size=40), client=st.text(max_size=10)),
    st.builds(Welcome, principal=st.text(max_size=10), server=st.text(max_size=10)),
    st.builds(Request, rid=st.integers(0, 2**64 - 1), op=st.text(max_size=10), meta=_meta,
              crc32=st.one_of(st.none(), st.integers(0, 2**32 - 1))),
    st.builds(Response, rid=st.integers(0, 2**64 - 1), meta=_meta),
    st.builds(ErrorFrame, rid=st.integers(0, 2**64 - 1), error=_meta),
)


@st.composite
def _frames(draw) -> bytes:
    header = draw(_headers)
    payload = draw(st.binary(max_size=64))
    return bytes(encode_head(header, len(payload))) + payload


@st.composite
def _mutated(draw) -> bytes:
    """Valid frames, then byte flips, truncations, insertions and length-field rewrites."""
    data = bytearray(b"".join(draw(st.lists(_frames(), min_size=1, max_size=3))))
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "hlen", "plen", "dup"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del data[i:]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "dup":
            data += data[: i + 1]
        elif len(data) >= PREFIX.size:  # rewrite a length field of the first frame
            at, width = (8, 4) if op == "hlen" else (12, 8)
            value = draw(st.sampled_from([0, 1, 2**(8 * width) - 1, 2**(8 * width - 1), LIMITS.max_header_bytes + 1,
                                          LIMITS.max_payload_bytes + 1, 64 << 20]))
            data[at:at + width] = value.to_bytes(width, "little")
    return bytes(data)


_inputs = st.one_of(st.binary(max_size=512), _mutated())


def _check_frame(header: Header, payload_len: int) -> None:
    assert isinstance(header, Hello | Welcome | Request | Response | ErrorFrame)
    assert 0 <= payload_len <= LIMITS.max_payload_bytes


@FUZZ
@given(st.binary(min_size=0, max_size=40))
def test_parse_prefix_only_raises_protocol_errors(data):
    try:
        header_len, payload_len = parse_prefix(data[:PREFIX.size], LIMITS)
    except ProtocolError as e:
        assert e.fields.get("reason")
        return
    assert 0 < header_len <= LIMITS.max_header_bytes and 0 <= payload_len <= LIMITS.max_payload_bytes


@FUZZ
@given(st.binary(max_size=256) | _headers.map(lambda h: bytes(encode_head(h, 0))[PREFIX.size:]))
def test_decode_header_only_raises_protocol_errors(data):
    try:
        header = decode_header(data)
    except ProtocolError as e:
        assert e.fields["reason"] == "bad_header"
        return
    _check_frame(header, 0)


@FUZZ
@given(_inputs)
def test_decode_frame_head_is_total_and_bounded(data):
    t0 = time.monotonic()
    try:
        head = decode_frame_head(data, LIMITS)
    except ProtocolError as e:
        assert e.fields.get("reason")
        return
    finally:
        assert time.monotonic() - t0 < EXAMPLE_S
    if head is None:  # incomplete: never because of a length past the limits
        if len(data) >= PREFIX.size:
            header_len, _ = parse_prefix(data[:PREFIX.size], LIMITS)
            assert len(data) < PREFIX.size + header_len
        return
    header, head_len, payload_len = head
    assert PREFIX.size < head_len <= min(len(data), PREFIX.size + LIMITS.max_header_bytes)
    _check_frame(header, payload_len)
    problem = hello_problem(header, payload_len)
    assert problem is None or isinstance(problem, ProtocolError)


@FUZZ
@given(_inputs, st.lists(st.integers(1, 64), min_size=1, max_size=20))
def test_frame_splitter_in_any_chunking(data, cuts):
    splitter = FrameSplitter(LIMITS)
    bound = PREFIX.size + LIMITS.max_header_bytes + LIMITS.max_payload_bytes
    t0 = time.monotonic()
    pos, i = 0, 0
    try:
        while pos < len(data):
            n = cuts[i % len(cuts)]
            i += 1
            for header, payload in splitter.feed(data[pos:pos + n]):
                _check_frame(header, len(payload))
            pos += n
            # never more buffered than one frame the limits allow (plus the bytes of this feed)
            assert splitter.buffered <= bound + n
    except ProtocolError as e:
        assert e.fields.get("reason")
    assert time.monotonic() - t0 < EXAMPLE_S


@FUZZ
@given(st.lists(_frames(), min_size=1, max_size=4), st.integers(1, 50))
def test_valid_frames_round_trip_through_the_splitter(frames, step):
    data = b"".join(frames)
    splitter = FrameSplitter(LIMITS)
    got = []
    for pos in range(0, len(data), step):
        got += splitter.feed(data[pos:pos + step])
    assert len(got) == len(frames) and splitter.buffered == 0
    for raw, (header, payload) in zip(frames, got, strict=True):
        assert bytes(encode_head(header, len(payload))) + payload == raw


@pytest.mark.parametrize("bad", [
    {"max_header_bytes": 0}, {"max_header_bytes": 1 << 30}, {"max_payload_bytes": -1},
    {"max_payload_bytes": 1 << 62},
])
def test_frame_limits_are_checked_against_the_protocol_maxima(bad):
    with pytest.raises(ValueError):
        FrameLimits(**bad)
