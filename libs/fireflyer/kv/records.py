"""msgpack for records kept in the KV: one encoder, and a decoder per record type made once.

Services keep typed records (msgspec structs) as KV values; decoding through a typed decoder
validates them as it goes, and building that decoder is the costly part, so it is cached.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

__all__ = ["encode", "decode"]

T = TypeVar("T")
_enc = msgspec.msgpack.Encoder()
_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def encode(record: Any) -> bytes:
    return _enc.encode(record)


def decode(data: bytes, cls: type[T]) -> T:
    dec = _decoders.get(cls)
    if dec is None:
        dec = _decoders[cls] = msgspec.msgpack.Decoder(cls)
    return dec.decode(data)  # type: ignore[no-any-return]
