"""What the namespace can hold, in one place, and the pure checks of request values against it.

Every length, time, flag word and path that reaches meta (gRPC, the wire endpoint, or a
library caller of :class:`~fireflyer.meta.MetaStore`) goes through a function here before
anything is written; a value outside the limits raises :class:`~.model.FsInvalidArgument`
(an ``FsError`` that is also ``InvalidArgument``: gRPC INVALID_ARGUMENT) whose errno says
which kind of limit, whose message names the field, the value and the limit, and whose
fields carry ``field``, ``value`` and ``limit``.  Nothing here touches the KV.

Limits (and why):

- ``MAX_PATH`` = 4096 bytes of UTF-8 for any path (Linux PATH_MAX), ``MAX_NAME`` = 255
  bytes per component (NAME_MAX): ENAMETOOLONG.
- ``MAX_DEPTH`` = 256 components for a path that *makes* a name (mkdir, mkdir -p, create,
  symlink, link, rename's destination): ENAMETOOLONG.  Lookups are bounded by
  ``MAX_PATH`` only (at most 2048 components), so a deeper tree made before this limit
  existed can still be listed and removed.  A rename moving a subtree under a deep
  directory is not checked against the subtree's own depth (that needs a scan); the CLI's
  and client's tree walks are iterative, so no depth breaks them.
- File length: a chunk id holds a 32-bit chunk index (``fireflyer.storage.chunkid``:
  2 reserved bytes, 8 inode, 2 track, 4 index), so a file of chunk size ``c`` holds at most
  ``2**32 * c`` bytes (4 PiB at 1 MiB chunks, 256 PiB at the 64 MiB maximum).  A truncate
  or length report past that is EFBIG; a negative or non-integer length is EINVAL.
- Times (atime, mtime) are float seconds since the epoch: finite, and inside
  [``MIN_TIME``, ``MAX_TIME``] = 0001-01-02 .. 9999-12-30 UTC, what a ``datetime`` can show
  in every time zone; else EINVAL (NaN, +-inf and 1e300 included).
- Open/create flags: an int with only the bits of ``KNOWN_OPEN_FLAGS`` (the access mode,
  O_CREAT, O_EXCL, O_TRUNC, O_APPEND, O_NOFOLLOW, O_DIRECTORY and the bits a kernel
  accepts and meta ignores: O_CLOEXEC, O_NONBLOCK, O_SYNC, O_DSYNC, O_NOCTTY, O_DIRECT,
  O_NOATIME, O_LARGEFILE) and an access mode of O_RDONLY, O_WRONLY or O_RDWR; else EINVAL
  (``-1`` has every bit set).
"""

from __future__ import annotations

import datetime as _dt
import errno as E
import math
import os

from .model import MAX_CHUNK_SIZE, FsInvalidArgument

__all__ = [
    "MAX_PATH",
    "MAX_NAME",
    "MAX_DEPTH",
    "MAX_U64",
    "MAX_CHUNK_INDEX",
    "MAX_FILE_SIZE",
    "MIN_TIME",
    "MAX_TIME",
    "KNOWN_OPEN_FLAGS",
    "max_file_size",
    "check_length",
    "check_file_size",
    "check_time",
    "check_open_flags",
    "check_path_bytes",
    "check_depth",
    "path_depth",
]

#: bytes of UTF-8 in a path (Linux PATH_MAX)
MAX_PATH = 4096
#: bytes of UTF-8 in one name (Linux NAME_MAX)
MAX_NAME = 255
#: components of a path that makes a new name
MAX_DEPTH = 256
#: the largest value of a uint64 field (ids, uids)
MAX_U64 = (1 << 64) - 1
#: the largest chunk index a chunk id holds (a 32-bit field; fireflyer.storage.chunkid.MAX_INDEX)
MAX_CHUNK_INDEX = (1 << 32) - 1
#: the largest file any layout holds (at the largest chunk size)
MAX_FILE_SIZE = (MAX_CHUNK_INDEX + 1) * MAX_CHUNK_SIZE
_UTC = _dt.UTC
#: the earliest and latest time a file may carry (a day inside datetime's range: time zones)
MIN_TIME = _dt.datetime(1, 1, 2, tzinfo=_UTC).timestamp()
MAX_TIME = _dt.datetime(9999, 12, 30, tzinfo=_UTC).timestamp()


def _flag(name: str) -> int:
    return int(getattr(os, name, 0))


KNOWN_OPEN_FLAGS = 0
for _name in ("O_ACCMODE", "O_CREAT", "O_EXCL", "O_TRUNC", "O_APPEND", "O_NOFOLLOW", "O_DIRECTORY",
              "O_CLOEXEC", "O_NONBLOCK", "O_SYNC", "O_DSYNC", "O_NOCTTY", "O_DIRECT", "O_NOATIME",
              "O_LARGEFILE"):
    KNOWN_OPEN_FLAGS |= _flag(_name)
_ACCESS_MODES = (os.O_RDONLY, os.O_WRONLY, os.O_RDWR)


def _short(value: object) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int too long for str() (sys.set_int_max_str_digits)
        return f"<int of {value.bit_length()} bits>" if isinstance(value, int) else "<unprintable>"
    return text if len(text) <= 80 else text[:77] + "..."


def _field(value: int) -> int | str:
    """An int for an error's fields (they travel as msgpack/JSON): exact when it fits 64 bits."""
    return value if -(1 << 63) <= value < 1 << 63 else _short(value)


def _hex(value: int) -> str:
    return f"{value:#x}" if value.bit_length() <= 64 else f"<int of {value.bit_length()} bits>"


def max_file_size(chunk_size: int) -> int:
    """The most bytes a file with chunks of ``chunk_size`` can hold (2**32 chunks)."""
    return (MAX_CHUNK_INDEX + 1) * chunk_size


def check_length(value: object, field: str = "length", max_value: int | None = MAX_U64) -> int:
    """A length, offset or id: an int >= 0 (bool is not one) and at most ``max_value`` (what a
    uint64 field holds; None: no bound here); else EINVAL."""
    if type(value) is not int or value < 0:
        raise FsInvalidArgument(f"{field} {_short(value)} must be an integer >= 0", field=field,
                                value=_short(value), limit=0)
    if max_value is not None and value > max_value:
        raise FsInvalidArgument(f"{field} {_short(value)} is larger than {max_value}", field=field,
                                value=_short(value), limit=max_value)
    return value


def check_file_size(value: object, chunk_size: int | None, field: str = "length") -> int:
    """A file length for a file of ``chunk_size`` chunks (None: the largest chunk size):
    EINVAL if not an int >= 0, EFBIG past :func:`max_file_size`."""
    length = check_length(value, field, None)
    limit = max_file_size(chunk_size if chunk_size else MAX_CHUNK_SIZE)
    if length > limit:
        raise FsInvalidArgument(
            f"{field} {_short(length)} is larger than a file with {chunk_size or MAX_CHUNK_SIZE}-byte chunks can hold "
            f"({limit} bytes = 2**32 chunks); use a smaller length",
            errno=E.EFBIG, field=field, value=_field(length), limit=limit)
    return length


def check_time(value: object, field: str) -> float:
    """A file time in float seconds since the epoch: finite and in [MIN_TIME, MAX_TIME]; else EINVAL."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FsInvalidArgument(f"{field} {_short(value)} must be a number of seconds since the epoch",
                                field=field, value=_short(value))
    try:
        t = float(value)
    except OverflowError:  # an int past float's range
        t = math.inf
    if not math.isfinite(t) or not MIN_TIME <= t <= MAX_TIME:
        raise FsInvalidArgument(
            f"{field} {_short(value)} is outside the times a file may carry: finite seconds since the epoch "
            f"in [{MIN_TIME:.0f}, {MAX_TIME:.0f}] (years 1 to 9999)",
            field=field, value=_short(value), limit=f"[{MIN_TIME:.0f}, {MAX_TIME:.0f}]")
    return t


def check_open_flags(value: object, field: str = "flags") -> int:
    """Open/create flags: an int with only known bits and a valid access mode; else EINVAL."""
    if type(value) is not int:
        raise FsInvalidArgument(f"{field} {_short(value)} must be an int of os.O_* bits", field=field,
                                value=_short(value))
    if value < 0:
        raise FsInvalidArgument(f"{field} {_short(value)} is negative; give os.O_* bits (known: "
                                f"{KNOWN_OPEN_FLAGS:#x})", field=field, value=_field(value),
                                limit=f"{KNOWN_OPEN_FLAGS:#x}")
    unknown = value & ~KNOWN_OPEN_FLAGS
    if unknown:
        raise FsInvalidArgument(f"{field} {_hex(value)} has bits meta does not know ({_hex(unknown)}); known: "
                                f"{KNOWN_OPEN_FLAGS:#x} (os.O_* flags)", field=field, value=_field(value),
                                limit=f"{KNOWN_OPEN_FLAGS:#x}")
    if value & os.O_ACCMODE not in _ACCESS_MODES:
        raise FsInvalidArgument(f"{field} {_hex(value)} has access mode {value & os.O_ACCMODE}; give O_RDONLY, "
                                "O_WRONLY or O_RDWR", field=field, value=value, limit="O_ACCMODE in (0, 1, 2)")
    return value


def check_path_bytes(path: str, field: str = "path") -> int:
    """The UTF-8 size of ``path`` if at most MAX_PATH; else ENAMETOOLONG (EINVAL if not UTF-8)."""
    try:
        n = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        raise FsInvalidArgument(f"{field} is not valid UTF-8", field=field, path=path[:256]) from None
    if n > MAX_PATH:
        raise FsInvalidArgument(f"{field} is {n} bytes; the limit is {MAX_PATH} (PATH_MAX)",
                                errno=E.ENAMETOOLONG, field=field, value=n, limit=MAX_PATH, path=path[:256])
    return n


def path_depth(path: str) -> int:
    """Components of ``path`` as the store counts them (empty and ``.`` dropped)."""
    return sum(1 for c in path.split("/") if c and c != ".")


def check_depth(comps: list[str] | int, path: str, field: str = "path") -> None:
    """A path that makes a name has at most MAX_DEPTH components; else ENAMETOOLONG."""
    depth = comps if isinstance(comps, int) else len(comps)
    if depth > MAX_DEPTH:
        raise FsInvalidArgument(
            f"{field} is {depth} levels deep; a new name may be at most {MAX_DEPTH} levels deep",
            errno=E.ENAMETOOLONG, field=field, value=depth, limit=MAX_DEPTH, path=path[:256])
