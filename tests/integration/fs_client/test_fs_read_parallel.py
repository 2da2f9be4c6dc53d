"""Reads with many requests in flight (readahead, batch_read) return exactly the written bytes."""

from __future__ import annotations

import os

from fsc_common import CHUNK

from fireflyer.fs import FileSystem


def _file(ffs: FileSystem, path: str, n: int) -> bytes:
    data = os.urandom(n)
    with ffs.open(path, "wb", buffering=0) as f:
        f.pwrite(data, 0)
    return data


def test_sequential_reads_with_readahead_match_the_file(ffs: FileSystem, workdir: str) -> None:
    data = _file(ffs, f"{workdir}/seq", 9 * CHUNK + 12345)  # odd length, many chunks and both stripes
    for step in (CHUNK, 3 * CHUNK + 17, 1000):
        with ffs.open(f"{workdir}/seq", "rb", buffering=0) as f:
            got, off = bytearray(), 0
            while chunk := f.pread(step, off):
                got += chunk
                off += len(chunk)
            assert bytes(got) == data
            assert f._ra is not None and f._ra.hits > 0  # the reads really came from readahead
    with ffs.open(f"{workdir}/seq", "rb") as f:  # io.BufferedReader -> readinto, also with a seek
        assert f.read(5) == data[:5]
        f.seek(4 * CHUNK + 3)
        assert f.read() == data[4 * CHUNK + 3:]
    with ffs.open(f"{workdir}/seq", "rb", buffering=0) as f:
        buf = bytearray(2 * CHUNK)
        parts = []
        while n := f.readinto(buf):
            parts.append(bytes(buf[:n]))
        assert b"".join(parts) == data
    # a handle open for writing never reads ahead (its own writes would make segments stale)
    with ffs.open(f"{workdir}/seq", "r+b", buffering=0) as f:
        assert f._ra is None
        f.pwrite(b"xyz", CHUNK)
        assert f.pread(10, CHUNK - 2) == data[CHUNK - 2:CHUNK] + b"xyz" + data[CHUNK + 3:CHUNK + 8]


def test_readahead_sees_growth_and_short_tail(ffs: FileSystem, workdir: str) -> None:
    path = f"{workdir}/grow"
    data = _file(ffs, path, 2 * CHUNK + 10)
    with ffs.open(path, "rb", buffering=0) as r:
        assert r.pread(CHUNK, 0) == data[:CHUNK]
        assert r.pread(CHUNK, CHUNK) == data[CHUNK:2 * CHUNK]
        more = os.urandom(CHUNK)
        with ffs.open(path, "r+b", buffering=0) as w:
            w.pwrite(more, 2 * CHUNK + 10)
        # the prefetched 10-byte tail segment is not used for a longer read: the growth shows up
        assert r.pread(CHUNK, 2 * CHUNK) == (data[2 * CHUNK:] + more)[:CHUNK]


def test_batch_read_many_large_ios_spanning_chunks(ffs: FileSystem, workdir: str) -> None:
    a = _file(ffs, f"{workdir}/a", 17 * CHUNK + 333)
    b = _file(ffs, f"{workdir}/b", 5 * CHUNK - 1)
    ios = [(f"{workdir}/a", off, 3 * CHUNK + 7) for off in range(0, len(a), CHUNK // 2 + 11)]
    ios += [(f"{workdir}/b", 1, len(b)), (f"{workdir}/b", CHUNK - 5, 10), (f"{workdir}/b", len(b) + 3, 100)]
    ios += [(f"{workdir}/a", 0, len(a))]
    res = ffs.batch_read(ios)
    files = {f"{workdir}/a": a, f"{workdir}/b": b}
    for (p, off, n), r in zip(ios, res, strict=True):
        assert r.ok, r.error
        assert r.data == files[p][off:off + n]  # short at EOF, empty past it
        assert isinstance(r.data, bytearray)
    # the buffers are the caller's: writable and resizable, no copy needed to build on them
    big = res[-1].data
    memoryview(big)[0] = (big[0] + 1) % 256
    big.extend(b"!")
    assert len(big) == len(a) + 1


def test_holes_read_as_zeros_into_buffers(ffs: FileSystem, workdir: str) -> None:
    path = f"{workdir}/holes"
    with ffs.open(path, "wb", buffering=0) as f:
        f.pwrite(b"end", 6 * CHUNK)  # chunks 0..5 were never written
    want = bytes(6 * CHUNK) + b"end"
    assert ffs.read_bytes(path) == want
    assert ffs.batch_read([(path, CHUNK - 3, 2 * CHUNK)])[0].data == want[CHUNK - 3:3 * CHUNK - 3]
    with ffs.open(path, "rb", buffering=0) as f:
        buf = bytearray(b"\xff" * (6 * CHUNK + 3))
        assert f.readinto(buf) == len(want) and buf[:len(want)] == want
