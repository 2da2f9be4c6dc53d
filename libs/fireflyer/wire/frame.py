"""Frames of the data plane: pure encode/parse, no I/O.

A frame on the wire is three parts::

    prefix   20 bytes, little endian:  magic b"FFWR" | version u16 | flags u16 | header_len u32 | payload_len u64
    header   header_len bytes of msgpack: one of the tagged Structs below
    payload  payload_len raw bytes (never encoded: sent and received zero-copy)

Why this shape:

- The fixed prefix lets a reader check sizes against its limits *before* it allocates or
  reads anything, so an oversized or garbage frame costs the server 20 bytes.
- The header is small, typed and extensible (msgspec tagged union, unknown fields ignored).
- The payload length lives only in the prefix: one source of truth for framing.  Headers that
  describe a payload carry an optional ``crc32`` of it (zlib's CRC-32; a CRC-32C would need a
  dependency and buys nothing over loopback or TCP's own checksums for our purposes — the field
  is there for end-to-end checks by storage, which may compute it once and keep it with the data).
- ``flags`` is reserved and must be zero; a peer that sets it speaks a protocol we do not.

Frame types (the ``t`` tag):

``hello``    client -> server, first frame on a connection: bearer ``token`` and the client's name.
``welcome``  server -> client: the token was accepted; the ``principal`` it maps to.
``req``      a request: request id ``rid``, operation name ``op``, application ``meta``, trace carrier.
``resp``     the reply to request ``rid``: ``meta`` and a payload.
``error``    the request ``rid`` failed (``rid`` 0: the connection itself did), with the error as
             :meth:`FireFlyerError.to_dict` wrote it.

:func:`decode_frame_head` is the whole parse of a frame's head from a buffer (no I/O, no
allocation beyond the decoded header): the server's handshake and the fuzz tests use it.

Every parse failure raises :class:`~fireflyer.core.errors.ProtocolError` with a ``reason``
field (``bad_magic``, ``bad_version``, ``bad_flags``, ``oversized_header``, ``oversized_payload``,
``bad_header``) that the connection layers log when they close a connection over it.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import msgspec

from fireflyer.core.errors import ProtocolError

__all__ = [
    "MAGIC",
    "VERSION",
    "PREFIX",
    "FrameLimits",
    "Hello",
    "Welcome",
    "Request",
    "Response",
    "ErrorFrame",
    "Header",
    "encode_head",
    "parse_prefix",
    "decode_header",
    "decode_frame_head",
    "hello_problem",
    "crc32",
]

MAGIC = b"FFWR"
VERSION = 1
PREFIX = struct.Struct("<4sHHIQ")


#: protocol maxima: no limits a reader is configured with may exceed these (header_len is a
#: u32 and payload_len a u64 on the wire; nothing legitimate comes near either)
MAX_HEADER_BYTES = 16 << 20
MAX_PAYLOAD_BYTES = 1 << 56


class FrameLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What a reader accepts; a frame over a limit closes the connection."""

    max_header_bytes: int = 64 * 1024
    max_payload_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if not 0 < self.max_header_bytes <= MAX_HEADER_BYTES:
            raise ValueError(f"max_header_bytes must be in 1..{MAX_HEADER_BYTES}, got {self.max_header_bytes}")
        if not 0 <= self.max_payload_bytes <= MAX_PAYLOAD_BYTES:
            raise ValueError(f"max_payload_bytes must be in 0..{MAX_PAYLOAD_BYTES}, got {self.max_payload_bytes}")


class Hello(msgspec.Struct, frozen=True, kw_only=True, tag="hello", tag_field="t"):
    token: str
    client: str = ""


class Welcome(msgspec.Struct, frozen=True, kw_only=True, tag="welcome", tag_field="t"):
    principal: str = ""
    server: str = ""


class Request(msgspec.Struct, frozen=True, kw_only=True, tag="req", tag_field="t"):
    rid: int
    op: str
    meta: dict[str, Any] = {}
    crc32: int | None = None
    #: W3C trace context of the caller (``traceparent``/``tracestate``); empty when untraced
    trace: dict[str, str] = {}


class Response(msgspec.Struct, frozen=True, kw_only=True, tag="resp", tag_field="t"):
    rid: int
    meta: dict[str, Any] = {}
    crc32: int | None = None


class ErrorFrame(msgspec.Struct, frozen=True, kw_only=True, tag="error", tag_field="t"):
    #: 0 when the error is about the connection (auth, protocol) rather than one request
    rid: int
    error: dict[str, Any]


Header = Hello | Welcome | Request | Response | ErrorFrame

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Header)


def encode_head(header: Header, payload_len: int) -> bytearray:
    """Prefix + encoded header in one buffer (the payload is sent separately, uncopied)."""
    buf = bytearray(PREFIX.size)
    # encode straight after the room left for the prefix: one allocation, no concatenation
    _encoder.encode_into(header, buf, PREFIX.size)
    PREFIX.pack_into(buf, 0, MAGIC, VERSION, 0, len(buf) - PREFIX.size, payload_len)
    return buf


def parse_prefix(prefix: bytes | bytearray | memoryview, limits: FrameLimits) -> tuple[int, int]:
    """Check a prefix against the protocol and ``limits``; return (header_len, payload_len)."""
    if len(prefix) != PREFIX.size:
        raise ProtocolError(f"frame prefix of {len(prefix)} bytes (it is {PREFIX.size})", reason="short_prefix")
    magic, version, flags, header_len, payload_len = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {bytes(magic)!r} (not a Fire-Flyer wire peer?)",
                            reason="bad_magic")
    if version != VERSION:
        raise ProtocolError(f"unsupported wire protocol version {version} (this side speaks {VERSION})",
                            reason="bad_version", version=version)
    if flags:
        raise ProtocolError(f"reserved frame flags set: {flags:#x}", reason="bad_flags", flags=flags)
    if header_len == 0 or header_len > limits.max_header_bytes:
        raise ProtocolError(f"frame header of {header_len} bytes (limit {limits.max_header_bytes})",
                            reason="oversized_header", size=header_len, limit=limits.max_header_bytes)
    if payload_len > limits.max_payload_bytes:
        raise ProtocolError(f"frame payload of {payload_len} bytes (limit {limits.max_payload_bytes})",
                            reason="oversized_payload", size=payload_len, limit=limits.max_payload_bytes)
    return header_len, payload_len


def decode_header(buf: bytes | bytearray | memoryview) -> Header:
    try:
        return _decoder.decode(buf)
    except msgspec.DecodeError as e:  # ValidationError is a DecodeError
        raise ProtocolError(f"undecodable frame header: {e}", reason="bad_header") from None


def decode_frame_head(buf: bytes | bytearray | memoryview, limits: FrameLimits) -> tuple[Header, int, int] | None:
    """Parse the frame at the start of ``buf``: ``(header, head_len, payload_len)`` where
    ``head_len`` is prefix + header bytes (the payload starts there), or None while ``buf``
    holds less than the whole head.  Pure: both length fields are checked against ``limits``
    before anything is sliced, and a broken frame raises :class:`ProtocolError` only."""
    if len(buf) < PREFIX.size:
        return None
    header_len, payload_len = parse_prefix(memoryview(buf)[:PREFIX.size], limits)
    end = PREFIX.size + header_len
    if len(buf) < end:
        return None
    return decode_header(memoryview(buf)[PREFIX.size:end]), end, payload_len


def hello_problem(header: Header, payload_len: int) -> ProtocolError | None:
    """What is wrong with ``header`` as a connection's first frame, or None if it is a good hello."""
    if not isinstance(header, Hello):
        return ProtocolError(f"the first frame must be a hello, got a {type(header).__name__} frame",
                             reason="expected_hello", got=type(header).__name__)
    if payload_len:
        return ProtocolError(f"a hello frame carries no payload, this one declares {payload_len} bytes",
                             reason="hello_with_payload", size=payload_len)
    return None


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 of a buffer, continuing from ``value`` (zlib releases the GIL on large inputs)."""
    return zlib.crc32(data, value) & 0xFFFFFFFF
