"""The one error root of Fire-Flyer and its typed subclasses.

Every error carries *fields* (which rank, node, chain, path, key ...) next to its
message, so that callers can act on them and so that they survive a trip across
gRPC (``fireflyer.rpc`` puts them in the status details) or the data plane.

Each subclass names the canonical status ``code`` it maps to (the gRPC status
names, as plain strings so this module imports no grpc).  ``error_from_dict``
rebuilds the most specific registered class from its ``kind`` name, falling back
to the class registered for the code when the kind is unknown to this process
(an older client talking to a newer server).
"""

from __future__ import annotations

import errno as _errno
from typing import Any, ClassVar

__all__ = [
    "FireFlyerError",
    "InvalidArgument",
    "SettingsError",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "Unauthenticated",
    "FailedPrecondition",
    "NoClusterFound",
    "Aborted",
    "Conflict",
    "Unavailable",
    "DeadlineExceeded",
    "ResourceExhausted",
    "Cancelled",
    "Internal",
    "Unimplemented",
    "ProtocolError",
    "FsError",
    "error_from_dict",
    "error_class_for_code",
]

_BY_KIND: dict[str, type[FireFlyerError]] = {}
_BY_CODE: dict[str, type[FireFlyerError]] = {}

FieldValue = str | int | float | bool | None


class FireFlyerError(Exception):
    """Root of every error Fire-Flyer raises on purpose.

    ``FireFlyerError("chain 7 is stale", chain=7, expected=12, got=11)``: the
    message says what failed and what to do; keyword fields carry the data.
    """

    code: ClassVar[str] = "UNKNOWN"
    #: register this class as the default for its code when decoding unknown kinds
    default_for_code: ClassVar[bool] = False
    #: an answer of normal life, not a fault (a redirect to the primary): servers log it at DEBUG
    routine: ClassVar[bool] = False

    def __init__(self, message: str = "", **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, FieldValue] = {k: _plain(v) for k, v in fields.items()}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        _BY_KIND[cls.__name__] = cls
        if cls.__dict__.get("default_for_code", False):
            _BY_CODE[cls.code] = cls

    @property
    def kind(self) -> str:
        return type(self).__name__

    def __getattr__(self, name: str) -> Any:
        # Fields read as attributes: err.node, err.key.  Only called when normal
        # lookup fails, so real attributes always win.
        fields = self.__dict__.get("fields")
        if fields is not None and name in fields:
            return fields[name]
        raise AttributeError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "code": self.code, "message": self.message, "fields": dict(self.fields)}

    def __str__(self) -> str:
        return self.message or self.kind

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.fields.items())
        return f"{self.kind}({self.message!r}{extra})"

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self.message, self.fields))


def _rebuild(cls: type[FireFlyerError], message: str, fields: dict[str, Any]) -> FireFlyerError:
    return cls(message, **fields)


def _plain(v: Any) -> FieldValue:
    if v is None or isinstance(v, str | int | float | bool):
        return v
    return str(v)


class InvalidArgument(FireFlyerError, ValueError):
    code = "INVALID_ARGUMENT"
    default_for_code = True


class SettingsError(InvalidArgument):
    """A setting has a bad value: fields ``key``, ``expected``, ``source``."""


class NotFound(FireFlyerError, LookupError):
    code = "NOT_FOUND"
    default_for_code = True


class AlreadyExists(FireFlyerError):
    code = "ALREADY_EXISTS"
    default_for_code = True


class PermissionDenied(FireFlyerError, PermissionError):
    code = "PERMISSION_DENIED"
    default_for_code = True


class Unauthenticated(FireFlyerError):
    code = "UNAUTHENTICATED"
    default_for_code = True


class FailedPrecondition(FireFlyerError):
    code = "FAILED_PRECONDITION"
    default_for_code = True


class NoClusterFound(FailedPrecondition):
    """A client needs a service (or a token) and found neither an argument, an ``FF_*`` variable nor a
    local cluster (``--state-dir`` / ``FF_STATE_DIR`` / ``.ff``); fields ``missing``, ``state_dir``."""


class Aborted(FireFlyerError):
    code = "ABORTED"
    default_for_code = True


class Conflict(Aborted):
    """A transaction or version conflict; retrying may succeed."""


class Unavailable(FireFlyerError, ConnectionError):
    code = "UNAVAILABLE"
    default_for_code = True


class DeadlineExceeded(FireFlyerError, TimeoutError):
    code = "DEADLINE_EXCEEDED"
    default_for_code = True


class ResourceExhausted(FireFlyerError):
    code = "RESOURCE_EXHAUSTED"
    default_for_code = True


class Cancelled(FireFlyerError):
    code = "CANCELLED"
    default_for_code = True


class Internal(FireFlyerError):
    code = "INTERNAL"
    default_for_code = True


class Unimplemented(FireFlyerError, NotImplementedError):
    code = "UNIMPLEMENTED"
    default_for_code = True


class ProtocolError(FireFlyerError):
    """A peer broke the data-plane or bus protocol (bad frame, bad header)."""

    code = "DATA_LOSS"
    default_for_code = True


class FsError(FireFlyerError, OSError):
    """A file-system error; ``errno`` is the POSIX errno (ENOENT, EEXIST ...)."""

    code = "FAILED_PRECONDITION"

    _ERRNO_CODES: ClassVar[dict[int, str]] = {
        _errno.ENOENT: "NOT_FOUND",
        _errno.EEXIST: "ALREADY_EXISTS",
        _errno.EACCES: "PERMISSION_DENIED",
        _errno.EPERM: "PERMISSION_DENIED",
        _errno.EINVAL: "INVALID_ARGUMENT",
        _errno.ENOSPC: "RESOURCE_EXHAUSTED",
    }

    def __init__(self, message: str = "", *, errno: int = _errno.EIO, **fields: Any) -> None:
        FireFlyerError.__init__(self, message, errno=errno, **fields)
        # OSError's own attributes, so `except OSError as e: e.errno` works
        self.errno = errno
        self.strerror = message
        self.code = self._ERRNO_CODES.get(errno, "FAILED_PRECONDITION")  # type: ignore[misc]

    def __reduce__(self) -> Any:
        fields = dict(self.fields)
        return (_rebuild_fs, (type(self), self.message, fields))

    def __str__(self) -> str:
        return f"[Errno {self.errno}] {self.message}" if self.message else _errno.errorcode.get(self.errno, "EIO")


def _rebuild_fs(cls: type[FsError], message: str, fields: dict[str, Any]) -> FsError:
    return cls(message, **fields)


def error_class_for_code(code: str) -> type[FireFlyerError]:
    return _BY_CODE.get(code, FireFlyerError)


def error_from_dict(d: dict[str, Any]) -> FireFlyerError:
    """Rebuild an error from ``to_dict()`` output (kind first, then code)."""
    fields = dict(d.get("fields") or {})
    message = str(d.get("message", ""))
    cls = _BY_KIND.get(str(d.get("kind", ""))) or error_class_for_code(str(d.get("code", "UNKNOWN")))
    try:
        return cls(message, **fields)
    except TypeError:
        # a subclass with a narrower constructor: keep the data, lose the type
        return error_class_for_code(cls.code)(message, **fields)


_BY_KIND["FireFlyerError"] = FireFlyerError
