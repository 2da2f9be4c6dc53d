"""Write/read round trips through the client across chunk and stripe boundaries."""

from __future__ import annotations

import os
import random

from fsc_common import CHUNK

from fireflyer.fs import FileSystem


def test_roundtrip_across_chunks_and_stripes(ffs: FileSystem, workdir: str) -> None:
    path = f"{workdir}/a"
    data = os.urandom(5 * CHUNK + 123)  # 6 chunks over 2 chains
    with ffs.open(path, "wb") as f:
        f.write(data)
    assert ffs.stat(path).length == len(data)
    with ffs.open(path, "rb") as f:
        assert f.read() == data
    inode = ffs.stat(path)
    assert inode.layout is not None and inode.layout.stripe_size == 2 and inode.layout.chunk_size == CHUNK
    assert len(set(inode.layout.chains)) == 2
    # unaligned ranges straddling chunk (and so chain) boundaries
    with ffs.open(path, "rb", buffering=0) as f:
        for off, n in [(CHUNK - 1, 2), (CHUNK - 10, 2 * CHUNK + 20), (0, len(data)), (len(data) - 5, 100)]:
            assert f.pread(n, off) == data[off:off + n]


def test_pread_pwrite_random_offsets_and_holes(ffs: FileSystem, workdir: str) -> None:
    rng = random.Random(7)
    path = f"{workdir}/p"
    model = bytearray()
    with ffs.open(path, "w+b", buffering=0) as f:
        for _ in range(25):
            off = rng.randrange(0, 6 * CHUNK)
            blob = rng.randbytes(rng.randrange(1, 2 * CHUNK))
            assert f.pwrite(blob, off) == len(blob)
            if len(model) < off + len(blob):
                model.extend(bytes(off + len(blob) - len(model)))
            model[off:off + len(blob)] = blob
            o2 = rng.randrange(0, len(model))
            assert f.pread(3000, o2) == bytes(model[o2:o2 + 3000])
    assert ffs.read_bytes(path) == bytes(model)
    # a hole: write far past the end, the gap reads as zeros
    with ffs.open(path, "r+b", buffering=0) as f:
        f.pwrite(b"z", 10 * CHUNK)
    got = ffs.read_bytes(path)
    assert len(got) == 10 * CHUNK + 1 and got[len(model):10 * CHUNK] == bytes(10 * CHUNK - len(model))


def test_text_and_append_modes(ffs: FileSystem, workdir: str) -> None:
    path = f"{workdir}/t.txt"
    with ffs.open(path, "w") as f:
        f.write("héllo\nworld\n")
    with ffs.open(path, "a") as f:
        f.write("more\n")
    with ffs.open(path, "r") as f:
        assert f.readlines() == ["héllo\n", "world\n", "more\n"]
    with ffs.open(path, "ab") as f:
        f.write(b"x" * (CHUNK + 5))
    assert ffs.read_bytes(path) == "héllo\nworld\nmore\n".encode() + b"x" * (CHUNK + 5)
    # "wb" on an existing file truncates it first: no old bytes survive past the new end
    with ffs.open(path, "wb") as f:
        f.write(b"ab")
    assert ffs.read_bytes(path) == b"ab"
    with ffs.open(path, "r+b") as f:
        f.seek(CHUNK * 2)
        f.write(b"!")
    assert ffs.read_bytes(path) == b"ab" + bytes(CHUNK * 2 - 2) + b"!"
