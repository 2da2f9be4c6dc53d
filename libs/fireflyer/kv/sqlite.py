"""SQLite backend: optimistic, FoundationDB-style conflict checking over a WAL database.

Approach.  Three tables: ``ff_kv(k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID`` (BLOBs
compare with memcmp, so keys are ordered bytewise), ``ff_kv_meta`` (the global commit
``version`` and the ``log_floor``) and ``ff_kv_log(version, t, w)``: one row per commit
holding its write set (set keys and cleared ranges, msgpack).

- A transaction's reads run inside one deferred ``BEGIN``: in WAL mode that is a
  stable snapshot, and the ``version`` read with the first read is its *read version*.
  Reads never block writers and are never blocked.
- Writes are buffered (``api.Txn``).  At commit the snapshot is ended and the writer
  takes ``BEGIN IMMEDIATE`` (SQLite's single write lock, shared by every process that
  opens the file; a per-``KV`` mutex queues this process's threads in front of it).
  Under the lock it reads every log row with ``version > read version`` and fails with
  ``KVConflict(key=...)`` if any of them wrote a key in the transaction's
  conflict-tracked read set.  Otherwise it applies the writes, appends its own log row,
  bumps ``version`` and commits: check and apply are one atomic step, so the result
  is serializable (in commit order), exactly FoundationDB's rule.
- Snapshot reads are not added to the read set; blind writes never conflict;
  read-only transactions commit without taking the lock.

Limits.  One writer at a time per database file (commits are short: the check is
in-memory over the few commits since the read version).  Log rows older than
``max_txn_age_s`` (default 60 s) are pruned every 128 commits; a transaction whose
read version is older than the pruned history fails with ``TransactionTooOld``
(retried by ``KV.run``), the analogue of FoundationDB's 5 s limit.  A long-open
transaction also keeps the WAL from being checkpointed.  ``synchronous=NORMAL``
(default) survives process crashes but may lose the last commits on power loss; pass
``synchronous=FULL`` for durability against that.  Conflict ranges are exact (key
granularity), so there are no false conflicts.  Works across processes: the version,
log and lock all live in the file.  Not for network file systems (SQLite's locking).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import threading
import time
from typing import Any

import msgspec

from .api import KV, Txn
from .errors import KVConflict, KVTimeout, KVUnavailable, TransactionTooOld
from .pool import ConnPool
from .ranges import RangeSet

__all__ = ["SqliteKV"]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS ff_kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS ff_kv_meta (name TEXT PRIMARY KEY, n INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ff_kv_log (version INTEGER PRIMARY KEY, t REAL NOT NULL, w BLOB NOT NULL)",
    "INSERT OR IGNORE INTO ff_kv_meta (name, n) VALUES ('version', 0), ('log_floor', 0)",
)
_GC_EVERY = 128
_GC_BATCH = 4096
_UPSERT = "INSERT INTO ff_kv (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v"


def _first_hit(reads: RangeSet, write_set: bytes) -> bytes | None:
    """A key both in ``reads`` and in one logged commit's write set, or None."""
    points, ranges = msgspec.msgpack.decode(write_set)
    for p in points:
        if reads.contains(p):
            return p
    for i in range(0, len(ranges), 2):
        hit = reads.overlap(ranges[i], ranges[i + 1])
        if hit is not None:
            return hit
    return None


class _SqliteTxn(Txn):
    _kv: SqliteKV

    def __init__(self, kv: SqliteKV, *, deadline: float | None, system: bool = False) -> None:
        super().__init__(kv, deadline=deadline, system=system)
        self._conn: sqlite3.Connection | None = None
        self._rv: int | None = None

    def _snapshot(self) -> sqlite3.Connection:
        if self._rv is None:
            if self._conn is None:
                self._conn = self._kv._acquire()
            try:
                self._conn.execute("BEGIN")
                self._rv = self._conn.execute("SELECT n FROM ff_kv_meta WHERE name = 'version'").fetchone()[0]
            except sqlite3.Error as e:
                raise KVUnavailable(f"sqlite read failed: {e}", path=self._kv.path) from e
        assert self._conn is not None
        return self._conn

    def _db_get(self, key: bytes) -> bytes | None:
        conn = self._snapshot()
        try:
            row = conn.execute("SELECT v FROM ff_kv WHERE k = ?", (key,)).fetchone()
        except sqlite3.Error as e:
            raise KVUnavailable(f"sqlite read failed: {e}", path=self._kv.path) from e
        return None if row is None else row[0]

    def _db_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[tuple[bytes, bytes]]:
        conn = self._snapshot()
        order = "DESC" if reverse else "ASC"
        try:
            return conn.execute(
                f"SELECT k, v FROM ff_kv WHERE k >= ? AND k < ? ORDER BY k {order} LIMIT ?",
                (begin, end, limit or -1),
            ).fetchall()
        except sqlite3.Error as e:
            raise KVUnavailable(f"sqlite read failed: {e}", path=self._kv.path) from e

    def _on_read_conflict(self, begin: bytes, end: bytes, explicit: bool) -> None:
        self._snapshot()  # fixes the read version the conflict check starts from

    def _commit_backend(self, delay_s: float) -> None:
        kv = self._kv
        conn = self._conn
        try:
            if conn is not None and conn.in_transaction:
                conn.execute("COMMIT")  # ends the read snapshot; nothing was written in it
            if self.read_only:
                return
            if conn is None:
                conn = self._conn = kv._acquire()
            wait = kv.busy_timeout_s
            if self._deadline is not None:
                wait = min(wait, max(self._deadline - kv.clock.monotonic(), 0.0))
            if not kv._commit_lock.acquire(timeout=wait):
                raise KVTimeout(
                    "timed out waiting for this process's commit queue", path=kv.path, wait_s=wait
                )
            try:
                self._write(conn, delay_s)
            finally:
                kv._commit_lock.release()
        finally:
            self._abort()

    def _write(self, conn: sqlite3.Connection, delay_s: float) -> None:
        kv = self._kv
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise KVTimeout(f"sqlite write lock not acquired: {e}", path=kv.path) from e
            raise KVUnavailable(f"sqlite begin failed: {e}", path=kv.path) from e
        try:
            version = conn.execute("SELECT n FROM ff_kv_meta WHERE name = 'version'").fetchone()[0]
            if self._reads and self._rv is not None and version != self._rv:
                floor = conn.execute("SELECT n FROM ff_kv_meta WHERE name = 'log_floor'").fetchone()[0]
                if self._rv < floor:
                    raise TransactionTooOld(
                        "transaction read version is older than the conflict history kept",
                        read_version=self._rv,
                        log_floor=floor,
                        max_txn_age_s=kv.max_txn_age_s,
                    )
                for v, w in conn.execute("SELECT version, w FROM ff_kv_log WHERE version > ?", (self._rv,)):
                    hit = _first_hit(self._reads, w)
                    if hit is not None:
                        raise KVConflict(
                            "a key this transaction read was written by a concurrent commit",
                            key=hit[:256],
                            read_version=self._rv,
                            commit_version=v,
                        )
            clears = list(self._clears)
            if clears:
                conn.executemany("DELETE FROM ff_kv WHERE k >= ? AND k < ?", clears)
            if self._sets:
                conn.executemany(_UPSERT, self._sets.items())
            version += 1
            flat = [x for r in clears for x in r]
            conn.execute("UPDATE ff_kv_meta SET n = ? WHERE name = 'version'", (version,))
            conn.execute(
                "INSERT INTO ff_kv_log (version, t, w) VALUES (?, ?, ?)",
                (version, kv.clock.time(), msgspec.msgpack.encode([list(self._sets), flat])),
            )
            if version % _GC_EVERY == 0:
                self._prune_log(conn)
            if delay_s:
                time.sleep(delay_s)
            conn.execute("COMMIT")
        except BaseException as e:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            if isinstance(e, sqlite3.Error):
                raise KVUnavailable(f"sqlite commit failed: {e}", path=kv.path) from e
            raise

    def _prune_log(self, conn: sqlite3.Connection) -> None:
        cutoff = self._kv.clock.time() - self._kv.max_txn_age_s
        (floor,) = conn.execute(
            "SELECT max(version) FROM (SELECT version, t FROM ff_kv_log ORDER BY version LIMIT ?) WHERE t < ?",
            (_GC_BATCH, cutoff),
        ).fetchone()
        if floor is not None:
            conn.execute("DELETE FROM ff_kv_log WHERE version <= ?", (floor,))
            conn.execute("UPDATE ff_kv_meta SET n = ? WHERE name = 'log_floor'", (floor,))

    def _abort(self) -> None:
        conn, self._conn = self._conn, None
        self._rv = None
        if conn is not None:
            self._kv._release(conn)


class SqliteKV(KV):
    backend = "sqlite"
    untracked_snapshot_reads = True

    def __init__(
        self,
        path: str | None,
        *,
        synchronous: str = "NORMAL",
        busy_timeout_s: float = 30.0,
        max_txn_age_s: float = 60.0,
        pool_size: int = 32,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            from .errors import KVInvalidArgument

            raise KVInvalidArgument("synchronous must be OFF, NORMAL, FULL or EXTRA", synchronous=synchronous)
        self._tmpdir = tempfile.mkdtemp(prefix="ff-kv-") if path is None else None
        self.path = os.path.join(self._tmpdir, "kv.db") if self._tmpdir else path
        self.synchronous = synchronous.upper()
        self.busy_timeout_s = busy_timeout_s
        self.max_txn_age_s = max_txn_age_s
        self.pool_size = pool_size
        self._pool: ConnPool[sqlite3.Connection] = ConnPool(pool_size, self._connect)
        self._commit_lock = threading.Lock()
        conn = self._connect()
        try:
            self._init_schema(conn)
        except sqlite3.Error as e:
            conn.close()
            raise KVUnavailable(f"cannot open sqlite KV at {self.path}: {e}", path=self.path) from e
        self._release(conn)

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        # Switching a new file to WAL takes an exclusive lock and SQLite does not run
        # the busy handler for it: two processes creating one file at once (replicas
        # starting together) see "database is locked" at once.  Retry within the busy timeout.
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.01
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        conn.execute("BEGIN IMMEDIATE")
        for stmt in _SCHEMA:
            conn.execute(stmt)
        conn.execute("COMMIT")

    def __repr__(self) -> str:
        return f"SqliteKV({self.path!r})"

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
        except sqlite3.Error as e:
            raise KVUnavailable(f"cannot open sqlite KV at {self.path}: {e}", path=self.path) from e
        return conn

    def _acquire(self) -> sqlite3.Connection:
        if self._closed:
            raise KVUnavailable("the KV store is closed", path=self.path)
        return self._pool.take()

    def _release(self, conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            conn.close()
            return
        self._pool.give(conn)

    def _new_txn(self, deadline: float | None, system: bool) -> Txn:
        return _SqliteTxn(self, deadline=deadline, system=system)

    def _close_backend(self) -> None:
        self._pool.close()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
