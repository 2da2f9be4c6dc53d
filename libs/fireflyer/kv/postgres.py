"""PostgreSQL backend: one table under SERIALIZABLE isolation (SQL that CockroachDB also runs).

Table ``<schema>.ff_kv (k BYTEA PRIMARY KEY, v BYTEA NOT NULL)``; BYTEA compares
bytewise (memcmp, then length; no collation), as CockroachDB's BYTES does.  Each
transaction is one database transaction at ``ISOLATION LEVEL SERIALIZABLE`` on a
pooled connection; reads are sent as they happen, writes are buffered by ``api.Txn``
and sent at commit (range clears as ``DELETE``, sets as ``INSERT .. ON CONFLICT DO
UPDATE``, in key order to keep lock order stable).  SQLSTATE 40001 (serialization
failure) and 40P01 (deadlock) become ``KVConflict``, retried by ``KV.run``; a lost
connection during ``COMMIT`` becomes ``CommitUnknown``; one before it ``KVUnavailable``.
No advisory locks, no PL/pgSQL, no ``FOR SHARE``.

Deviations from FoundationDB semantics, all on the side of extra aborts, never anomalies:

- **Snapshot reads are conflict-tracked** (``untracked_snapshot_reads = False``):
  PostgreSQL has no per-read opt-out inside a serializable transaction, and reading
  through a second connection would see a different snapshot.  They can cause extra
  conflicts, never anomalies.
- ``add_read_conflict_key/range`` *reads* the key or range (``SELECT count(*)``), which
  is what makes it conflict-tracked under SSI.
- PostgreSQL's SSI aborts only on dangerous structures (a read-write cycle), not on
  every overwritten read: a transaction whose read was overwritten by a concurrent
  commit may still commit, serialized *before* that writer.  The outcome is
  serializable; code must not rely on "my reads were not overwritten" beyond that.
- SSI locks at index-page granularity for ranges and absent keys, so transactions on
  nearby keys can conflict falsely (more retries, never wrong results).  Sequential
  and bitmap scans are disabled per session on PostgreSQL so that reads take
  page/tuple locks instead of a whole-relation lock.  Keys written concurrently by
  different clients should not all sit in one leaf page (~100 small keys): spread hot
  keys (3FS encodes inode ids little-endian in keys for the same reason on FDB).
- The idempotency record is looked up at READ COMMITTED before the transaction rather
  than read inside it (see ``PostgresKV._read_committed_get``): same guarantee, no
  false conflicts on the index page where new records land.
- Sets are sent as multi-row ``INSERT .. ON CONFLICT`` statements of up to 500 rows.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pgerr

from .api import KV, Txn
from .errors import CommitUnknown, KVConflict, KVError, KVInvalidArgument, KVUnavailable
from .pool import ConnPool

__all__ = ["PostgresKV"]

_UPSERT_BATCH = 500  # rows per INSERT statement (one round trip each)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_CONFLICT_ERRORS = (pgerr.SerializationFailure, pgerr.DeadlockDetected)
_DDL_RACES = (pgerr.UniqueViolation, pgerr.DuplicateTable, pgerr.DuplicateObject, pgerr.DuplicateSchema)


def _redact(dsn: str) -> str:
    return re.sub(r"://([^:@/]*):[^@/]*@", r"://\1:***@", dsn)


class _PgTxn(Txn):
    _kv: PostgresKV

    def __init__(self, kv: PostgresKV, *, deadline: float | None, system: bool = False) -> None:
        super().__init__(kv, deadline=deadline, system=system)
        self._conn: psycopg.Connection[Any] | None = None

    def _c(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            self._conn = self._kv._acquire()
        return self._conn

    @contextmanager
    def _errors(self, stage: str) -> Iterator[None]:
        try:
            yield
        except _CONFLICT_ERRORS as e:
            raise KVConflict(
                f"PostgreSQL serialization failure during {stage}: {e}", stage=stage, sqlstate=e.sqlstate
            ) from e
        except psycopg.OperationalError as e:
            raise KVUnavailable(
                f"PostgreSQL failed during {stage}: {e}", stage=stage, sqlstate=e.sqlstate
            ) from e
        except psycopg.Error as e:
            raise KVError(f"PostgreSQL error during {stage}: {e}", stage=stage, sqlstate=e.sqlstate) from e

    def _db_get(self, key: bytes) -> bytes | None:
        with self._errors("read"):
            row = self._c().execute(self._kv._sql_get, (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def _db_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[tuple[bytes, bytes]]:
        sql = self._kv._sql_range_desc if reverse else self._kv._sql_range_asc
        with self._errors("read"):
            if limit:
                rows = self._c().execute(sql + " LIMIT %s", (begin, end, limit)).fetchall()
            else:
                rows = self._c().execute(sql, (begin, end)).fetchall()
        return [(bytes(k), bytes(v)) for k, v in rows]

    def _on_read_conflict(self, begin: bytes, end: bytes, explicit: bool) -> None:
        if explicit:  # ordinary reads are tracked by the server already
            with self._errors("read"):
                self._c().execute(self._kv._sql_count, (begin, end)).fetchone()

    def _commit_backend(self, delay_s: float) -> None:
        try:
            if self._conn is None and self.read_only:
                return  # nothing was read or written: nothing to commit
            conn = self._c()
            with self._errors("write"):
                for begin, end in self._clears:
                    conn.execute(self._kv._sql_clear, (begin, end))
                items = sorted(self._sets.items())
                for i in range(0, len(items), _UPSERT_BATCH):
                    batch = items[i : i + _UPSERT_BATCH]
                    conn.execute(self._kv._upsert_sql(len(batch)), [x for kv in batch for x in kv])
            if delay_s:
                time.sleep(delay_s)
            try:
                conn.commit()
            except _CONFLICT_ERRORS as e:
                raise KVConflict(
                    f"PostgreSQL serialization failure at commit: {e}", stage="commit", sqlstate=e.sqlstate
                ) from e
            except psycopg.Error as e:
                # the server may or may not have committed before the connection broke
                raise CommitUnknown(f"PostgreSQL commit result unknown: {e}", sqlstate=e.sqlstate) from e
        finally:
            self._abort()

    def _abort(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._kv._release(conn)


class PostgresKV(KV):
    backend = "postgresql"
    untracked_snapshot_reads = False

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        pool_size: int = 32,
        connect_timeout_s: float = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if schema is not None and not _IDENT.match(schema):
            raise KVInvalidArgument("schema must be a plain SQL identifier", schema=schema)
        self.dsn = dsn
        self.schema = schema
        self.pool_size = pool_size
        self.connect_timeout_s = connect_timeout_s
        self._pool: ConnPool[psycopg.Connection[Any]] = ConnPool(pool_size, self._connect)
        self.is_cockroach = False
        t = f'"{schema}".ff_kv' if schema else "ff_kv"
        self.table = t
        self._sql_get = f"SELECT v FROM {t} WHERE k = %s"
        self._sql_range_asc = f"SELECT k, v FROM {t} WHERE k >= %s AND k < %s ORDER BY k ASC"
        self._sql_range_desc = f"SELECT k, v FROM {t} WHERE k >= %s AND k < %s ORDER BY k DESC"
        self._sql_count = f"SELECT count(*) FROM {t} WHERE k >= %s AND k < %s"
        self._sql_clear = f"DELETE FROM {t} WHERE k >= %s AND k < %s"
        self._create_tables()

    def _upsert_sql(self, rows: int) -> str:
        values = ", ".join(["(%s, %s)"] * rows)
        return f"INSERT INTO {self.table} (k, v) VALUES {values} ON CONFLICT (k) DO UPDATE SET v = excluded.v"

    def _read_committed_get(self, key: bytes) -> bytes | None:
        """Look a key up outside any serializable transaction (no SIREAD locks).

        Used for the idempotency-record check: reading an absent record inside the
        transaction would take a page-level predicate lock on the index page where
        every new record is inserted, making concurrent idempotent transactions
        conflict falsely.  Skipping that read is safe here because two attempts that
        both miss the record then both write the same record key, and PostgreSQL
        aborts one of them (40001) on that write-write conflict; its retry finds the
        record.
        """
        conn = self._acquire()
        try:
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            row = conn.execute(f"SELECT v FROM {self.table} WHERE k = %s", (key,)).fetchone()
            conn.commit()
        except psycopg.Error as e:
            conn.close()
            raise KVUnavailable(f"PostgreSQL idempotency lookup failed: {e}", sqlstate=e.sqlstate) from e
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        self._release(conn)
        return None if row is None else bytes(row[0])

    def __repr__(self) -> str:
        return f"PostgresKV({_redact(self.dsn)!r}, schema={self.schema!r})"

    def _create_tables(self) -> None:
        """Idempotent and safe when several processes open at once (DDL races are retried)."""
        stmts = [f"CREATE TABLE IF NOT EXISTS {self.table} (k BYTEA PRIMARY KEY, v BYTEA NOT NULL)"]
        if self.schema:
            stmts.insert(0, f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        for attempt in range(5):
            try:
                with self._raw_connect(autocommit=True) as conn:
                    self.is_cockroach = (
                        "cockroach" in str(conn.execute("SELECT version()").fetchone()[0]).lower()
                    )
                    for s in stmts:
                        conn.execute(s)
                return
            except _DDL_RACES:
                if attempt == 4:
                    raise
                time.sleep(0.05 * (attempt + 1))
            except psycopg.Error as e:
                raise KVUnavailable(f"cannot create KV table {self.table}: {e}", dsn=_redact(self.dsn)) from e

    def _raw_connect(self, autocommit: bool) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(
                self.dsn, autocommit=autocommit, connect_timeout=max(1, int(self.connect_timeout_s))
            )
        except psycopg.Error as e:
            raise KVUnavailable(f"cannot connect to PostgreSQL: {e}", dsn=_redact(self.dsn)) from e

    def _connect(self) -> psycopg.Connection[Any]:
        conn = self._raw_connect(autocommit=False)
        try:
            conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
            if not self.is_cockroach:
                conn.execute("SET enable_seqscan = off")
                conn.execute("SET enable_bitmapscan = off")
                conn.commit()
        except psycopg.Error as e:
            conn.close()
            raise KVUnavailable(f"cannot set up PostgreSQL session: {e}", dsn=_redact(self.dsn)) from e
        return conn

    def _acquire(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise KVUnavailable("the KV store is closed", backend=self.backend)
        return self._pool.take()

    def _release(self, conn: psycopg.Connection[Any]) -> None:
        if conn.closed or conn.broken:
            conn.close()
            return
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.rollback()
        except psycopg.Error:
            conn.close()
            return
        self._pool.give(conn)

    def _new_txn(self, deadline: float | None, system: bool) -> Txn:
        return _PgTxn(self, deadline=deadline, system=system)

    def _close_backend(self) -> None:
        self._pool.close()

    def _idempotency_lookup(self, txn: Txn, idem: bytes) -> bytes | None:
        return self._read_committed_get(idem)
