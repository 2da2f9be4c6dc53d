"""The backend-independent half of the KV store: ``KV.run`` and ``Txn`` (``open_kv``: :mod:`.opener`).

A ``Txn`` buffers its writes (sets and range clears) in the client and sends them at
commit, like FoundationDB: reads see the transaction's own pending writes
(read-your-writes), and the backend only has to (1) read at one consistent snapshot
and (2) apply the buffered writes atomically, failing with ``KVConflict`` when a
conflict-tracked read was invalidated by a concurrent commit.  Backends:
``fireflyer.kv.sqlite`` (optimistic checking over WAL) and ``fireflyer.kv.postgres``
(SERIALIZABLE); each module's docstring states its exact semantics.

``KV.run(fn)`` is the way to use it: it retries ``fn`` on conflicts with exponential
backoff and jitter, and makes "commit result unknown" safe through idempotency
records written in the same transaction (3FS's ``IDEM`` records, 30 min expiry).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypeVar

import msgspec

from fireflyer.core.clock import SYSTEM_CLOCK, Clock
from fireflyer.core.log import get_logger

from .errors import (
    CommitUnknown,
    KVConflict,
    KVError,
    KVInvalidArgument,
    KVTimeout,
    KVUnavailable,
    KVWouldBlock,
    TransactionTooOld,
)
from .faults import FaultInjector
from .keys import key_after
from .ranges import RangeSet

__all__ = [
    "KV",
    "Txn",
    "KVStats",
    "MAX_KEY_SIZE",
    "MAX_VALUE_SIZE",
    "MAX_TXN_BYTES",
    "SYSTEM_PREFIX",
    "IDEM_PREFIX",
]

T = TypeVar("T")
log = get_logger(__name__)

#: Keys are limited to 2 KB, not FoundationDB's 10 KB: a PostgreSQL btree entry holds
#: at most ~2.7 KB (bytea keys are rarely compressible), and one limit for every
#: backend keeps code written against SQLite deployable on PostgreSQL.
MAX_KEY_SIZE = 2048
MAX_VALUE_SIZE = 100_000  # as FoundationDB
MAX_TXN_BYTES = 10_000_000  # as FoundationDB
#: keys at or above 0xFF are the store's own (idempotency records); users may read them
SYSTEM_PREFIX = b"\xff"
IDEM_PREFIX = b"\xff/idem/"
IDEM_TIME_PREFIX = b"\xff/idemt/"
MAX_IDEMPOTENCY_KEY = 1024

_RETRYABLE = (KVConflict, TransactionTooOld, KVUnavailable)


def _check_bytes(value: object, what: str) -> bytes:
    if type(value) is not bytes:
        raise KVInvalidArgument(f"{what} must be bytes, got {type(value).__name__}", what=what)
    return value


def _check_key(key: object, what: str = "key", *, write: bool = False, system: bool = False) -> bytes:
    k = _check_bytes(key, what)
    # a range end may be one byte longer so that key_after(max-size key) is expressible
    limit = MAX_KEY_SIZE + (1 if what == "end" else 0)
    if len(k) > limit:
        raise KVInvalidArgument(
            f"{what} of {len(k)} bytes exceeds the {MAX_KEY_SIZE}-byte limit", size=len(k)
        )
    if write and not system:
        too_high = k > SYSTEM_PREFIX if what == "end" else k >= SYSTEM_PREFIX
        if too_high:
            raise KVInvalidArgument(f"{what} {k[:32]!r} is in the system key space (>= 0xFF)", key=k[:64])
    return k


class KVStats:
    """Counters for benchmarks and tests (thread safe, monotonically increasing)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.commits = 0
        self.conflicts = 0
        self.retries = 0
        self.unknown = 0

    def bump(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {
                "commits": self.commits,
                "conflicts": self.conflicts,
                "retries": self.retries,
                "unknown": self.unknown,
            }


class Txn:
    """One transaction: reads at a snapshot, buffered writes, commit or rollback.

    Not thread safe (use one per thread); the ``KV`` that makes it is.  Use it as a
    context manager or end it with ``commit()``/``rollback()``; an unfinished
    transaction holds a pooled connection (and, on SQLite, an old WAL snapshot).
    """

    def __init__(self, kv: KV, *, deadline: float | None, system: bool = False) -> None:
        self._kv = kv
        self._deadline = deadline
        self._system = system
        self._sets: dict[bytes, bytes] = {}
        self._clears = RangeSet()
        self._reads = RangeSet()
        self._write_bytes = 0
        self._state = "open"

    # -- backend hooks -------------------------------------------------------------
    def _db_get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def _db_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[tuple[bytes, bytes]]:
        raise NotImplementedError

    def _on_read_conflict(self, begin: bytes, end: bytes, explicit: bool) -> None:
        """Called for every conflict-tracked read range; ``explicit`` for add_read_conflict_*."""

    def _commit_backend(self, delay_s: float) -> None:
        """Apply ``_sets``/``_clears`` atomically or raise; always releases the connection."""
        raise NotImplementedError

    def _abort(self) -> None:
        """Roll back and release the connection; idempotent."""

    # -- reads ----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._state != "open":
            raise KVInvalidArgument(f"transaction is already {self._state}", state=self._state)
        if self._deadline is not None and self._kv.clock.monotonic() > self._deadline:
            raise KVTimeout("transaction passed its deadline", stage="operation")

    def _track(self, begin: bytes, end: bytes, explicit: bool = False) -> None:
        self._reads.add(begin, end)
        self._on_read_conflict(begin, end, explicit)

    def get(self, key: bytes, *, snapshot: bool = False) -> bytes | None:
        """The value of ``key`` or None; ``snapshot=True`` adds no read conflict."""
        self._check_open()
        key = _check_key(key)
        if not snapshot:
            self._track(key, key_after(key))
        if key in self._sets:
            return self._sets[key]
        if self._clears.contains(key):
            return None
        return self._db_get(key)

    def get_range(
        self, begin: bytes, end: bytes, *, limit: int = 0, reverse: bool = False, snapshot: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """Pairs with ``begin <= key < end`` in key order (descending if ``reverse``), at most
        ``limit`` (0: all).  With a limit that is hit, only the part actually returned is
        conflict-tracked, as in FoundationDB."""
        self._check_open()
        begin, end = _check_key(begin, "begin"), _check_key(end, "end")
        if type(limit) is not int or limit < 0:
            raise KVInvalidArgument("limit must be an int >= 0", limit=str(limit))
        if begin > end:
            raise KVInvalidArgument("range begin is after its end", begin=begin[:64], end=end[:64])
        if begin == end:
            return []
        gaps = self._clears.gaps(begin, end)
        if reverse:
            gaps.reverse()
        rows: list[tuple[bytes, bytes]] = []
        for gb, ge in gaps:
            rows.extend(self._db_range(gb, ge, limit - len(rows) if limit else 0, reverse))
            if limit and len(rows) >= limit:
                break
        if self._sets:
            merged = dict(rows)
            merged.update((k, v) for k, v in self._sets.items() if begin <= k < end)
            rows = sorted(merged.items(), reverse=reverse)
        if limit:
            rows = rows[:limit]
        if not snapshot:
            if limit and len(rows) == limit:
                last = rows[-1][0]
                self._track(*((last, end) if reverse else (begin, key_after(last))))
            else:
                self._track(begin, end)
        return rows

    def add_read_conflict_key(self, key: bytes) -> None:
        """Make the commit fail if a concurrent transaction writes ``key`` (as if it were read)."""
        self._check_open()
        key = _check_key(key)
        self._track(key, key_after(key), explicit=True)

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._check_open()
        begin, end = _check_key(begin, "begin"), _check_key(end, "end")
        if begin > end:
            raise KVInvalidArgument("range begin is after its end", begin=begin[:64], end=end[:64])
        if begin < end:
            self._track(begin, end, explicit=True)

    # -- writes ---------------------------------------------------------------------
    def _account(self, n: int) -> None:
        self._write_bytes += n
        if self._write_bytes > MAX_TXN_BYTES:
            raise KVInvalidArgument(
                f"transaction writes exceed {MAX_TXN_BYTES} bytes", size=self._write_bytes
            )

    def set(self, key: bytes, value: bytes) -> None:
        self._check_open()
        key = _check_key(key, write=True, system=self._system)
        value = _check_bytes(value, "value")
        if len(value) > MAX_VALUE_SIZE:
            raise KVInvalidArgument(
                f"value of {len(value)} bytes exceeds the {MAX_VALUE_SIZE}-byte limit", size=len(value)
            )
        self._account(len(key) + len(value))
        self._sets[key] = value

    def clear(self, key: bytes) -> None:
        self._check_open()
        key = _check_key(key, write=True, system=self._system)
        self._account(len(key))
        self._sets.pop(key, None)
        self._clears.add(key, key_after(key))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Remove every key in ``[begin, end)`` (including ones set earlier in this txn)."""
        self._check_open()
        begin = _check_key(begin, "begin", write=True, system=self._system)
        end = _check_key(end, "end", write=True, system=self._system)
        if begin > end:
            raise KVInvalidArgument("range begin is after its end", begin=begin[:64], end=end[:64])
        if begin == end:
            return
        self._account(len(begin) + len(end))
        for k in [k for k in self._sets if begin <= k < end]:
            del self._sets[k]
        self._clears.add(begin, end)

    # -- end ------------------------------------------------------------------------
    @property
    def read_only(self) -> bool:
        return not self._sets and not self._clears

    def commit(self) -> None:
        """Apply the writes atomically, or raise (KVConflict, CommitUnknown, ...)."""
        self._check_open()
        fault = None
        if not self._system:
            fault = self._kv.faults.take(tuple(self._sets), tuple(self._clears))
        try:
            if fault is not None and fault.kind == "conflict":
                raise KVConflict("injected conflict", injected=True)
            if fault is not None and fault.kind == "unknown_result_not_committed":
                raise CommitUnknown("injected: commit result unknown (not applied)", injected=True)
            self._commit_backend(fault.delay_s if fault is not None and fault.kind == "slow_commit" else 0.0)
        except BaseException as e:
            self._state = "failed"
            self._abort()
            if isinstance(e, KVConflict):
                self._kv.stats.bump("conflicts")
            elif isinstance(e, CommitUnknown):
                self._kv.stats.bump("unknown")
            raise
        self._state = "committed"
        self._kv.stats.bump("commits")
        if fault is not None and fault.kind == "unknown_result":
            self._kv.stats.bump("unknown")
            raise CommitUnknown("injected: commit result unknown (it was applied)", injected=True)

    def rollback(self) -> None:
        if self._state == "open":
            self._state = "rolled back"
        self._abort()

    def __enter__(self) -> Txn:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._state == "open":
            if exc_type is None:
                self.commit()
            else:
                self.rollback()


class KV:
    """An ordered byte-key store with serializable transactions; thread safe.

    Make one with :func:`fireflyer.kv.open_kv`.  ``faults`` arms test faults, ``stats`` counts
    commits, conflicts, retries and unknown results.
    """

    backend: ClassVar[str] = "?"
    #: False where snapshot reads are still conflict-tracked (PostgreSQL)
    untracked_snapshot_reads: ClassVar[bool] = True
    #: True where :meth:`nonblocking` can fail fast instead of waiting (SQLite: the write
    #: lock is local); elsewhere a transaction may always wait on the network
    supports_nonblocking: ClassVar[bool] = False

    def __init__(
        self,
        *,
        clock: Clock = SYSTEM_CLOCK,
        max_retries: int = 20,
        backoff_base_s: float = 0.005,
        backoff_max_s: float = 0.5,
        idempotency_expiry_s: float = 1800.0,
        idempotency_gc_interval_s: float = 60.0,
    ) -> None:
        self.clock = clock
        self.faults = FaultInjector()
        self.stats = KVStats()
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.idempotency_expiry_s = idempotency_expiry_s
        self.idempotency_gc_interval_s = idempotency_gc_interval_s
        self._gc_lock = threading.Lock()
        self._last_gc = clock.monotonic()
        self._closed = False
        self._nb = threading.local()

    # -- backend hooks -------------------------------------------------------------
    def _new_txn(self, deadline: float | None, system: bool) -> Txn:
        raise NotImplementedError

    def _close_backend(self) -> None:
        pass

    # -- public ---------------------------------------------------------------------
    @contextlib.contextmanager
    def nonblocking(self) -> Iterator[None]:
        """Within the block, on this thread, transactions never wait: where one would have
        to (a lock held elsewhere, a retry's backoff) it fails with ``KVWouldBlock`` and
        nothing of that attempt is applied.  For callers on an event loop that run short
        transactions inline and fall back to a worker thread on ``KVWouldBlock``.  Only
        meaningful where ``supports_nonblocking``; elsewhere the block changes nothing."""
        prev = getattr(self._nb, "on", False)
        self._nb.on = True
        try:
            yield
        finally:
            self._nb.on = prev

    def _nonblocking_now(self) -> bool:
        return getattr(self._nb, "on", False)

    def begin(self, *, timeout_s: float | None = None) -> Txn:
        """A transaction under manual control (``commit()``/``rollback()``); no retries."""
        if self._closed:
            raise KVUnavailable("the KV store is closed", backend=self.backend)
        deadline = None if timeout_s is None else self.clock.monotonic() + timeout_s
        return self._new_txn(deadline, False)

    def run(
        self,
        fn: Callable[[Txn], T],
        *,
        max_retries: int | None = None,
        idempotency_key: bytes | None = None,
        idempotent: bool = False,
        timeout_s: float | None = None,
        result_type: Any = None,
    ) -> T:
        """Run ``fn(txn)`` and commit, retrying ``fn`` on conflicts up to ``max_retries`` times.

        ``fn`` may run several times; it must not have side effects outside ``txn``.
        With ``idempotency_key`` the transaction also records ``fn``'s result (as msgpack,
        so return plain data; ``result_type`` decodes it into a msgspec type) and any
        later attempt, in this call or another process, returns the record instead of
        running ``fn`` again: "commit result unknown" is then retried safely.  Without a
        key, ``CommitUnknown`` is raised unless ``idempotent=True``.  ``timeout_s``
        bounds the whole call (``KVTimeout``).  After the last retry the last error is
        raised with ``attempts`` in its fields.
        """
        retries = self.max_retries if max_retries is None else max_retries
        idem = None
        if idempotency_key is not None:
            ik = _check_bytes(idempotency_key, "idempotency_key")
            if len(ik) > MAX_IDEMPOTENCY_KEY:
                raise KVInvalidArgument(f"idempotency_key exceeds {MAX_IDEMPOTENCY_KEY} bytes", size=len(ik))
            idem = IDEM_PREFIX + ik
        start = self.clock.monotonic()
        deadline = None if timeout_s is None else start + timeout_s
        attempt = 0
        while True:
            attempt += 1
            txn = self.begin(
                timeout_s=None if deadline is None else max(deadline - self.clock.monotonic(), 0.0)
            )
            try:
                result = self._attempt(txn, fn, idem, result_type)
                if idem is not None:
                    self._maybe_gc()
                return result
            except KVTimeout as e:
                e.fields.update(attempts=attempt, timeout_s=timeout_s)
                raise
            except _RETRYABLE as e:
                err: KVError = e
            except CommitUnknown as e:
                if idem is None and not idempotent:
                    e.fields["attempts"] = attempt
                    raise
                err = e
            finally:
                txn.rollback()
            if attempt > retries:
                err.fields["attempts"] = attempt
                log.warning("kv.run.gave_up", backend=self.backend, error=err.kind, **err.fields)
                raise err
            if self._nonblocking_now():  # a retry would sleep: the caller retries where it may wait
                raise KVWouldBlock(f"transaction must be retried ({err.kind})", attempts=attempt,
                                   last_error=err.kind) from err
            delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
            delay = delay / 2 + random.uniform(0, delay / 2)
            if deadline is not None and self.clock.monotonic() + delay > deadline:
                raise KVTimeout(
                    f"transaction did not commit within {timeout_s} s ({attempt} attempts, last: {err.kind})",
                    attempts=attempt,
                    timeout_s=timeout_s,
                    last_error=err.kind,
                ) from err
            self.stats.bump("retries")
            log.debug("kv.run.retry", backend=self.backend, attempt=attempt, error=err.kind, delay_s=delay)
            time.sleep(delay)

    def _attempt(self, txn: Txn, fn: Callable[[Txn], T], idem: bytes | None, result_type: Any) -> T:
        if idem is None:
            result = fn(txn)
            txn.commit()
            return result
        recorded = self._idempotency_lookup(txn, idem)
        if recorded is not None:
            return _decode_record(recorded, result_type)
        result = fn(txn)
        now = self.clock.time()
        try:
            record = msgspec.msgpack.encode([now, result])
        except (TypeError, msgspec.EncodeError) as e:
            raise KVInvalidArgument(
                f"the result of an idempotent transaction must be msgpack-encodable: {e}",
                type=type(result).__name__,
            ) from e
        txn._sets[idem] = record  # system keys: written directly, accounted all the same
        txn._sets[IDEM_TIME_PREFIX + int(now * 1000).to_bytes(8, "big") + idem[len(IDEM_PREFIX) :]] = b""
        txn._account(2 * len(idem) + len(record) + 24)
        txn.commit()
        return _decode_record(record, result_type)

    def _idempotency_lookup(self, txn: Txn, idem: bytes) -> bytes | None:
        """Find an idempotency record.  Default: a conflict-tracked read in ``txn`` (exact
        key, so no false conflicts), which is what stops two attempts that both miss it
        from both committing where blind writes do not conflict (SQLite, FDB)."""
        return txn.get(idem)

    async def arun(self, fn: Callable[[Txn], T], **kwargs: Any) -> T:
        """``run`` in a worker thread, for asyncio services (same keyword arguments)."""
        return await asyncio.to_thread(self.run, fn, **kwargs)

    def gc_idempotency(self, *, now: float | None = None, limit: int = 1000) -> int:
        """Remove idempotency records older than ``idempotency_expiry_s``; returns how many."""
        cutoff = (self.clock.time() if now is None else now) - self.idempotency_expiry_s
        end = IDEM_TIME_PREFIX + int(max(cutoff, 0) * 1000).to_bytes(8, "big")

        def gc(txn: Txn) -> int:
            rows = txn.get_range(IDEM_TIME_PREFIX, end, limit=limit)
            for k, _ in rows:
                txn.clear(k)
                txn.clear(IDEM_PREFIX + k[len(IDEM_TIME_PREFIX) + 8 :])
            return len(rows)

        attempt = 0
        while True:
            attempt += 1
            txn = self._new_txn(None, True)
            try:
                n = gc(txn)
                txn.commit()
                return n
            except _RETRYABLE:
                if attempt > self.max_retries:
                    raise
            finally:
                txn.rollback()
            time.sleep(self.backoff_base_s * random.random())

    def _maybe_gc(self) -> None:
        now = self.clock.monotonic()
        if now - self._last_gc < self.idempotency_gc_interval_s or not self._gc_lock.acquire(blocking=False):
            return
        if self._nonblocking_now():  # the GC transaction may wait: not on this thread
            self._last_gc = now
            self._gc_lock.release()
            threading.Thread(target=self._gc_in_background, name="kv-idem-gc", daemon=True).start()
            return
        try:
            self._last_gc = now
            self.gc_idempotency()
        except KVError as e:  # best effort: the next interval tries again
            log.warning("kv.idempotency_gc.failed", backend=self.backend, error=repr(e))
        finally:
            self._gc_lock.release()

    def _gc_in_background(self) -> None:
        if self._closed or not self._gc_lock.acquire(blocking=False):
            return
        try:
            self.gc_idempotency()
        except KVError as e:  # best effort: the next interval tries again
            log.warning("kv.idempotency_gc.failed", backend=self.backend, error=repr(e))
        finally:
            self._gc_lock.release()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close_backend()

    def __enter__(self) -> KV:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decode_record(record: bytes, result_type: Any) -> Any:
    _, result = msgspec.msgpack.decode(record)
    if result_type is not None:
        return msgspec.convert(result, result_type)
    return result
