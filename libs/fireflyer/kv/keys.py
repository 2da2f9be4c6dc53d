"""Order-preserving key encoding and key-range helpers.

``pack(("DENT", 42, b"name"))`` turns a tuple of ``None``/``bytes``/``str``/``int``
into bytes whose bytewise order equals the tuple order (element by element, shorter
prefix first), so a directory's entries are one contiguous range and ``get_range``
returns them sorted.  Encoding (our own, documented so other languages can read it):

- ``None``  -> ``0x00``
- ``bytes`` -> ``0x01`` + data with ``0x00`` escaped as ``0x00 0xFF`` + ``0x00``
- ``str``   -> ``0x02`` + UTF-8, escaped the same way, + ``0x00``
- ``int`` < 0  -> ``0x1F`` + 8-byte big-endian ``n + 2**64`` (so -1 > -2)
- ``int`` >= 0 -> ``0x20`` + 8-byte big-endian ``n``

Ints are fixed width and big-endian (ids sort numerically); their range is
``-(2**64 - 1) .. 2**64 - 1``.  The escape keeps ``b"a"`` < ``b"a\\x00"`` < ``b"ab"``.
Every type code is below ``0xFF``, hence ``prefix_range(pack(t))`` covers exactly
the keys that extend tuple ``t``.

3FS uses raw 4-byte prefixes (``INOD``, ``DENT``); ``b"INOD" + pack((42,))`` works too.
"""

from __future__ import annotations

from .errors import KVInvalidArgument

__all__ = ["Element", "pack", "unpack", "strinc", "prefix_range", "key_after"]

Element = None | bytes | str | int

_NONE, _BYTES, _STR, _NEG, _POS = 0x00, 0x01, 0x02, 0x1F, 0x20
_MAX = 2**64


def _escape(data: bytes) -> bytes:
    return data.replace(b"\x00", b"\x00\xff") + b"\x00"


def pack(elements: tuple[Element, ...] | list[Element]) -> bytes:
    """Encode a tuple so that bytewise order of results equals tuple order."""
    out = bytearray()
    for e in elements:
        if e is None:
            out.append(_NONE)
        elif isinstance(e, bytes | bytearray | memoryview):
            out.append(_BYTES)
            out += _escape(bytes(e))
        elif isinstance(e, str):
            out.append(_STR)
            out += _escape(e.encode("utf-8"))
        elif isinstance(e, int) and not isinstance(e, bool):
            if not -_MAX < e < _MAX:
                raise KVInvalidArgument(f"int {e} is outside the packable range ±(2**64-1)", value=e)
            if e < 0:
                out.append(_NEG)
                out += (e + _MAX).to_bytes(8, "big")
            else:
                out.append(_POS)
                out += e.to_bytes(8, "big")
        else:
            raise KVInvalidArgument(
                f"cannot pack {type(e).__name__}; use None, bytes, str or int", type=type(e).__name__
            )
    return bytes(out)


def _unescape(key: bytes, pos: int) -> tuple[bytes, int]:
    out = bytearray()
    n = len(key)
    while pos < n:
        b = key[pos]
        if b == 0:
            if pos + 1 < n and key[pos + 1] == 0xFF:
                out.append(0)
                pos += 2
                continue
            return bytes(out), pos + 1
        out.append(b)
        pos += 1
    raise KVInvalidArgument("packed key ends inside a bytes/str element", key=key)


def unpack(key: bytes) -> tuple[Element, ...]:
    """Decode what :func:`pack` produced (raises ``KVInvalidArgument`` on anything else)."""
    out: list[Element] = []
    pos = 0
    while pos < len(key):
        code = key[pos]
        pos += 1
        if code == _NONE:
            out.append(None)
        elif code in (_BYTES, _STR):
            raw, pos = _unescape(key, pos)
            out.append(raw if code == _BYTES else raw.decode("utf-8"))
        elif code in (_NEG, _POS):
            if pos + 8 > len(key):
                raise KVInvalidArgument("packed key ends inside an int element", key=key)
            n = int.from_bytes(key[pos : pos + 8], "big")
            out.append(n - _MAX if code == _NEG else n)
            pos += 8
        else:
            raise KVInvalidArgument(f"unknown type code 0x{code:02x} at offset {pos - 1}", key=key)
    return tuple(out)


def strinc(prefix: bytes) -> bytes:
    """The first key that does not start with ``prefix`` (trailing 0xFF bytes dropped, last byte + 1)."""
    p = prefix.rstrip(b"\xff")
    if not p:
        raise KVInvalidArgument("prefix of only 0xFF bytes has no upper bound", key=prefix)
    return p[:-1] + bytes([p[-1] + 1])


def prefix_range(prefix: bytes) -> tuple[bytes, bytes]:
    """``(begin, end)`` covering every key that starts with ``prefix``."""
    return prefix, strinc(prefix)


def key_after(key: bytes) -> bytes:
    """The smallest key greater than ``key``: ``[key, key_after(key))`` is exactly ``key``."""
    return key + b"\x00"
