"""batch_read_into (chunk boundaries, odd lengths, holes, EOF, errors), batch_write from
memoryviews, adjacent pieces of one chunk joined, whole large chunks written in one request."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from fsc_common import CHUNK

from fireflyer.core.errors import FsError, InvalidArgument
from fireflyer.fs import FileSystem
from fireflyer.meta import LayoutPolicy


def test_batch_read_into_fills_callers_buffers_across_chunks_holes_and_eof(ffs: FileSystem, workdir: str) -> None:
    path = f"{workdir}/into"
    ffs.open(path, "wb").close()
    head = os.urandom(2 * CHUNK + 333)  # ends inside the third chunk
    tail = os.urandom(4097)
    hole_at = 5 * CHUNK + 11  # chunks 3 and 4 are never written: a hole
    assert all(r.ok for r in ffs.batch_write([(path, 0, memoryview(head)), (path, hole_at, tail)]))
    model = bytearray(hole_at + len(tail))
    model[:len(head)] = head
    model[hole_at:] = tail
    ios = [(0, len(model)), (CHUNK - 7, 19), (3, CHUNK * 3 + 1), (hole_at - 5, 100),  # crosses EOF
           (len(model) + 10, 50), (17, 0)]  # past EOF, empty
    bufs = [np.full(n, 0xAB, dtype=np.uint8) for _, n in ios]
    res = ffs.batch_read_into([(path, off, b) for (off, _), b in zip(ios, bufs, strict=True)])
    for (off, n), b, r in zip(ios, bufs, res, strict=True):
        assert r.ok, r.error
        want = bytes(model[off:off + n])
        assert r.written == len(want)
        assert b[:r.written].tobytes() == want
        assert (b[r.written:] == 0xAB).all()  # past EOF: the buffer is left as it was
    # the same bytes as batch_read
    assert ffs.batch_read([(path, 3, CHUNK * 3 + 1)])[0].data == bytes(model[3:3 + CHUNK * 3 + 1])


def test_batch_read_into_reports_per_io_errors_and_refuses_bad_buffers(ffs: FileSystem, workdir: str) -> None:
    path = f"{workdir}/into-err"
    ffs.write_bytes(path, b"abcdef")
    buf = bytearray(4)
    res = ffs.batch_read_into([(f"{workdir}/nope", 0, bytearray(3)), (workdir, 0, bytearray(3)), (path, 1, buf)])
    assert isinstance(res[0].error, FsError) and res[0].error.errno == errno.ENOENT
    assert isinstance(res[1].error, FsError) and res[1].error.errno == errno.EISDIR
    assert res[2].ok and res[2].written == 4 and buf == b"bcde"
    with pytest.raises(InvalidArgument, match="read-only"):
        ffs.batch_read_into([(path, 0, b"xyz")])
    with pytest.raises(InvalidArgument):
        ffs.batch_read_into([(path, -1, bytearray(2))])


def test_batch_write_memoryviews_and_adjacent_pieces_of_one_chunk(ffs: FileSystem, workdir: str) -> None:
    path = f"{workdir}/views"
    ffs.open(path, "wb").close()
    src = np.frombuffer(os.urandom(3 * CHUNK), dtype=np.uint8).copy()
    view = memoryview(src)
    # adjacent I/Os sharing chunks (joined into one piece per chunk), a non-adjacent one in the
    # same chunk, and overlapping I/Os, which must apply in order
    ios = [(path, 0, view[:1000]), (path, 1000, view[1000:CHUNK + 5]), (path, CHUNK + 5, view[CHUNK + 5:3 * CHUNK]),
           (path, 3 * CHUNK + 100, b"gap"), (path, 10, b"first"), (path, 12, b"SECOND")]
    res = ffs.batch_write(ios)
    assert all(r.ok for r in res) and [r.written for r in res] == [1000, CHUNK + 5 - 1000, 2 * CHUNK - 5, 3, 5, 6]
    model = bytearray(src.tobytes()) + bytes(103)
    model[3 * CHUNK + 100:] = b"gap"
    model[10:15] = b"first"
    model[12:18] = b"SECOND"
    assert ffs.read_bytes(path) == bytes(model)


def test_large_chunks_are_written_whole(ffs: FileSystem, workdir: str) -> None:
    """Chunks larger than a storage batch (4 MiB) go as one write each, from the caller's views."""
    d = f"{workdir}/big"
    ffs.mkdir(d)
    ffs.write_bytes(f"{d}/probe", b"")
    lay = ffs.stat(f"{d}/probe").layout  # the default layout: its chain table and stripe
    assert lay is not None
    ffs.set_dir_policy(d, LayoutPolicy(lay.chain_table_id, 8 << 20, lay.stripe_size))
    path = f"{d}/f"
    ffs.open(path, "wb").close()
    assert ffs.stat(path).layout.chunk_size == 8 << 20
    data = np.frombuffer(os.urandom((8 << 20) + (5 << 20) + 3), dtype=np.uint8).copy()
    half = 6 << 20  # two I/Os meeting inside the first chunk
    res = ffs.batch_write([(path, 0, memoryview(data)[:half]), (path, half, memoryview(data)[half:])])
    assert all(r.ok for r in res), [r.error for r in res]
    out = np.empty(data.nbytes, dtype=np.uint8)
    [r] = ffs.batch_read_into([(path, 0, out)])
    assert r.ok and r.written == data.nbytes and (out == data).all()
    with ffs.open(path, "r+b", buffering=0) as f:  # File.write over the same path
        f.pwrite(b"Z" * 10, (8 << 20) - 5)
    data[(8 << 20) - 5:(8 << 20) + 5] = ord("Z")
    assert ffs.read_bytes(path) == data.tobytes()
