"""Identifiers: sortable, unique, printable.

``new_id("ckpt")`` -> ``ckpt-01JD3...``: a prefix naming the entity and a
26-character Crockford base32 ULID-style body (48-bit milliseconds + 80 random
bits), so ids sort by creation time and never collide across processes.
"""

from __future__ import annotations

import os
import secrets
import time

__all__ = ["new_id", "id_time_ms", "instance_name"]

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _b32(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        out.append(_ALPHABET[n & 31])
        n >>= 5
    return "".join(reversed(out))


def new_id(prefix: str = "", *, now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    body = _b32(ms & ((1 << 48) - 1), 10) + _b32(secrets.randbits(80), 16)
    return f"{prefix}-{body}" if prefix else body


def id_time_ms(ident: str) -> int:
    """The creation time (ms since the epoch) encoded in an id from :func:`new_id`."""
    body = ident.rsplit("-", 1)[-1]
    n = 0
    for ch in body[:10]:
        n = n * 32 + _ALPHABET.index(ch)
    return n


def instance_name(service: str) -> str:
    """A default instance name: service@host:pid."""
    return f"{service}@{os.uname().nodename}:{os.getpid()}"
