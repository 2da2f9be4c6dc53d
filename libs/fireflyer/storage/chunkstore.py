"""One storage target's chunks: data in files, metadata in SQLite, versions copy-on-write.

What 3FS keeps per chunk (research/3fs.md §3 "Per-chunk metadata") is here a
:class:`ChunkMeta`: committed version ``v``, update (pending) version ``u``, state
COMMIT | DIRTY | CLEAN, length and CRC32C of the committed content, the chain version of
the last commit, and length/CRC of the pending content.

Layout of a target directory::

    <target>/meta.sqlite            chunk metadata, WAL journal, one row per chunk
    <target>/chunks/<xx>/<id>.<ver>.<nonce>   one immutable file per chunk version

**Crash safety.**  A version's file is written once under a fresh name and never
modified; metadata names the files.  A write goes:

1. build the new content in memory from the committed file (whose CRC is checked first,
   so a corrupted base is never laundered into a new version with a fresh CRC);
2. write it to a new file, ``fsync`` it and its directory (``fsync=True``);
3. one SQLite transaction records it as the pending version (state CLEAN);
4. commit = one transaction moving pending -> committed; only then the old file is unlinked.

A crash before (3) leaves an unreferenced file, removed by the sweep in ``open``; a crash
after (3) leaves a durable pending version (what CRAQ needs: the predecessor re-forwards
and it commits); after (4) the old file at worst lingers until the next sweep.  The
committed version is never overwritten before its successor's metadata commits.  3FS
records DIRTY on disk to find half-written in-place data; with copy-on-write files a
half-written version is just an unreferenced file, so DIRTY exists only in memory while
a prepare is in flight (``meta()`` shows it).

``fsync=False`` drops steps (2)'s fsyncs and runs SQLite with ``synchronous=NORMAL``: a
killed process loses nothing (the kernel has the pages), a power cut may lose recent
versions.  Durable is the default.

All metadata is also cached in memory (one dict, loaded at open), so reads never touch
SQLite.  Per-chunk re-entrant locks (:meth:`ChunkStore.lock`) serialize updates of one
chunk; the CRAQ replica holds the same lock across forwarding, and resync takes it per
chunk, which is how resync runs while writes continue.
"""

from __future__ import annotations

import contextlib
import enum
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import msgspec

from fireflyer.core.log import get_logger

from .checksum import crc32c, verify_payload
from .chunkid import ChunkId, file_range
from .errors import BadRequest, ChunkCorrupted, ChunkNotFound, NotCommitted, StaleUpdate, VersionGap

__all__ = ["ChunkState", "ChunkMeta", "PendingWrite", "ChunkStore", "Hook"]

log = get_logger(__name__)

#: ``hook(point, chunk_id)``; points: ``data_written``, ``pending_recorded``, ``commit_recorded``,
#: ``aborted``, ``removed``.  Tests raise from it to simulate a crash or record the order.
Hook = Callable[[str, ChunkId], None]


class ChunkState(enum.StrEnum):
    COMMIT = "commit"  # no pending version
    DIRTY = "dirty"  # a pending version is being written (in memory only, see module doc)
    CLEAN = "clean"  # a pending version is durable, waiting for its commit


class ChunkMeta(msgspec.Struct, frozen=True, kw_only=True):
    """The metadata of one chunk on one target (3FS ``ChunkMetadata``)."""

    chunk_id: ChunkId
    committed_ver: int  # 0: never committed
    pending_ver: int  # == committed_ver when nothing is pending
    state: ChunkState
    length: int  # of the committed content
    crc: int  # CRC32C of the committed content
    chain_ver: int  # chain version of the last commit
    pending_length: int = 0
    pending_crc: int = 0

    @property
    def pending(self) -> bool:
        return self.state is not ChunkState.COMMIT

    @property
    def update_ver(self) -> int:
        """3FS's ``updateVer``: the newest version this target holds, pending or not."""
        return self.pending_ver if self.pending else self.committed_ver


class PendingWrite(msgspec.Struct, frozen=True):
    """What preparing a version produced: the version, and length/CRC of the whole chunk."""

    chunk_id: ChunkId
    update_ver: int
    length: int
    crc: int


class _Row(msgspec.Struct):
    meta: ChunkMeta
    file: str | None  # committed version's file name
    pending_file: str | None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    id BLOB PRIMARY KEY,
    committed_ver INTEGER NOT NULL, pending_ver INTEGER NOT NULL, state TEXT NOT NULL,
    length INTEGER NOT NULL, crc INTEGER NOT NULL, chain_ver INTEGER NOT NULL,
    pending_length INTEGER NOT NULL, pending_crc INTEGER NOT NULL,
    file TEXT, pending_file TEXT
) WITHOUT ROWID
"""
_COLS = "id, committed_ver, pending_ver, state, length, crc, chain_ver, pending_length, pending_crc, file, pending_file"


class _ChunkLocks:
    """Re-entrant lock per chunk id, created on demand and dropped when unused."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[ChunkId, list] = {}  # id -> [RLock, users]

    @contextlib.contextmanager
    def hold(self, chunk_id: ChunkId) -> Iterator[None]:
        with self._mutex:
            entry = self._locks.setdefault(chunk_id, [threading.RLock(), 0])
            entry[1] += 1
        lock: threading.RLock = entry[0]
        lock.acquire()
        try:
            yield
        finally:
            lock.release()
            with self._mutex:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[chunk_id]


class ChunkStore:
    """The chunks of one storage target; thread safe.

    ``verify_reads``: recompute the CRC of every chunk read (3FS default: off; writes always
    check the base version).  ``hook``: fault/observation points for tests.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: bool = True,
        verify_reads: bool = False,
        target_id: int = 0,
        hook: Hook | None = None,
    ) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.verify_reads = verify_reads
        self.target_id = target_id
        self._hook = hook
        self._locks = _ChunkLocks()
        self._mutex = threading.Lock()  # guards _rows/_in_flight and file opens vs unlinks
        self._db_lock = threading.Lock()
        self._rows: dict[ChunkId, _Row] = {}
        self._in_flight: dict[ChunkId, int] = {}
        (self.path / "chunks").mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path / "meta.sqlite", isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        self._db.execute(_SCHEMA)
        for r in self._db.execute(f"SELECT {_COLS} FROM chunks"):
            cid = ChunkId.from_bytes(r[0])
            meta = ChunkMeta(
                chunk_id=cid, committed_ver=r[1], pending_ver=r[2], state=ChunkState(r[3]), length=r[4],
                crc=r[5], chain_ver=r[6], pending_length=r[7], pending_crc=r[8],
            )  # fmt: skip
            self._rows[cid] = _Row(meta, r[9], r[10])
        self.swept = self._sweep()

    # -- housekeeping -------------------------------------------------------------------

    def _sweep(self) -> int:
        """Remove version files no metadata names: leftovers of crashes (module doc)."""
        keep = {f for row in self._rows.values() for f in (row.file, row.pending_file) if f}
        removed = 0
        for sub in (self.path / "chunks").iterdir():
            for entry in os.scandir(sub):
                if entry.name not in keep:
                    os.unlink(entry.path)
                    removed += 1
        if removed:
            log.info("chunkstore.swept", target=self.target_id, files=removed)
        return removed

    def close(self) -> None:
        with self._db_lock:
            self._db.close()

    def __enter__(self) -> ChunkStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lock(self, chunk_id: ChunkId) -> contextlib.AbstractContextManager[None]:
        """The per-chunk lock (re-entrant); CRAQ and resync hold it across a whole update."""
        return self._locks.hold(chunk_id)

    def _fire(self, point: str, chunk_id: ChunkId) -> None:
        if self._hook is not None:
            self._hook(point, chunk_id)

    def _file_path(self, name: str) -> Path:
        return self.path / "chunks" / name[:2] / name

    def _new_file(self, chunk_id: ChunkId, version: int, data: bytes | bytearray | memoryview) -> str:
        # the first two hex digits of a hash spread files over 256 directories
        name = f"{crc32c(chunk_id.to_bytes()) & 0xFF:02x}{chunk_id.hex}.{version}.{uuid.uuid4().hex[:12]}"
        path = self._file_path(name)
        path.parent.mkdir(exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if self.fsync:
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return name

    def _unlink(self, name: str | None) -> None:
        if name:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._file_path(name))

    def _save(self, row: _Row) -> None:
        m = row.meta
        with self._db_lock:
            self._db.execute(
                f"INSERT OR REPLACE INTO chunks ({_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (m.chunk_id.to_bytes(), m.committed_ver, m.pending_ver, m.state.value, m.length, m.crc,
                 m.chain_ver, m.pending_length, m.pending_crc, row.file, row.pending_file),
            )  # fmt: skip

    def _delete(self, ids: list[ChunkId]) -> None:
        with self._db_lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("DELETE FROM chunks WHERE id = ?", [(c.to_bytes(),) for c in ids])
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read_file(self, chunk_id: ChunkId, name: str, version: int, length: int, crc: int) -> bytes:
        """The whole content of a version file, checked against its CRC."""
        try:
            with open(self._file_path(name), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        got = crc32c(data)
        if len(data) != length or got != crc:
            raise self._corrupted(chunk_id, version, crc, got, len(data), length)
        return data

    def _corrupted(
        self, chunk_id: ChunkId, version: int, crc: int, got: int, size: int, length: int
    ) -> ChunkCorrupted:
        return ChunkCorrupted(
            f"chunk {chunk_id} v{version} on target {self.target_id} is corrupted: CRC32C {got:#010x} over "
            f"{size} bytes, recorded {crc:#010x} over {length}; take the target offline so resync replaces it",
            chunk=chunk_id.hex, target=self.target_id, version=version, expected=crc, got=got,
        )  # fmt: skip

    # -- queries ------------------------------------------------------------------------

    def meta(self, chunk_id: ChunkId) -> ChunkMeta | None:
        """The chunk's metadata; state DIRTY while a prepare is in flight."""
        with self._mutex:
            row = self._rows.get(chunk_id)
            flying = self._in_flight.get(chunk_id)
        if flying is None:
            return row.meta if row else None
        if row is None:
            return ChunkMeta(
                chunk_id=chunk_id, committed_ver=0, pending_ver=flying, state=ChunkState.DIRTY,
                length=0, crc=0, chain_ver=0,
            )  # fmt: skip
        return msgspec.structs.replace(row.meta, state=ChunkState.DIRTY, pending_ver=flying)

    def all_meta(self, begin: ChunkId | None = None, end: ChunkId | None = None) -> Iterator[ChunkMeta]:
        """Durable metadata of every chunk in ``[begin, end)``, in chunk id order (resync's dump)."""
        with self._mutex:
            metas = [
                r.meta
                for c, r in self._rows.items()
                if (begin is None or c >= begin) and (end is None or c < end)
            ]
        metas.sort(key=lambda m: m.chunk_id)
        return iter(metas)

    def __len__(self) -> int:
        return len(self._rows)

    def read(
        self, chunk_id: ChunkId, offset: int = 0, length: int = -1, *, allow_uncommitted: bool = False
    ) -> bytes:
        """Bytes ``[offset, offset+length)`` of the committed version (short at the chunk's end).

        ``length=-1`` reads to the end.  A chunk with a pending version raises
        :class:`NotCommitted` unless ``allow_uncommitted`` (3FS relaxed read), which then
        reads the pending version.  With ``verify_reads`` the whole version is checked.
        """
        return self.read_versioned(chunk_id, offset, length, allow_uncommitted=allow_uncommitted)[0]

    def read_versioned(
        self, chunk_id: ChunkId, offset: int = 0, length: int = -1, *, allow_uncommitted: bool = False
    ) -> tuple[bytes, int, bool]:
        """Like :meth:`read`, also returning (version read, whether it is uncommitted)."""
        if offset < 0 or length < -1:
            raise BadRequest(f"bad read range offset={offset} length={length}", offset=offset, length=length)
        f, ver, size, crc, pending = self.open_version(chunk_id, allow_uncommitted=allow_uncommitted)
        with f:
            if self.verify_reads:
                data = f.read()
                got = crc32c(data)
                if got != crc or len(data) != size:
                    raise self._corrupted(chunk_id, ver, crc, got, len(data), size)
                end = size if length < 0 else min(size, offset + length)
                return data[offset:end], ver, pending
            f.seek(offset)
            n = max(0, size - offset) if length < 0 else max(0, min(length, size - offset))
            return f.read(n), ver, pending

    def open_version(self, chunk_id: ChunkId, *, allow_uncommitted: bool = False
                     ) -> tuple[BinaryIO, int, int, int, bool]:
        """Open the file of the version a read sees: (file, version, recorded length, recorded
        CRC32C, whether it is the pending version).  The caller closes the file; version files are
        immutable and an open one stays readable after a commit unlinks it, so the bytes read
        through it later are still exactly that version's."""
        with self._mutex:
            row = self._rows.get(chunk_id)
            if row is None or (row.meta.committed_ver == 0 and not row.meta.pending):
                raise ChunkNotFound(
                    f"chunk {chunk_id} has no committed version on target {self.target_id}",
                    chunk=chunk_id.hex, target=self.target_id,
                )  # fmt: skip
            m = row.meta
            if m.pending and not allow_uncommitted:
                raise NotCommitted(
                    f"chunk {chunk_id} on target {self.target_id} has pending v{m.pending_ver} over committed "
                    f"v{m.committed_ver}; retry after a back-off or read relaxed",
                    chunk=chunk_id.hex, target=self.target_id, committed=m.committed_ver, pending=m.pending_ver,
                )  # fmt: skip
            if m.pending:
                name, ver, size, crc = row.pending_file, m.pending_ver, m.pending_length, m.pending_crc
            else:
                name, ver, size, crc = row.file, m.committed_ver, m.length, m.crc
            assert name is not None
            try:  # opened under the mutex: a commit unlinks the old file only after swapping rows
                f = open(self._file_path(name), "rb")  # noqa: SIM115 - the caller closes it
            except FileNotFoundError:
                raise self._corrupted(chunk_id, ver, crc, 0, 0, size) from None
        return f, ver, size, crc, m.pending

    def corrupted(self, chunk_id: ChunkId, version: int, crc: int, got: int, size: int,
                  length: int) -> ChunkCorrupted:
        """The error for a version whose bytes do not match their record (for readers outside)."""
        return self._corrupted(chunk_id, version, crc, got, size, length)

    def read_committed(self, chunk_id: ChunkId) -> tuple[bytes, ChunkMeta] | None:
        """The whole committed version, CRC-checked, and its metadata (None: nothing committed).

        Works while a version is pending (resync sends what is committed)."""
        with self.lock(chunk_id):
            with self._mutex:
                row = self._rows.get(chunk_id)
            if row is None or row.meta.committed_ver == 0 or row.file is None:
                return None
            m = row.meta
            return self._read_file(chunk_id, row.file, m.committed_ver, m.length, m.crc), m

    def verify(self, chunk_id: ChunkId) -> ChunkMeta:
        """Recompute the CRC of the committed (and pending) version; raise :class:`ChunkCorrupted`."""
        with self._mutex:
            row = self._rows.get(chunk_id)
        if row is None:
            raise ChunkNotFound(f"chunk {chunk_id} is not on target {self.target_id}", chunk=chunk_id.hex)
        m = row.meta
        if row.file:
            self._read_file(chunk_id, row.file, m.committed_ver, m.length, m.crc)
        if m.pending and row.pending_file:
            self._read_file(chunk_id, row.pending_file, m.pending_ver, m.pending_length, m.pending_crc)
        return m

    def query_last_chunk(self, inode: int, track: int | None = None) -> tuple[ChunkId, int] | None:
        """The file's committed chunk with the highest id on this target, and its length.

        meta asks every chain of a file and takes the largest ``index * chunk_size + length``
        for the exact length at close/fsync (research/3fs.md §2 "File length").
        """
        begin, end = file_range(inode, track)
        with self._db_lock:
            r = self._db.execute(
                "SELECT id, length FROM chunks WHERE id >= ? AND id < ? AND committed_ver > 0 ORDER BY id DESC LIMIT 1",
                (begin.to_bytes(), end.to_bytes()),
            ).fetchone()
        return None if r is None else (ChunkId.from_bytes(r[0]), r[1])

    # -- updates ------------------------------------------------------------------------

    def prepare_write(
        self,
        chunk_id: ChunkId,
        offset: int,
        data: bytes | bytearray | memoryview,
        *,
        update_ver: int,
        chain_ver: int,
        chunk_size: int,
        payload_crc: int,
        replace: bool = False,
        force: bool = False,
    ) -> PendingWrite:
        """Write ``data`` at ``offset`` onto a copy of the committed version as pending ``update_ver``.

        Version rule (research/3fs.md §3 step 4): ``update_ver`` must be ``committed + 1``
        (an existing pending version at that number is replaced: a retried forward); at or
        below committed raises :class:`StaleUpdate`, above raises :class:`VersionGap`.
        ``replace``: ``data`` is the whole new content (full-chunk replace), any
        ``update_ver > committed`` is accepted.  ``force`` skips version checks (a syncing
        target takes its predecessor's versions as they are).
        """
        n = len(data)
        if chunk_size <= 0 or offset < 0 or offset + n > chunk_size or (replace and offset):
            raise BadRequest(
                f"write [{offset}, {offset + n}) does not fit chunk {chunk_id} of size {chunk_size}",
                chunk=chunk_id.hex, offset=offset, length=n, chunk_size=chunk_size,
            )  # fmt: skip
        verify_payload(data, payload_crc, chunk=chunk_id.hex, target=self.target_id)
        with self.lock(chunk_id):
            with self._mutex:
                row = self._rows.get(chunk_id)
            committed = row.meta.committed_ver if row else 0
            if not force:
                if update_ver <= committed:
                    raise StaleUpdate(
                        f"update v{update_ver} of chunk {chunk_id} is not newer than committed v{committed}",
                        chunk=chunk_id.hex, target=self.target_id, committed=committed, update=update_ver,
                    )  # fmt: skip
                if not replace and update_ver != committed + 1:
                    raise VersionGap(
                        f"update v{update_ver} of chunk {chunk_id} skips versions after committed v{committed}",
                        chunk=chunk_id.hex, target=self.target_id, committed=committed, update=update_ver,
                    )  # fmt: skip
            if replace or row is None or committed == 0:
                base = b""
            else:
                assert row.file is not None
                base = self._read_file(chunk_id, row.file, committed, row.meta.length, row.meta.crc)
            if offset == 0 and n >= len(base):
                content: bytes | bytearray | memoryview = data
                crc = payload_crc  # verified above: no second pass over a whole chunk
            else:
                buf = bytearray(max(len(base), offset + n))
                buf[: len(base)] = base
                buf[offset : offset + n] = data
                content = buf
                crc = crc32c(content)
            with self._mutex:
                self._in_flight[chunk_id] = update_ver
            name = None
            saved = False
            try:
                name = self._new_file(chunk_id, update_ver, content)
                self._fire("data_written", chunk_id)
                old = row.meta if row else None
                meta = ChunkMeta(
                    chunk_id=chunk_id, committed_ver=committed, pending_ver=update_ver, state=ChunkState.CLEAN,
                    length=old.length if old else 0, crc=old.crc if old else 0,
                    chain_ver=old.chain_ver if old else chain_ver, pending_length=len(content), pending_crc=crc,
                )  # fmt: skip
                new_row = _Row(meta, row.file if row else None, name)
                self._save(new_row)
                saved = True
                with self._mutex:
                    self._rows[chunk_id] = new_row
                self._fire("pending_recorded", chunk_id)
            except Exception:  # a real failure: drop our file (a simulated crash is a BaseException)
                if name is not None and not saved:
                    self._unlink(name)
                raise
            finally:
                with self._mutex:
                    self._in_flight.pop(chunk_id, None)
            if row is not None and row.pending_file != name:
                self._unlink(row.pending_file)
            return PendingWrite(chunk_id, update_ver, len(content), crc)

    def commit(self, chunk_id: ChunkId, update_ver: int, chain_ver: int) -> ChunkMeta:
        """Make pending ``update_ver`` the committed version, recording the chain version.

        Idempotent for an already committed ``update_ver``; anything else raises
        :class:`StaleUpdate` (no such pending version).
        """
        with self.lock(chunk_id):
            with self._mutex:
                row = self._rows.get(chunk_id)
            if row is None:
                raise ChunkNotFound(
                    f"commit of absent chunk {chunk_id}", chunk=chunk_id.hex, target=self.target_id
                )
            m = row.meta
            if not m.pending and m.committed_ver == update_ver:
                return m
            if not m.pending or m.pending_ver != update_ver:
                raise StaleUpdate(
                    f"commit v{update_ver} of chunk {chunk_id}: pending is v{m.pending_ver}, committed v{m.committed_ver}",
                    chunk=chunk_id.hex, target=self.target_id, committed=m.committed_ver, update=update_ver,
                )  # fmt: skip
            meta = ChunkMeta(
                chunk_id=chunk_id, committed_ver=update_ver, pending_ver=update_ver, state=ChunkState.COMMIT,
                length=m.pending_length, crc=m.pending_crc, chain_ver=chain_ver,
            )  # fmt: skip
            new_row = _Row(meta, row.pending_file, None)
            self._save(new_row)
            with self._mutex:
                self._rows[chunk_id] = new_row
            self._fire("commit_recorded", chunk_id)
            if row.file != new_row.file:
                self._unlink(row.file)
            return meta

    def abort_pending(self, chunk_id: ChunkId) -> bool:
        """Drop the pending version (a failed update, or a returning lastsrv's reset)."""
        with self.lock(chunk_id):
            with self._mutex:
                row = self._rows.get(chunk_id)
            if row is None or not row.meta.pending:
                return False
            m = row.meta
            if m.committed_ver == 0:
                self._delete([chunk_id])
                with self._mutex:
                    del self._rows[chunk_id]
            else:
                meta = msgspec.structs.replace(
                    m, pending_ver=m.committed_ver, state=ChunkState.COMMIT, pending_length=0, pending_crc=0
                )
                self._save(_Row(meta, row.file, None))
                with self._mutex:
                    self._rows[chunk_id] = _Row(meta, row.file, None)
            self._fire("aborted", chunk_id)
            self._unlink(row.pending_file)
            return True

    def reset_uncommitted(self) -> int:
        """Abort every pending version (3FS: a returning lastsrv resets uncommitted chunks)."""
        with self._mutex:
            ids = [c for c, r in self._rows.items() if r.meta.pending]
        return sum(self.abort_pending(c) for c in ids)

    def replace_full(
        self, chunk_id: ChunkId, data: bytes | bytearray | memoryview, *, version: int, chain_ver: int
    ) -> ChunkMeta:
        """Install ``data`` as committed ``version`` whatever was there (resync, syncing tail)."""
        with self.lock(chunk_id):
            self.prepare_write(
                chunk_id, 0, data, update_ver=version, chain_ver=chain_ver, chunk_size=max(1, len(data)),
                payload_crc=crc32c(data), replace=True, force=True,
            )  # fmt: skip
            return self.commit(chunk_id, version, chain_ver)

    def remove(self, chunk_id: ChunkId) -> bool:
        """Remove one chunk (resync's remote-only rule)."""
        with self.lock(chunk_id):
            return self._remove_ids([chunk_id]) == 1

    def remove_range(self, begin: ChunkId, end: ChunkId, *, batch: int = 256) -> int:
        """Remove every chunk in ``[begin, end)`` (GC of deleted files, truncation); returns the count."""
        removed = 0
        with self._mutex:
            ids = sorted(c for c in self._rows if begin <= c < end)
        for i in range(0, len(ids), batch):
            part = ids[i : i + batch]
            with contextlib.ExitStack() as stack:
                for c in part:  # ascending order: no lock-order deadlocks between removers
                    stack.enter_context(self.lock(c))
                removed += self._remove_ids(part)
        return removed

    def _remove_ids(self, ids: list[ChunkId]) -> int:
        with self._mutex:
            rows = [(c, self._rows[c]) for c in ids if c in self._rows]
        if not rows:
            return 0
        self._delete([c for c, _ in rows])
        with self._mutex:
            for c, _ in rows:
                self._rows.pop(c, None)
        for c, row in rows:
            self._fire("removed", c)
            self._unlink(row.file)
            self._unlink(row.pending_file)
        return len(rows)
