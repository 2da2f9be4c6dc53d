"""FireFlyerError <-> gRPC status, both ways, with the error's fields intact.

A server handler raises ``NotFound("no such chain", chain=7)``; the client's
``await stub.GetChain(...)`` raises ``NotFound`` with ``fields == {"chain": 7}``.

On the wire the status code is the error's ``code`` (the gRPC status names
that ``fireflyer.core.errors`` uses), the status details string is the message
(so any gRPC client sees something readable), and the trailing metadata
``ff-error-bin`` carries ``err.to_dict()`` as msgspec JSON so a Fire-Flyer
client rebuilds the same class.  When that trailer is absent (a status made by
grpc itself: DEADLINE_EXCEEDED, UNAVAILABLE, RESOURCE_EXHAUSTED for an
over-size message; or a server that is not ours) the client falls back to the
class registered for the status code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
import msgspec

from fireflyer.core.errors import FireFlyerError, Internal, error_class_for_code, error_from_dict

__all__ = [
    "ERROR_DETAILS_KEY",
    "status_for_error",
    "error_class_for_status",
    "encode_error_details",
    "decode_error_details",
    "error_trailers",
    "error_from_rpc_error",
    "internal_error",
]

#: trailing-metadata key of the error's details; '-bin' makes grpc carry bytes
ERROR_DETAILS_KEY = "ff-error-bin"
# grpc's default limit for all metadata of a response is 8 KiB and an
# over-size trailer turns the whole status into INTERNAL: stay well under it
_MAX_DETAILS_BYTES = 4096
_MAX_MESSAGE_CHARS = 1024

_encoder = msgspec.json.Encoder(enc_hook=str)


class _Details(msgspec.Struct):
    kind: str
    code: str
    message: str = ""
    fields: dict[str, str | int | float | bool | None] = {}


_decoder = msgspec.json.Decoder(_Details)


def status_for_error(err: FireFlyerError) -> grpc.StatusCode:
    """The status code of an error (its ``code`` name; UNKNOWN if not a gRPC name)."""
    return getattr(grpc.StatusCode, err.code, grpc.StatusCode.UNKNOWN)


# statuses fireflyer.core.errors has no class for, and the nearest one it has
_NEAREST = {"OUT_OF_RANGE": "INVALID_ARGUMENT"}


def error_class_for_status(code: grpc.StatusCode) -> type[FireFlyerError]:
    """The class a client raises for a status that came without details."""
    return error_class_for_code(_NEAREST.get(code.name, code.name))


def encode_error_details(err: FireFlyerError) -> bytes:
    """``err.to_dict()`` as JSON, shortened to fit in a trailer if it must be."""
    data = _encoder.encode(err.to_dict())
    if len(data) <= _MAX_DETAILS_BYTES:
        return data
    # keep the type and a readable message; fields are what gets dropped
    short = {"kind": err.kind, "code": err.code, "message": err.message[:_MAX_MESSAGE_CHARS],
             "fields": {"details_truncated": True}}
    return _encoder.encode(short)


def decode_error_details(data: bytes) -> FireFlyerError | None:
    """Rebuild an error from :func:`encode_error_details` output; None if malformed."""
    try:
        d = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return error_from_dict(msgspec.structs.asdict(d))


def error_trailers(err: FireFlyerError) -> tuple[tuple[str, bytes], ...]:
    return ((ERROR_DETAILS_KEY, encode_error_details(err)),)


def _find_details(metadata: Iterable[Any] | None) -> bytes | None:
    for item in metadata or ():
        key, value = item[0], item[1]
        if key == ERROR_DETAILS_KEY:
            return value if isinstance(value, bytes) else str(value).encode()
    return None


def error_from_rpc_error(exc: grpc.RpcError, *, method: str = "", target: str = "") -> FireFlyerError:
    """The typed error for a failed call (``grpc.aio.AioRpcError`` or a sync ``grpc.RpcError``)."""
    code: grpc.StatusCode = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
    details = (exc.details() if hasattr(exc, "details") else "") or ""  # type: ignore[attr-defined]
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None  # type: ignore[attr-defined]
    raw = _find_details(trailers)
    err = decode_error_details(raw) if raw is not None else None
    if err is not None:
        return err
    # a status grpc made (or a foreign server's): say which call and where
    where = " ".join(x for x in (method, f"at {target}" if target else "") if x)
    message = f"{details} ({where})" if where else details
    fields: dict[str, Any] = {}
    if method:
        fields["method"] = method
    if target:
        fields["target"] = target
    return error_class_for_status(code)(message or code.name, **fields)


def internal_error(method: str, exc: BaseException) -> Internal:
    """What a caller sees when a handler raised something that is not a FireFlyerError."""
    text = str(exc)[:_MAX_MESSAGE_CHARS]
    message = f"unexpected {type(exc).__name__} in {method}" + (f": {text}" if text else "")
    return Internal(message + " (the server logged the traceback)", method=method, exception=type(exc).__name__)
