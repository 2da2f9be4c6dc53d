"""Reads prepared for sending: whole versions from the file under their recorded CRC, partial
ranges from memory under a computed one, bad file sizes caught before anything is sent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fireflyer.storage import ChunkCorrupted, ChunkId, ChunkStore, NotCommitted, crc32c
from fireflyer.storage.chunkread import read_for_send

CS = 1 << 20
A = ChunkId(9, 0, 0)


def put(store: ChunkStore, cid: ChunkId, data: bytes, *, commit: bool = True) -> None:
    m = store.meta(cid)
    u = (m.committed_ver if m else 0) + 1
    store.prepare_write(cid, 0, data, update_ver=u, chain_ver=1, chunk_size=CS, payload_crc=crc32c(data))
    if commit:
        store.commit(cid, u, 1)


def version_file(store: ChunkStore, cid: ChunkId) -> Path:
    [path] = [p for p in (store.path / "chunks").rglob("*") if p.is_file() and cid.hex in p.name]
    return path


@pytest.mark.parametrize("n", [1, 4095, 64 * 1024 - 1, 64 * 1024, 300_001])
def test_whole_reads_carry_the_recorded_crc_and_partial_ones_a_computed_one(tmp_path: Path, n: int) -> None:
    data = os.urandom(n)
    with ChunkStore(tmp_path, fsync=False) as store:
        put(store, A, data)
        for offset, length in [(0, -1), (0, n), (0, CS)]:  # whole (asking for more is still whole)
            r = read_for_send(store, A, offset, length)
            try:
                assert r.whole and r.length == n and r.crc == store.meta(A).crc == crc32c(data)
                assert r.from_file == (n >= 64 * 1024)
                assert r.read() == data
            finally:
                r.close()
        for offset, length in [(1, -1), (n // 2, n // 3 + 1), (n - 1, 5), (0, n - 1), (n, 10)]:
            r = read_for_send(store, A, offset, length)
            want = data[offset:] if length < 0 else data[offset:offset + length]
            whole = offset == 0 and len(want) == n  # e.g. (n - 1, 5) of a 1-byte chunk
            assert r.whole == whole and r.read() == want and r.crc == crc32c(want)
            assert not r.from_file or (whole and n >= 64 * 1024)
            r.close()


def test_an_open_version_survives_the_next_commit(tmp_path: Path) -> None:
    old, new = os.urandom(200_000), os.urandom(200_000)
    with ChunkStore(tmp_path, fsync=False) as store:
        put(store, A, old)
        r = read_for_send(store, A)
        put(store, A, new)  # unlinks the old file; the open one still reads the old version
        try:
            assert r.read() == old and r.crc == crc32c(old)
        finally:
            r.close()


def test_a_bit_flip_passes_here_and_fails_the_recorded_crc(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    with ChunkStore(tmp_path, fsync=False) as store:
        put(store, A, data)
        path = version_file(store, A)
        raw = bytearray(path.read_bytes())
        raw[777] ^= 1
        path.write_bytes(raw)
        r = read_for_send(store, A)  # no hashing here: the reader checks
        try:
            assert crc32c(r.read()) != r.crc
        finally:
            r.close()
        with pytest.raises(ChunkCorrupted):  # what a report makes the node do
            store.verify(A)


@pytest.mark.parametrize("change", ["truncate", "extend", "remove"])
def test_a_version_file_of_the_wrong_size_is_corrupted(tmp_path: Path, change: str) -> None:
    with ChunkStore(tmp_path, fsync=False) as store:
        put(store, A, os.urandom(100_000))
        path = version_file(store, A)
        if change == "remove":
            path.unlink()
        else:
            with open(path, "r+b") as f:
                f.truncate(99_999 if change == "truncate" else 100_001)
        for offset, length in [(0, -1), (10, 20)]:
            with pytest.raises(ChunkCorrupted):
                read_for_send(store, A, offset, length)


def test_pending_versions_follow_the_relaxed_rule(tmp_path: Path) -> None:
    old, new = os.urandom(70_000), os.urandom(80_000)
    with ChunkStore(tmp_path, fsync=False) as store:
        put(store, A, old)
        put(store, A, new, commit=False)
        with pytest.raises(NotCommitted):
            read_for_send(store, A)
        r = read_for_send(store, A, allow_uncommitted=True)
        try:
            assert r.uncommitted and r.read() == new and r.crc == crc32c(new)
        finally:
            r.close()


def test_verify_reads_checks_every_read(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    with ChunkStore(tmp_path, fsync=False, verify_reads=True) as store:
        put(store, A, data)
        r = read_for_send(store, A, 5, 100)
        assert r.read() == data[5:105] and r.crc == crc32c(data[5:105])
        path = version_file(store, A)
        raw = bytearray(path.read_bytes())
        raw[50_000] ^= 1
        path.write_bytes(raw)
        with pytest.raises(ChunkCorrupted):
            read_for_send(store, A, 5, 100)
