"""A local-directory stand-in for the 3FS client's batch calls (tests, and users without 3FS)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import msgspec

from fireflyer.core.errors import FsError

__all__ = ["LocalFS", "LocalResult"]


class LocalResult(msgspec.Struct):
    data: Any = b""
    written: int = 0
    error: Exception | None = None


class LocalFS:
    """``batch_write``/``batch_read`` on files under ``root`` (created on write); reads return
    writable ``bytearray`` so tensors are built without a copy."""

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
        out = []
        for path, offset, length in ios:
            try:
                with open(self._path(path), "rb", buffering=0) as f:
                    f.seek(offset)
                    buf = bytearray(length)
                    n = f.readinto(buf) or 0
                    del buf[n:]
                out.append(LocalResult(data=buf))
            except OSError as e:
                out.append(LocalResult(error=FsError(f"read {path}: {e.strerror}", errno=e.errno or 5, path=path)))
        return out
