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
    "crc32",
]

MAGIC = b"FFWR"
VERSION = 1
PREFIX = struct.Struct("<4sHHIQ")


class FrameLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What a reader accepts; a frame over a limit closes the connection."""

    max_header_bytes: int = 64 * 1024
    max_payload_bytes: int = 1 << 30


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


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 of a buffer, continuing from ``value`` (zlib releases the GIL on large inputs)."""
    return zlib.crc32(data, value) & 0xFFFFFFFF
