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
  read-only transactions commit without taking the lock (and a transaction with no
  conflict-tracked read never reads ``version`` at all).
- Commits go through one writer connection per ``SqliteKV``.  It waits for the write
  lock with its own short sleeps (50 us doubling to 2 ms; SQLite's busy handler sleeps
  1 ms and more, far longer than another process's commit holds the lock) and never
  checkpoints inside a commit: every 500 commits a background thread runs a RESTART
  checkpoint (see ``_checkpoint_loop``; the fsyncs ``synchronous`` asks for at
  checkpoints happen there), so the WAL file holds about 500 commits (~20 MB of
  metadata commits) and is then rewritten from its start.
- ``KV.nonblocking()`` (for event loops running short transactions inline): a commit
  that finds the lock held, here or in another process, fails at once with
  ``KVWouldBlock`` instead of waiting, and nothing of it is applied.

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
from .errors import KVConflict, KVTimeout, KVUnavailable, KVWouldBlock, TransactionTooOld
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
_VERSION = "SELECT n FROM ff_kv_meta WHERE name = 'version'"
#: the writer's own wait for the write lock another process holds: first sleep, cap
_BUSY_FIRST_S = 0.00005
_BUSY_MAX_S = 0.002
#: a nonblocking commit retries a held lock this often (no sleep) before giving up
_NONBLOCKING_SPINS = 3
#: commits between two background WAL checkpoints (SQLite's own default is every 1000 pages;
#: a metadata commit writes about ten pages, and a rarer checkpoint stalls writers less often)
_CHECKPOINT_EVERY = 500
#: how long a checkpoint waits for the write lock and for readers before doing what it can
_CHECKPOINT_BUSY_S = 0.05
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
        self._began = False
        self._rv: int | None = None

    def _snapshot(self) -> sqlite3.Connection:
        """The connection, inside the read transaction that is this txn's snapshot."""
        conn = self._conn
        if not self._began:
            if conn is None:
                conn = self._conn = self._kv._acquire()
            try:
                conn.execute("BEGIN")
            except sqlite3.Error as e:
                raise KVUnavailable(f"sqlite read failed: {e}", path=self._kv.path) from e
            self._began = True
        assert conn is not None
        return conn

    def _read_version(self) -> int:
        """The read version: the commit ``version`` as of the snapshot.  Read only when a
        conflict-tracked read needs it (snapshot-only transactions skip the query); the
        read transaction fixes the snapshot, so reading it later gives the same value."""
        if self._rv is None:
            conn = self._snapshot()
            try:
                self._rv = conn.execute(_VERSION).fetchone()[0]
            except sqlite3.Error as e:
                raise KVUnavailable(f"sqlite read failed: {e}", path=self._kv.path) from e
        return self._rv

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
        self._read_version()  # fixes the read version the conflict check starts from

    def _commit_backend(self, delay_s: float) -> None:
        kv = self._kv
        conn = self._conn
        try:
            if conn is not None and conn.in_transaction:
                conn.execute("COMMIT")  # ends the read snapshot; nothing was written in it
            if self.read_only:
                return
            nonblocking = kv._nonblocking_now()
            if nonblocking:
                if not kv._commit_lock.acquire(blocking=False):
                    raise KVWouldBlock("another thread of this process is committing", path=kv.path)
            else:
                wait = kv.busy_timeout_s
                if self._deadline is not None:
                    wait = min(wait, max(self._deadline - kv.clock.monotonic(), 0.0))
                if not kv._commit_lock.acquire(timeout=wait):
                    raise KVTimeout(
                        "timed out waiting for this process's commit queue", path=kv.path, wait_s=wait
                    )
            try:
                self._write(kv._writer(), delay_s, nonblocking)
            finally:
                kv._commit_lock.release()
        finally:
            self._abort()

    def _begin_write(self, conn: sqlite3.Connection, nonblocking: bool) -> None:
        """``BEGIN IMMEDIATE`` on the writer connection (busy timeout 0), retried here with
        short sleeps: SQLite's own busy handler sleeps 1, 2, 5, 10... ms, far longer than
        the other process's commit holds the lock.  Nonblocking: a few spins, then
        ``KVWouldBlock``."""
        kv = self._kv
        budget = kv.busy_timeout_s
        if self._deadline is not None:
            budget = min(budget, max(self._deadline - kv.clock.monotonic(), 0.0))
        deadline = time.monotonic() + budget  # real time: the sleeps below are real
        delay = _BUSY_FIRST_S
        spins = 0
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise KVUnavailable(f"sqlite begin failed: {e}", path=kv.path) from e
                if nonblocking:
                    spins += 1
                    if spins > _NONBLOCKING_SPINS:
                        raise KVWouldBlock("the sqlite write lock is held by another process", path=kv.path) from e
                    time.sleep(0)
                    continue
                if time.monotonic() + delay > deadline:
                    raise KVTimeout(f"sqlite write lock not acquired: {e}", path=kv.path) from e
                time.sleep(delay)
                delay = min(delay * 2, _BUSY_MAX_S)

    def _write(self, conn: sqlite3.Connection, delay_s: float, nonblocking: bool = False) -> None:
        kv = self._kv
        self._begin_write(conn, nonblocking)
        try:
            version = conn.execute(_VERSION).fetchone()[0]
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
        kv._committed()

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
        self._began = False
        if conn is not None:
            self._kv._release(conn)


class SqliteKV(KV):
    backend = "sqlite"
    untracked_snapshot_reads = True
    supports_nonblocking = True

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
        #: the one connection this KV commits on (under _commit_lock); opened lazily
        self._writer_conn: sqlite3.Connection | None = None
        self._commits_since_checkpoint = 0
        self._checkpoint_wanted = threading.Event()
        self._checkpointer: threading.Thread | None = None
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

    def _writer(self) -> sqlite3.Connection:
        """The commit connection (caller holds ``_commit_lock``): busy timeout 0, since
        :meth:`_SqliteTxn._begin_write` waits for the lock itself, and no automatic
        checkpoint, which would run inside a commit and may fsync: a background thread
        checkpoints instead (:meth:`_committed`), so a commit never waits for the disk."""
        conn = self._writer_conn
        if conn is None:
            if self._closed:
                raise KVUnavailable("the KV store is closed", path=self.path)
            try:
                conn = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
                conn.execute(f"PRAGMA synchronous={self.synchronous}")
                conn.execute("PRAGMA wal_autocheckpoint=0")
            except sqlite3.Error as e:
                raise KVUnavailable(f"cannot open sqlite KV at {self.path}: {e}", path=self.path) from e
            self._writer_conn = conn
        return conn

    def _committed(self) -> None:
        """After each commit (under ``_commit_lock``): every ``_CHECKPOINT_EVERY`` commits,
        wake the checkpoint thread (started on first use)."""
        self._commits_since_checkpoint += 1
        if self._commits_since_checkpoint < _CHECKPOINT_EVERY:
            return
        self._commits_since_checkpoint = 0
        if self._checkpointer is None and not self._closed:
            self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="kv-sqlite-checkpoint",
                                                  daemon=True)
            self._checkpointer.start()
        self._checkpoint_wanted.set()

    def _checkpoint_loop(self) -> None:
        """Checkpoints on request, ending in RESTART mode: copy the WAL into the database
        and make the next commit write the WAL from its start again.  That restart matters: a WAL
        that only grows (PASSIVE checkpoints never catch up while commits keep coming)
        makes every commit extend the file, several times the cost of overwriting it.
        The mode takes the write lock only while it copies; when the lock or a reader is
        not free within the short busy timeout it checkpoints what it can (as PASSIVE)
        and the next request tries again.  The fsyncs ``synchronous`` asks for at
        checkpoints happen here, off the committing threads."""
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._checkpoint_wanted.wait()
                self._checkpoint_wanted.clear()
                if self._closed:
                    return
                try:
                    if conn is None:
                        conn = sqlite3.connect(self.path, timeout=_CHECKPOINT_BUSY_S, isolation_level=None,
                                               check_same_thread=False)
                        conn.execute(f"PRAGMA synchronous={self.synchronous}")
                    # PASSIVE copies the bulk (and fsyncs) without blocking writers; RESTART then
                    # holds the write lock only for the few frames committed meanwhile
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
                except sqlite3.Error:  # best effort: the next request tries again
                    pass
        finally:
            if conn is not None:
                conn.close()

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
        self._checkpoint_wanted.set()
        if self._checkpointer is not None:
            self._checkpointer.join(timeout=5.0)
        with self._commit_lock:
            if self._writer_conn is not None:
                self._writer_conn.close()
                self._writer_conn = None
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
