"""The data types of the 3FS metadata service: inodes, entries, layouts, callers.

All are frozen msgspec Structs: the store encodes them as msgpack in the KV and the
service maps them to protobuf at its edge.  Times are float seconds since the epoch;
``mode`` holds only the permission bits (``0o7777``), the type is ``Inode.type``.
"""

from __future__ import annotations

import enum
import errno as _errno
from typing import Any, Protocol

import msgspec

from fireflyer.core.errors import FsError, InvalidArgument, NotFound

__all__ = [
    "FileType",
    "Layout",
    "LayoutPolicy",
    "Inode",
    "DirEntry",
    "ReaddirPage",
    "OpenResult",
    "StatFs",
    "Caller",
    "GcItem",
    "TruncateItem",
    "ChainTableSource",
    "StaticChainTables",
    "FsInvalidArgument",
    "MIN_CHUNK_SIZE",
    "MAX_CHUNK_SIZE",
    "ROOT_ID",
]

MIN_CHUNK_SIZE = 4 << 10
MAX_CHUNK_SIZE = 64 << 20
#: the root directory's inode id (allocated ids start far above it, see ``alloc``)
ROOT_ID = 1


class FsInvalidArgument(FsError, InvalidArgument):
    """Bad input to a file-system call (a relative path, a name over 255 bytes, a bad
    chunk size ...): an ``FsError`` with errno EINVAL or ENAMETOOLONG *and* an
    ``InvalidArgument``, so it maps to gRPC INVALID_ARGUMENT whatever the errno.
    Raised before anything is written."""

    def __init__(self, message: str = "", *, errno: int = _errno.EINVAL, **fields: Any) -> None:
        super().__init__(message, errno=errno, **fields)
        self.code = "INVALID_ARGUMENT"  # type: ignore[misc]


class FileType(enum.Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def check_chunk_stripe(chunk_size: int, stripe_size: int, table_len: int | None = None) -> None:
    """Raise ``FsInvalidArgument`` unless the chunk size is a power of two in
    [4 KiB, 64 MiB] and 1 <= stripe (<= the table's chain count, when known)."""
    if (
        type(chunk_size) is not int
        or not _is_pow2(chunk_size)
        or not (MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE)
    ):
        raise FsInvalidArgument(
            f"chunk size {chunk_size!r} must be a power of two in [{MIN_CHUNK_SIZE}, {MAX_CHUNK_SIZE}]",
            chunk_size=str(chunk_size),
        )
    if type(stripe_size) is not int or stripe_size < 1:
        raise FsInvalidArgument(f"stripe size {stripe_size!r} must be >= 1", stripe_size=str(stripe_size))
    if table_len is not None and stripe_size > table_len:
        raise FsInvalidArgument(
            f"stripe size {stripe_size} exceeds the {table_len} chains of the chain table",
            stripe_size=stripe_size,
            chains=table_len,
        )


class Layout(msgspec.Struct, frozen=True):
    """Where a file's chunks live: chunk ``i`` is on chain ``chains[i % stripe_size]``."""

    chain_table_id: int
    chain_table_version: int
    chunk_size: int
    stripe_size: int
    chains: tuple[int, ...]

    def validate(self) -> None:
        check_chunk_stripe(self.chunk_size, self.stripe_size)
        if len(self.chains) != self.stripe_size:
            raise FsInvalidArgument(
                f"layout has {len(self.chains)} chains for stripe size {self.stripe_size}",
                stripe_size=self.stripe_size,
            )

    def chain_of(self, chunk_index: int) -> int:
        return self.chains[chunk_index % self.stripe_size]


class LayoutPolicy(msgspec.Struct, frozen=True):
    """A directory's default layout for new files; new subdirectories inherit it."""

    chain_table_id: int
    chunk_size: int
    stripe_size: int

    def validate(self, table_len: int | None = None) -> None:
        if type(self.chain_table_id) is not int or self.chain_table_id < 0:
            raise FsInvalidArgument(f"bad chain table id {self.chain_table_id!r}")
        check_chunk_stripe(self.chunk_size, self.stripe_size, table_len)


class Inode(msgspec.Struct, frozen=True):
    """One file, directory or symlink.  ``parent``/``name`` are kept for directories
    only (they make rename's loop check and ``..`` possible); ``length`` and ``layout``
    for files; ``target`` for symlinks; ``dir_policy`` for directories."""

    id: int
    type: FileType
    mode: int
    uid: int
    gid: int
    nlink: int
    length: int
    atime: float
    mtime: float
    ctime: float
    layout: Layout | None = None
    parent: int = 0
    name: str = ""
    target: str = ""
    dir_policy: LayoutPolicy | None = None

    @property
    def is_dir(self) -> bool:
        return self.type is FileType.DIR


class DirEntry(msgspec.Struct, frozen=True):
    name: str
    inode_id: int
    type: FileType


class ReaddirPage(msgspec.Struct, frozen=True):
    """One page of a directory, in name (byte) order; pass ``next_after`` as ``after``."""

    entries: tuple[DirEntry, ...]
    more: bool
    next_after: str


class OpenResult(msgspec.Struct, frozen=True):
    inode: Inode
    created: bool
    #: the file's chunk capability from the meta service (``fireflyer.storage.capability``,
    #: encoded; empty from the library store and for directories)
    capability: bytes = b""


class StatFs(msgspec.Struct, frozen=True):
    """Counts from one scan of the inode table (O(inodes): an admin/diagnostic call)."""

    inodes: int
    files: int
    dirs: int
    symlinks: int
    used_bytes: int
    gc_pending: int


class Caller(msgspec.Struct, frozen=True):
    """Who asks; the service derives it from the auth token.  ``admin`` (or uid 0)
    bypasses every permission check."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    admin: bool = False
    user: str = ""

    @property
    def is_super(self) -> bool:
        return self.admin or self.uid == 0


class GcItem(msgspec.Struct, frozen=True):
    """A removed file whose chunks the storage side must delete (all chunks of
    ``layout`` for ``inode_id``; ``length`` bounds the chunk indexes that can exist,
    but chunks past it may exist if a length report was lost, so delete by range)."""

    inode_id: int
    layout: Layout | None
    length: int
    removed_at: float


class TruncateItem(msgspec.Struct, frozen=True):
    """A file shrunk to ``length`` (O_TRUNC or truncate): the storage side must drop
    the bytes past ``length`` (whole chunks after it, the tail of the chunk holding it)
    before acknowledging with ``truncate_done``."""

    inode_id: int
    layout: Layout | None
    length: int
    at: float


class ChainTableSource(Protocol):
    """Where chain tables come from (the service wires mgmtd's routing cache)."""

    def get_table(self, table_id: int) -> tuple[int, tuple[int, ...]]:
        """``(version, chain ids)`` of the table; raises ``NotFound``."""
        ...


class StaticChainTables:
    """Fixed chain tables for tests: ``StaticChainTables({1: (1, (1, 2, 3, 4))})``."""

    def __init__(self, tables: dict[int, tuple[int, tuple[int, ...]]]) -> None:
        self._tables = {k: (int(v), tuple(c)) for k, (v, c) in tables.items()}

    def get_table(self, table_id: int) -> tuple[int, tuple[int, ...]]:
        try:
            return self._tables[table_id]
        except KeyError:
            raise NotFound(f"chain table {table_id} does not exist", table=table_id) from None
