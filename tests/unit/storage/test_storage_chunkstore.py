"""The chunk store: round trips, versions, crash safety (injected at hook points), fsync
policy, range removal, last-chunk queries and CRC verification of chunk files."""

from __future__ import annotations

import os
import random
import sqlite3
import threading
from pathlib import Path

import pytest
from storage_harness import SimulatedCrash

from fireflyer.core.errors import InvalidArgument, NotFound
from fireflyer.storage import (
    ChecksumMismatch,
    ChunkCorrupted,
    ChunkId,
    ChunkNotFound,
    ChunkState,
    ChunkStore,
    NotCommitted,
    StaleUpdate,
    VersionGap,
    crc32c,
    file_range,
)

CS = 4096
A = ChunkId(5, 0, 0)


def put(store: ChunkStore, cid: ChunkId, offset: int, data: bytes, *, chain_ver: int = 1) -> int:
    m = store.meta(cid)
    u = (m.committed_ver if m else 0) + 1
    store.prepare_write(
        cid, offset, data, update_ver=u, chain_ver=chain_ver, chunk_size=CS, payload_crc=crc32c(data)
    )
    store.commit(cid, u, chain_ver)
    return u


def files(store: ChunkStore) -> list[str]:
    return sorted(p.name for p in (store.path / "chunks").rglob("*") if p.is_file())


def flip_bit(store: ChunkStore, cid: ChunkId, byte: int = 3) -> None:
    [name] = [f for f in files(store) if cid.hex in f]
    path = next((store.path / "chunks").rglob(name))
    raw = bytearray(path.read_bytes())
    raw[byte] ^= 0x10
    path.write_bytes(raw)


@pytest.mark.parametrize("seed", range(4))
def test_random_writes_round_trip(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    model = bytearray()
    with ChunkStore(tmp_path, fsync=False, verify_reads=seed % 2 == 1) as store:
        for v in range(1, 30):
            off = rng.randrange(CS)
            n = rng.randrange(0, CS - off + 1)
            data = rng.randbytes(n)
            assert put(store, A, off, data) == v
            if off + n > len(model):
                model.extend(b"\0" * (off + n - len(model)))
            model[off : off + n] = data
            m = store.meta(A)
            assert (
                m is not None and m.committed_ver == v and m.length == len(model) and m.crc == crc32c(model)
            )
            for _ in range(5):
                o = rng.randrange(CS + 10)
                ln = rng.choice([-1, 0, 1, rng.randrange(CS)])
                want = model[o:] if ln < 0 else model[o : o + ln]
                assert store.read(A, o, ln) == want
        assert len(files(store)) == 1  # old versions are unlinked after each commit


def test_pending_version_rules(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path, fsync=False)
    put(store, A, 0, b"one")
    pw = store.prepare_write(
        A, 0, b"TWO!", update_ver=2, chain_ver=3, chunk_size=CS, payload_crc=crc32c(b"TWO!")
    )
    assert (pw.update_ver, pw.length, pw.crc) == (2, 4, crc32c(b"TWO!"))
    m = store.meta(A)
    assert (
        m is not None
        and m.state is ChunkState.CLEAN
        and (m.committed_ver, m.pending_ver) == (1, 2)
        and m.pending
    )
    with pytest.raises(NotCommitted) as ei:
        store.read(A)
    assert ei.value.fields["committed"] == 1 and ei.value.fields["pending"] == 2
    assert store.read(A, allow_uncommitted=True) == b"TWO!"
    assert store.read_committed(A) == (b"one", m)  # what resync sends while a write is pending
    # a retried forward of the same version replaces the pending one
    store.prepare_write(A, 0, b"2nd", update_ver=2, chain_ver=3, chunk_size=CS, payload_crc=crc32c(b"2nd"))
    assert store.read(A, allow_uncommitted=True) == b"2nd"
    with pytest.raises(StaleUpdate):
        store.prepare_write(A, 0, b"x", update_ver=1, chain_ver=3, chunk_size=CS, payload_crc=crc32c(b"x"))
    with pytest.raises(VersionGap):
        store.prepare_write(A, 0, b"x", update_ver=3, chain_ver=3, chunk_size=CS, payload_crc=crc32c(b"x"))
    with pytest.raises(StaleUpdate):
        store.commit(A, 3, 3)
    m = store.commit(A, 2, 3)
    assert m.state is ChunkState.COMMIT and m.committed_ver == 2 and m.chain_ver == 3
    assert store.commit(A, 2, 3) == m  # idempotent
    assert store.read(A) == b"2nd"
    # abort drops a pending version; on a never-committed chunk it drops the chunk
    store.prepare_write(A, 0, b"zz", update_ver=3, chain_ver=3, chunk_size=CS, payload_crc=crc32c(b"zz"))
    assert store.abort_pending(A) and store.read(A) == b"2nd" and not store.abort_pending(A)
    b = ChunkId(5, 0, 1)
    store.prepare_write(b, 0, b"new", update_ver=1, chain_ver=3, chunk_size=CS, payload_crc=crc32c(b"new"))
    with pytest.raises(NotCommitted):
        store.read(b)
    assert store.reset_uncommitted() == 1 and store.meta(b) is None
    assert len(files(store)) == 1
    store.close()


def test_bad_requests_and_payload_checksum(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path, fsync=False)
    put(store, A, 0, b"keep")
    for off, data in [(CS, b"x"), (CS - 1, b"xy"), (-1, b"x")]:
        with pytest.raises(InvalidArgument):
            store.prepare_write(
                A, off, data, update_ver=2, chain_ver=1, chunk_size=CS, payload_crc=crc32c(data)
            )
    with pytest.raises(InvalidArgument):
        store.read(A, 0, -2)
    with pytest.raises(ChecksumMismatch) as ei:
        store.prepare_write(
            A, 0, b"data", update_ver=2, chain_ver=1, chunk_size=CS, payload_crc=crc32c(b"dada")
        )
    assert ei.value.fields["what"] == "payload" and ei.value.code == "DATA_LOSS"
    assert store.meta(A).committed_ver == 1 and not store.meta(A).pending  # type: ignore[union-attr]
    with pytest.raises(ChunkNotFound) as nf:
        store.read(ChunkId(9, 0, 0))
    assert isinstance(nf.value, NotFound)
    store.close()


def test_metadata_survives_reopen(tmp_path: Path) -> None:
    with ChunkStore(tmp_path) as store:
        put(store, A, 0, b"committed", chain_ver=4)
        store.prepare_write(
            A, 0, b"pending", update_ver=2, chain_ver=4, chunk_size=CS, payload_crc=crc32c(b"pending")
        )
        before = store.meta(A)
    with ChunkStore(tmp_path) as store:
        assert store.meta(A) == before and store.swept == 0
        assert store.read(A, allow_uncommitted=True) == b"pendinged"  # a positional write keeps the tail
        store.commit(A, 2, 5)
        assert store.read(A) == b"pendinged"


@pytest.mark.parametrize("point", ["data_written", "pending_recorded", "commit_recorded"])
def test_crash_at_each_step_keeps_committed_version(tmp_path: Path, point: str) -> None:
    """A crash anywhere in prepare/commit never damages the committed version (module doc)."""
    armed = False

    def hook(p: str, cid: ChunkId) -> None:
        if armed and p == point:
            raise SimulatedCrash(p)

    store = ChunkStore(tmp_path, hook=hook)
    put(store, A, 0, b"v1" * 100)
    armed = True
    with pytest.raises(SimulatedCrash):
        store.prepare_write(
            A, 10, b"NEW", update_ver=2, chain_ver=1, chunk_size=CS, payload_crc=crc32c(b"NEW")
        )
        store.commit(A, 2, 1)
    store.close()  # the "crashed" process's memory is gone; only the directory remains

    again = ChunkStore(tmp_path, verify_reads=True)
    m = again.meta(A)
    assert m is not None
    new = bytearray(b"v1" * 100)
    new[10:13] = b"NEW"
    if point == "data_written":  # the new file is an orphan: swept, v1 stays
        assert again.swept == 1 and (m.committed_ver, m.state) == (1, ChunkState.COMMIT)
        assert again.read(A) == b"v1" * 100
    elif point == "pending_recorded":  # durable pending: v1 readable only with a relaxed read of v2
        assert again.swept == 0 and (m.committed_ver, m.pending_ver, m.state) == (1, 2, ChunkState.CLEAN)
        assert again.read_committed(A)[0] == b"v1" * 100  # type: ignore[index]
        assert again.read(A, allow_uncommitted=True) == new
        again.commit(A, 2, 1)
        assert again.read(A) == new
    else:  # committed; the old file lingered and is swept
        assert again.swept == 1 and m.committed_ver == 2 and again.read(A) == new
    again.verify(A)
    assert len(files(again)) == 1
    again.close()


@pytest.mark.parametrize("durable", [True, False])
def test_fsync_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool) -> None:
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    with ChunkStore(tmp_path, fsync=durable) as store:
        put(store, A, 0, b"data")
        sync = store._db.execute("PRAGMA synchronous").fetchone()[0]
    assert len(calls) == (2 if durable else 0)  # the new version file and its directory
    assert sync == (2 if durable else 1)  # FULL / NORMAL
    assert ChunkStore(tmp_path).fsync is True  # durable by default


def test_remove_range_and_query_last_chunk(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path, fsync=False)
    for inode in (7, 8):
        for idx in (0, 1, 2, 10):
            put(store, ChunkId(inode, 0, idx), 0, b"x" * (idx + 1))
    put(store, ChunkId(8, 1, 0), 0, b"other track")
    store.prepare_write(
        ChunkId(8, 0, 50), 0, b"uncommitted", update_ver=1, chain_ver=1, chunk_size=CS,
        payload_crc=crc32c(b"uncommitted"),
    )  # fmt: skip
    assert store.query_last_chunk(7) == (ChunkId(7, 0, 10), 11)
    assert store.query_last_chunk(8, track=0) == (
        ChunkId(8, 0, 10),
        11,
    )  # the pending chunk 50 does not count
    assert store.query_last_chunk(8) == (ChunkId(8, 1, 0), 11)
    assert store.query_last_chunk(9) is None
    # truncate inode 7 to two chunks, then delete inode 8 entirely
    assert store.remove_range(*file_range(7, track=0, start_index=2)) == 2
    assert store.query_last_chunk(7) == (ChunkId(7, 0, 1), 2)
    assert store.remove_range(*file_range(8), batch=2) == 6
    assert [m.chunk_id for m in store.all_meta()] == [ChunkId(7, 0, 0), ChunkId(7, 0, 1)]
    assert store.remove(ChunkId(7, 0, 0)) and not store.remove(ChunkId(7, 0, 0))
    assert len(files(store)) == 1
    store.close()
    assert len(ChunkStore(tmp_path).all_meta().__next__().chunk_id.hex) == 32


def test_flipped_bit_is_detected(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path, fsync=False, target_id=3)
    put(store, A, 0, bytes(range(256)))
    flip_bit(store, A)
    assert store.read(A, 0, 4) != bytes(range(4))  # verification off (3FS default): not noticed
    checked = ChunkStore(tmp_path, fsync=False, verify_reads=True, target_id=3)
    with pytest.raises(ChunkCorrupted) as ei:
        checked.read(A, 100, 10)
    assert (
        ei.value.fields["chunk"] == A.hex and ei.value.fields["target"] == 3 and ei.value.code == "DATA_LOSS"
    )
    with pytest.raises(ChunkCorrupted):
        store.verify(A)
    # writes check the base version, so corruption is never laundered into a new CRC
    with pytest.raises(ChunkCorrupted):
        store.prepare_write(A, 0, b"x", update_ver=2, chain_ver=1, chunk_size=CS, payload_crc=crc32c(b"x"))
    with pytest.raises(ChunkCorrupted):
        store.read_committed(A)
    # a full replace (resync) repairs it
    store.replace_full(A, b"fresh", version=2, chain_ver=1)
    assert checked.meta(A) is not None
    assert store.verify(A).committed_ver == 2 and store.read(A) == b"fresh"


def test_reads_race_commits_without_errors(tmp_path: Path) -> None:
    """Commits unlink old files; a reader that saw the old metadata still reads it whole."""
    store = ChunkStore(tmp_path, fsync=False, verify_reads=True)
    put(store, A, 0, b"0" * CS)
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                data = store.read(A)
                assert len(data) == CS and len(set(data)) == 1
            except NotCommitted:
                pass
            except BaseException as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)
                return

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(1, 150):
        put(store, A, 0, bytes([48 + i % 10]) * CS)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []


def test_sqlite_file_is_wal(tmp_path: Path) -> None:
    ChunkStore(tmp_path).close()
    assert sqlite3.connect(tmp_path / "meta.sqlite").execute("PRAGMA journal_mode").fetchone()[0] == "wal"
