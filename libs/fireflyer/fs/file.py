"""An open 3FS file: positional and streaming I/O, as an ``io.RawIOBase``.

    with fs.open("/data/x", "r+b", buffering=0) as f:   # File itself
        f.pwrite(b"abc", 1 << 20)
        assert f.pread(3, 1 << 20) == b"abc"

``fs.open`` wraps it in ``io.BufferedReader``/``BufferedWriter``/``BufferedRandom``
(and ``io.TextIOWrapper`` for text modes), so it works wherever Python expects a
file.  Data goes straight between this process and the storage nodes (meta is off
the data path): the handle keeps the inode id and layout from ``open``.

**Length.**  ``size()`` is the larger of the inode length (re-read from meta when a
read reaches past what this handle knows, so growth by other writers shows up) and
this handle's highest written end.  Writes extend the file at once for this
handle; others see it after the next periodic report (``report_interval_s``), on
``flush_length()``/``fsync()`` or on ``close()``, which sets the exact length (see
:mod:`.length`).  Reads past the end return short; holes read as zeros.

**Readahead.**  A read-only handle read sequentially (``pread`` at the offset where the last
read ended, ``read``/``readinto`` loops) keeps the next reads in flight (:mod:`.readahead`,
``fs.readahead_bytes``); ``readinto`` receives straight into the caller's buffer otherwise.

**Truncate** goes through meta by *path* (meta has no truncate-by-inode), so a
handle whose file was renamed since open truncates whatever is at the old path now.
Appending handles (``"ab"``) write every ``write()`` at the current size.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from fireflyer.core.errors import FsError, InvalidArgument
from fireflyer.meta import Inode, Layout
from fireflyer.meta.limits import check_file_size

from .length import LengthReporter
from .readahead import Readahead

__all__ = ["File", "FileOwner"]

Buffer = bytes | bytearray | memoryview


class _FileSettings(Protocol):
    @property
    def max_io_bytes(self) -> int: ...

    @property
    def readahead_bytes(self) -> int: ...

    @property
    def exact_length_on_close(self) -> bool: ...


class _Submit(Protocol):
    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]: ...


class FileOwner(Protocol):
    """What a :class:`File` needs of the :class:`~fireflyer.fs.client.FileSystem` that opened it
    (the file system is above its files: it opens them, they call back through this)."""

    settings: _FileSettings
    lengths: LengthReporter
    _pool: _Submit

    def _stat_inode(self, inode_id: int) -> Inode: ...

    def _truncate_path(self, path: str, length: int) -> Inode: ...

    def _read_range(self, inode_id: int, layout: Layout, offset: int, length: int, path: str) -> bytes: ...

    def _read_range_into(self, inode_id: int, layout: Layout, offset: int, dest: memoryview, path: str) -> None: ...

    def _write_range(self, inode_id: int, layout: Layout, offset: int, data: memoryview, path: str) -> None: ...

    def _report_length(self, inode_id: int, length: int) -> Inode: ...

    def _exact_length(self, layout: Layout, inode_id: int) -> int | None: ...


def check_range(offset: object, length: object, *, what: str, limit: int) -> None:
    """Refuse bad offsets/lengths before anything is sent (nothing written on bad input)."""
    if type(offset) is not int or offset < 0:
        raise InvalidArgument(f"{what}: offset must be an int >= 0, got {offset!r}", offset=str(offset))
    if type(length) is not int or length < 0:
        raise InvalidArgument(f"{what}: length must be an int >= 0, got {length!r}", length=str(length))
    if length > limit:
        raise InvalidArgument(f"{what}: {length} bytes in one call exceeds fs.max_io_bytes={limit}; split it",
                              length=length, limit=limit)


class File(io.RawIOBase):
    """One open file (see the module doc).  Thread safe for pread/pwrite."""

    def __init__(self, fs: FileOwner, path: str, inode: Inode, *, readable: bool, writable: bool,
                 append: bool = False, mode: str = "rb") -> None:
        super().__init__()
        assert inode.layout is not None
        self._fs = fs
        self.name = path
        self.mode = mode
        self.inode_id = inode.id
        self.layout: Layout = inode.layout
        self._readable, self._writable, self._append = readable, writable, append
        self._pos = 0
        self._meta_len = inode.length  # the inode length as last seen
        self._hi = 0  # highest end written through this handle
        self._reported = inode.length  # what meta has adopted from us (or had)
        self._len_lock = threading.Lock()  # orders length reports against truncates
        if writable:
            fs.lengths.register(self)
        window = fs.settings.readahead_bytes
        self._ra = (Readahead(self._fetch, fs._pool.submit, window=window)
                    if readable and not writable and window > 0 else None)

    # -- io.RawIOBase ---------------------------------------------------------------------
    def readable(self) -> bool:
        return self._readable

    def writable(self) -> bool:
        return self._writable

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a 3FS file has no OS file descriptor")

    def _need(self, read: bool) -> None:
        if self.closed:
            raise ValueError(f"I/O operation on closed file {self.name}")
        if read and not self._readable:
            raise io.UnsupportedOperation(f"{self.name} is not open for reading (mode {self.mode!r})")
        if not read and not self._writable:
            raise io.UnsupportedOperation(f"{self.name} is not open for writing (mode {self.mode!r})")

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self.closed:
            raise ValueError(f"I/O operation on closed file {self.name}")
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: None}.get(whence, -1)
        if base == -1:
            raise InvalidArgument(f"bad whence {whence}", whence=whence)
        pos = (self.size() if base is None else base) + offset
        if pos < 0:
            raise InvalidArgument(f"seek to negative position {pos} in {self.name}", offset=offset)
        self._pos = pos
        return pos

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        n = self._clamp(len(view), self._pos)
        got = self._ra.read(self._pos, n, self.size(), into=view) if self._ra is not None and n else None
        if got is None and n:
            self._fs._read_range_into(self.inode_id, self.layout, self._pos, view[:n], self.name)
        self._pos += n
        return n

    def readall(self) -> bytes:
        data = self.pread(max(0, self.size() - self._pos), self._pos)
        self._pos += len(data)
        return data

    def write(self, b: Any) -> int:
        data = memoryview(b).cast("B")
        if self._append:
            self._pos = self.size()
        n = self.pwrite(data, self._pos)
        self._pos += n
        return n

    def truncate(self, size: int | None = None) -> int:
        self._need(read=False)
        size = self._pos if size is None else size
        with self._len_lock:
            inode = self._fs._truncate_path(self.name, size)
            self._meta_len = inode.length
            self._hi = min(self._hi, size)
            self._reported = inode.length
        return size

    def flush(self) -> None:
        """Nothing is buffered here (buffering is the io wrapper's); lengths report on their own."""

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._ra is not None:
                self._ra.close()
            if self._writable:
                self.fsync()
        finally:
            if self._writable:
                self._fs.lengths.unregister(self)
            super().close()

    # -- positional I/O -------------------------------------------------------------------
    def size(self, refresh: bool = False) -> int:
        if refresh:
            self._meta_len = self._fs._stat_inode(self.inode_id).length
        return max(self._meta_len, self._hi)

    def _clamp(self, length: int, offset: int) -> int:
        """Check a read and cut it at the file's size: the bytes it will return."""
        self._need(read=True)
        check_range(offset, length, what=f"read {self.name}", limit=self._fs.settings.max_io_bytes)
        end = offset + length
        if end > self.size():
            self.size(refresh=True)  # another writer may have grown it
        return max(0, min(end, self.size()) - offset)

    def _fetch(self, offset: int, dest: memoryview) -> None:
        self._fs._read_range_into(self.inode_id, self.layout, offset, dest, self.name)

    def pread(self, length: int, offset: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (short at the end of the file; holes are zeros)."""
        n = self._clamp(length, offset)
        if n == 0:
            return b""
        got = self._ra.read(offset, n, self.size()) if self._ra is not None else None
        if isinstance(got, bytes):
            return got
        return self._fs._read_range(self.inode_id, self.layout, offset, n, self.name)

    def pwrite(self, data: Buffer, offset: int) -> int:
        """Write all of ``data`` at ``offset``; returns ``len(data)`` (retried writes apply once)."""
        self._need(read=False)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidArgument(f"write {self.name}: data must be bytes-like, got {type(data).__name__}")
        view = memoryview(data).cast("B")
        check_range(offset, len(view), what=f"write {self.name}", limit=self._fs.settings.max_io_bytes)
        if len(view) == 0:
            return 0
        # EFBIG past what the layout holds (2**32 chunks), before a chunk id could not be formed
        check_file_size(offset + len(view), self.layout.chunk_size if self.layout else None,
                        field=f"write {self.name}: offset + length")
        self._fs._write_range(self.inode_id, self.layout, offset, view, self.name)
        with self._len_lock:
            self._hi = max(self._hi, offset + len(view))
        return len(view)

    # -- length -----------------------------------------------------------------------------
    @property
    def written_end(self) -> int:
        return self._hi

    @property
    def needs_report(self) -> bool:
        return self._hi > self._reported

    def report_length(self) -> None:
        """Tell meta the highest written end (adopted if larger); the periodic reporter calls this."""
        with self._len_lock:
            hi = self._hi
            if hi <= self._reported:
                return
            inode = self._fs._report_length(self.inode_id, hi)
            self._meta_len = inode.length
            self._reported = max(self._reported, hi)

    def fsync(self) -> int:
        """Report the length and make it exact (see :mod:`.length`); returns the file's length."""
        if self.closed:
            raise ValueError(f"I/O operation on closed file {self.name}")
        self.report_length()
        if self._fs.settings.exact_length_on_close:
            with self._len_lock:
                exact = self._fs._exact_length(self.layout, self.inode_id)
                if exact is not None and exact > self._meta_len:
                    try:
                        self._meta_len = self._fs._report_length(self.inode_id, exact).length
                    except FsError:
                        pass  # removed meanwhile: nothing to fix
        return self.size()

    def __repr__(self) -> str:
        return f"<fireflyer.fs.File {self.name!r} inode={self.inode_id} mode={self.mode!r}>"
