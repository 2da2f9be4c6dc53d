"""The data client refuses lengths and offsets past what a file's layout holds (EFBIG) before
a chunk id that cannot exist is formed; nothing is written (issue 48 point 6)."""

from __future__ import annotations

import errno as E

import pytest

from fireflyer.core.errors import FsError, InvalidArgument
from fireflyer.fs import FileSystem
from fireflyer.meta import limits


def test_truncate_and_write_past_the_layout_are_efbig(ffs: FileSystem, workdir: str) -> None:
    path = f"{workdir}/big"
    assert ffs.write_bytes(path, b"abc") == 3
    layout = ffs.stat(path).layout
    assert layout is not None
    most = limits.max_file_size(layout.chunk_size)
    for length in (2**62, 2**64 - 1, 2**70, most + 1):
        with pytest.raises(FsError) as info:
            ffs.truncate(path, length)
        assert info.value.errno == E.EFBIG and isinstance(info.value, InvalidArgument), length
    with pytest.raises(FsError) as info:
        ffs.truncate(path, -1)
    assert info.value.errno == E.EINVAL
    with ffs.open(path, "r+b", buffering=0) as f:
        with pytest.raises(FsError) as info:
            f.pwrite(b"x", most)
        assert info.value.errno == E.EFBIG and "offset + length" in info.value.message
    assert ffs.stat(path).length == 3 and ffs.read_bytes(path) == b"abc"
