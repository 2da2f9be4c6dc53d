"""Reads of a chunk version prepared for sending: from the page cache to the socket, CRC-checked end to end.

A storage node answering a read used to copy the chunk file into memory, compute the CRC32C of
those bytes and copy them again into the socket.  For a read of a *whole* version (offset 0, to
its end: every chunk-sized piece of a sequential file read) none of that work is needed:

- the bytes go with ``os.sendfile`` from the open version file (no copy into user memory), and
- the CRC that travels with them is the one recorded when the version was written.  The client
  checks the bytes it received against it, so a bit flipped on disk (or in flight) is caught by
  the reader, which reads another replica and tells this node (``stor.report_corrupt``); the
  node then verifies the chunk itself before it takes action (see ``services/storage``).

A *partial* read still reads its range (``pread``) and computes that range's CRC: no recorded
CRC covers it.  Small whole reads are read into memory too (a held open file per 4 KiB read
would cost more than the copy, and descriptors are finite) but still skip the CRC.

Either way the file's size is checked against the recorded length first (one ``fstat``): a
truncated or extended version file is reported as :class:`ChunkCorrupted` right here.
"""

from __future__ import annotations

import os
from typing import BinaryIO

from fireflyer.wire import FileRegion

from .checksum import crc32c
from .chunkid import ChunkId
from .chunkstore import ChunkStore

__all__ = ["ChunkRead", "read_for_send", "SENDFILE_MIN"]

#: whole-version reads at least this long are sent from the file; shorter ones from memory
SENDFILE_MIN = 64 * 1024


class ChunkRead:
    """The bytes of one read, as memory (``data``) or an open file region (``file``); close it."""

    __slots__ = ("version", "uncommitted", "length", "crc", "whole", "data", "_file", "_offset")

    def __init__(self, *, version: int, uncommitted: bool, length: int, crc: int, whole: bool,
                 data: bytes = b"", file: BinaryIO | None = None, offset: int = 0) -> None:
        self.version, self.uncommitted, self.length, self.crc, self.whole = version, uncommitted, length, crc, whole
        self.data = data
        self._file, self._offset = file, offset

    @property
    def from_file(self) -> bool:
        return self._file is not None

    def part(self) -> memoryview | FileRegion:
        """What the wire layer sends for it."""
        if self._file is not None:
            return FileRegion(self._file.fileno(), self._offset, self.length)
        return memoryview(self.data)

    def read(self) -> bytes:
        """The bytes in memory (for callers that need them there)."""
        if self._file is None:
            return self.data
        return os.pread(self._file.fileno(), self.length, self._offset)

    def close(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            f.close()


def read_for_send(store: ChunkStore, chunk_id: ChunkId, offset: int = 0, length: int = -1, *,
                  allow_uncommitted: bool = False, sendfile_min: int = SENDFILE_MIN) -> ChunkRead:
    """Prepare bytes ``[offset, offset+length)`` of the version a read sees (``length`` -1: to
    its end; short at the end), with the CRC32C the reader must check them against."""
    if store.verify_reads:
        # the store re-checks the whole version on every read: use its verified bytes
        data, ver, pending = store.read_versioned(chunk_id, offset, length, allow_uncommitted=allow_uncommitted)
        return ChunkRead(version=ver, uncommitted=pending, length=len(data), crc=crc32c(data), whole=False, data=data)
    f, ver, size, crc, pending = store.open_version(chunk_id, allow_uncommitted=allow_uncommitted)
    keep = False
    try:
        on_disk = os.fstat(f.fileno()).st_size
        if on_disk != size:
            raise store.corrupted(chunk_id, ver, crc, 0, on_disk, size)
        n = max(0, size - offset) if length < 0 else max(0, min(length, size - offset))
        if offset == 0 and n == size:
            if n >= sendfile_min:
                keep = True
                return ChunkRead(version=ver, uncommitted=pending, length=n, crc=crc, whole=True, file=f)
            data = os.pread(f.fileno(), n, 0)
            # a whole version's recorded CRC covers exactly these bytes: no CRC to compute here
            return ChunkRead(version=ver, uncommitted=pending, length=len(data), crc=crc, whole=True, data=data)
        data = os.pread(f.fileno(), n, offset) if n else b""
        return ChunkRead(version=ver, uncommitted=pending, length=len(data), crc=crc32c(data), whole=False,
                         data=data)
    finally:
        if not keep:
            f.close()
