"""A local-directory stand-in for the 3FS client's batch calls (tests, and users without 3FS)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from fireflyer.core.errors import FsError

__all__ = ["LocalFS", "LocalResult"]


class LocalResult(msgspec.Struct):
    data: Any = b""
    written: int = 0
    error: Exception | None = None


class LocalFS:
    """``batch_write``/``batch_read`` on files under ``root`` (created on write); reads return
    writable buffers (memoryviews of numpy arrays) so tensors are built without a copy, and
    ``batch_read_into`` reads into buffers the caller allocated."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)

    def _path(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def batch_write(self, ios: Sequence[tuple[str, int, Any]]) -> list[LocalResult]:
        out = []
        for path, offset, data in ios:
            p = self._path(path)
            try:
                os.makedirs(os.path.dirname(p), exist_ok=True)
                fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    n = os.pwrite(fd, data, offset)
                finally:
                    os.close(fd)
                out.append(LocalResult(written=n))
            except OSError as e:
                out.append(LocalResult(error=FsError(f"write {path}: {e.strerror}", errno=e.errno or 5, path=path)))
        return out

    def batch_read(self, ios: Sequence[tuple[str, int, int]]) -> list[LocalResult]:
        # np.empty, not bytearray: no zero-filling pass over memory the read overwrites anyway
        bufs = [memoryview(np.empty(length, dtype=np.uint8)) for _, _, length in ios]
        results = self.batch_read_into([(p, o, b) for (p, o, _), b in zip(ios, bufs, strict=True)])
        for r, b in zip(results, bufs, strict=True):
            if r.error is None:
                r.data = b[:r.written]
        return results

    def batch_read_into(self, ios: Sequence[tuple[str, int, Any]]) -> list[LocalResult]:
        """Read ``(path, offset, buffer)`` into the given writable buffers (short at EOF:
        ``written`` says how many bytes arrived)."""
        out = []
        for path, offset, dest in ios:
            view = memoryview(dest).cast("B")
            try:
                fd = os.open(self._path(path), os.O_RDONLY)
                try:
                    got = 0
                    while got < view.nbytes:
                        n = os.preadv(fd, [view[got:]], offset + got)
                        if n <= 0:
                            break
                        got += n
                finally:
                    os.close(fd)
                out.append(LocalResult(written=got))
            except OSError as e:
                out.append(LocalResult(error=FsError(f"read {path}: {e.strerror}", errno=e.errno or 5, path=path)))
        return out

    # -- the file calls the checkpoint catalog and manager use (as fireflyer.fs.FileSystem) --------
    def _fs_error(self, op: str, path: str, e: OSError) -> FsError:
        return FsError(f"{op} {path}: {e.strerror}", errno=e.errno or 5, path=path)

    def mkdir(self, path: str, mode: int = 0o755, *, parents: bool = False, exist_ok: bool = False) -> None:
        try:
            if parents:
                os.makedirs(self._path(path), mode, exist_ok=exist_ok)
            else:
                os.mkdir(self._path(path), mode)
        except FileExistsError as e:
            if not exist_ok:
                raise self._fs_error("mkdir", path, e) from None
        except OSError as e:
            raise self._fs_error("mkdir", path, e) from None

    def write_bytes(self, path: str, data: Any, *, mode: int = 0o644) -> int:
        """Replace the file's content with ``data`` (written to a temporary name, then renamed,
        so a reader sees the old file or the new one); the file gets ``mode`` (less the umask)."""
        p = self._path(path)
        tmp = f"{p}.tmp{os.getpid()}"
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
                n = f.write(data)
            os.replace(tmp, p)
            return n
        except OSError as e:
            raise self._fs_error("write", path, e) from None

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        try:
            with open(self._path(path), "rb") as f:
                f.seek(offset)
                return f.read() if length is None else f.read(length)
        except OSError as e:
            raise self._fs_error("read", path, e) from None

    def exists(self, path: str) -> bool:
        return os.path.exists(self._path(path))

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self._path(path)))
        except OSError as e:
            raise self._fs_error("listdir", path, e) from None

    def rmtree(self, path: str) -> None:
        import shutil

        p = self._path(path)
        if not os.path.lexists(p):
            raise FsError(f"rmtree {path}: no such file or directory", errno=2, path=path)
        try:
            shutil.rmtree(p)
        except OSError as e:
            raise self._fs_error("rmtree", path, e) from None
