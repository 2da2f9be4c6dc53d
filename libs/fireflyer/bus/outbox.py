"""An outbox for durable events that must reach JetStream even if NATS is away when they happen.

    outbox = Outbox(bus, path=state_dir / "checkpoint-0.outbox.db")   # path=None: memory only
    await outbox.start()                     # loads what a previous run left, starts sending
    outbox.append(subject, event)            # any thread; returns at once (stored first)
    await outbox.stop(drain_s=2.0)           # what is still unsent stays in the file

Guarantees:

- **Nothing acknowledged is forgotten.** :meth:`Outbox.append` stores the message (in
  memory, and in a small SQLite file when ``path`` is given: it survives a crash or a
  restart of the service) before it returns.  Only JetStream's publish ack removes it.
- **Order is kept.** Messages go out one at a time, oldest first; a message that fails
  is retried (backoff from ``retry_wait_s`` doubling to ``max_retry_wait_s``) before
  any later one is sent.
- **Duplicates are harmless.** Each message carries ``Nats-Msg-Id`` (the event's
  ``event_id``): a retry of a publish whose ack was lost is dropped by JetStream within
  the stream's duplicate window (2 min by default); consumers are idempotent anyway
  (at-least-once, see :mod:`.jetstream`).
- **Bounded.** At most ``max_entries`` wait; a further :meth:`append` raises
  :class:`~fireflyer.core.errors.ResourceExhausted` (the caller logs what it could not queue).
- A message JetStream *refuses* (an API error, e.g. too large) is retried ``max_refusals``
  times, then dropped and logged as ``bus.outbox_dropped``, so one bad message cannot
  block the queue for ever.  A connection loss, a timeout or a missing stream is retried
  for ever.

The decisions (what to send next, how long to wait, when to give up) are pure functions
(:func:`plan_next`, :func:`after_failure`) tested without a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec
import nats.errors
import nats.js.errors

from fireflyer.core.errors import ResourceExhausted, Unavailable
from fireflyer.core.log import get_logger

from .backoff import backoff_delay
from .events import Event, encode
from .jetstream import MSG_ID_HEADER
from .tracing import outgoing_headers

if TYPE_CHECKING:
    from .connection import Bus

__all__ = [
    "Outbox",
    "OutboxEntry",
    "OutboxStats",
    "SendPlan",
    "FailureVerdict",
    "plan_next",
    "after_failure",
    "MemoryStore",
    "SqliteStore",
]

log = get_logger(__name__)


class OutboxEntry(msgspec.Struct, frozen=True, kw_only=True):
    #: local order (ascending = the order append was called in)
    seq: int
    subject: str
    msg_id: str
    data: bytes
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    added_at: float = 0.0


# ----------------------------------------------------------------------------- decisions (pure)


class SendPlan(msgspec.Struct, frozen=True):
    """What the sender does now: send ``entry``, or wait ``wait_s`` (inf: until woken)."""

    entry: OutboxEntry | None
    wait_s: float


def plan_next(pending: Sequence[OutboxEntry], *, now: float, retry_at: float) -> SendPlan:
    """The oldest entry once ``now`` has reached ``retry_at`` (the end of the last failure's backoff).

    Only the head is ever sent: a later message never overtakes an earlier one.
    """
    if not pending:
        return SendPlan(None, math.inf)
    if now < retry_at:
        return SendPlan(None, retry_at - now)
    return SendPlan(min(pending, key=lambda e: e.seq), 0.0)


class FailureVerdict(msgspec.Struct, frozen=True):
    #: give the head up (it was refused too often); the next entry goes at once
    drop: bool
    #: how long to wait before the next attempt
    delay_s: float


def after_failure(failures: int, refusals: int, *, base_s: float, cap_s: float, max_refusals: int,
                  jitter: float = 0.2) -> FailureVerdict:
    """After the head failed for the ``failures``-th time in a row (``refusals`` of them refusals
    by JetStream): drop it, or wait how long.  Connection losses and timeouts never drop."""
    if refusals >= max_refusals:
        return FailureVerdict(True, 0.0)
    return FailureVerdict(False, min(cap_s, backoff_delay(max(failures - 1, 0), base_s, cap_s, jitter=jitter)))


# ----------------------------------------------------------------------------- stores


class OutboxStore(Protocol):
    def load(self) -> list[OutboxEntry]: ...
    def add(self, entry: OutboxEntry) -> None: ...
    def remove(self, seq: int) -> None: ...
    def close(self) -> None: ...


class MemoryStore:
    """Keeps nothing beyond the process (the outbox's deque is the only copy)."""

    def load(self) -> list[OutboxEntry]:
        return []

    def add(self, entry: OutboxEntry) -> None:
        pass

    def remove(self, seq: int) -> None:
        pass

    def close(self) -> None:
        pass


_SCHEMA = """CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY, subject TEXT NOT NULL, msg_id TEXT NOT NULL, data BLOB NOT NULL,
    headers TEXT NOT NULL, added_at REAL NOT NULL)"""


class SqliteStore:
    """One small SQLite file; every add is committed before :meth:`Outbox.append` returns.

    Used under the outbox's lock only (one connection shared across threads)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_SCHEMA)

    def load(self) -> list[OutboxEntry]:
        rows = self._db.execute("SELECT seq, subject, msg_id, data, headers, added_at FROM outbox ORDER BY seq")
        return [OutboxEntry(seq=s, subject=subj, msg_id=mid, data=bytes(d), headers=msgspec.json.decode(h),
                            added_at=at) for s, subj, mid, d, h, at in rows]

    def add(self, entry: OutboxEntry) -> None:
        self._db.execute("INSERT INTO outbox VALUES (?, ?, ?, ?, ?, ?)",
                         (entry.seq, entry.subject, entry.msg_id, entry.data,
                          msgspec.json.encode(entry.headers).decode(), entry.added_at))

    def remove(self, seq: int) -> None:
        self._db.execute("DELETE FROM outbox WHERE seq = ?", (seq,))

    def close(self) -> None:
        self._db.close()


# ----------------------------------------------------------------------------- the outbox


class OutboxStats(msgspec.Struct):
    appended: int = 0
    sent: int = 0
    failures: int = 0
    dropped: int = 0


class Outbox:
    """Durable events queued locally and published to JetStream in order (see the module doc).

    Args:
        bus: the connection to publish on.
        path: SQLite file that keeps unsent messages across restarts; None: memory only.
        max_entries: the most messages waiting at once.
        retry_wait_s, max_retry_wait_s: backoff between attempts at the head.
        attempt_timeout_s: how long one publish waits for JetStream's ack.
        max_refusals: JetStream refusals of one message before it is dropped.
    """

    def __init__(self, bus: Bus, *, path: Path | None = None, name: str = "outbox", max_entries: int = 10_000,
                 retry_wait_s: float = 0.1, max_retry_wait_s: float = 1.0, attempt_timeout_s: float = 2.0,
                 max_refusals: int = 5) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.bus = bus
        self.name = name
        self.path = path
        self.max_entries = max_entries
        self.retry_wait_s = retry_wait_s
        self.max_retry_wait_s = max_retry_wait_s
        self.attempt_timeout_s = attempt_timeout_s
        self.max_refusals = max_refusals
        self.stats = OutboxStats()
        self._lock = threading.Lock()
        self._store: OutboxStore = SqliteStore(path) if path is not None else MemoryStore()
        self._pending: deque[OutboxEntry] = deque(self._store.load())
        self._next_seq = (self._pending[-1].seq + 1) if self._pending else 1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        if self._pending:
            log.info("bus.outbox_loaded", outbox=name, pending=len(self._pending), path=str(path))

    # -- producer side (any thread) -------------------------------------------

    def append(self, subject: str, event: Event, *, headers: Mapping[str, str] | None = None) -> int:
        """Queue ``event`` for ``subject``; returns its local sequence number.  Thread-safe; it is
        stored (and, with a ``path``, on disk) when this returns.

        Raises:
            ResourceExhausted: ``max_entries`` messages are already waiting.
            Unavailable: the outbox was stopped (its service is shutting down).
        """
        hdrs = dict(outgoing_headers(headers) or {})
        data = encode(event)
        with self._lock:
            if self._closed:
                raise Unavailable(f"outbox {self.name} is stopped (its service is shutting down); "
                                  f"{subject} was not queued", outbox=self.name, subject=subject)
            if len(self._pending) >= self.max_entries:
                raise ResourceExhausted(
                    f"outbox {self.name} is full ({self.max_entries} unsent messages): NATS has been "
                    f"unreachable for a while; check `ff status` and the nats log",
                    outbox=self.name, subject=subject, max_entries=self.max_entries)
            entry = OutboxEntry(seq=self._next_seq, subject=subject, msg_id=event.event_id, data=data, headers=hdrs,
                                added_at=time.time())
            self._store.add(entry)
            self._pending.append(entry)
            self._next_seq += 1
            self.stats.appended += 1
        self._poke()
        return entry.seq

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: start() will find the entry
            loop.call_soon_threadsafe(wake.set)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def pending_ids(self) -> list[str]:
        with self._lock:
            return [e.msg_id for e in self._pending]

    # -- sender side (the bus's event loop) -------------------------------------

    async def start(self) -> None:
        if self._closed:
            raise Unavailable(f"outbox {self.name} was stopped; make a new one", outbox=self.name)
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"bus.outbox.{self.name}")

    async def wait_empty(self, timeout_s: float) -> bool:
        """Until everything queued so far is acknowledged (True) or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while self.pending:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)  # polling our own counter with a deadline
        return True

    async def stop(self, drain_s: float = 0.0) -> None:
        """Stop sending (after up to ``drain_s`` of trying to empty the queue); the store closes."""
        if drain_s > 0 and self._task is not None:
            await self.wait_empty(drain_s)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        left = self.pending
        if left:
            log.warning("bus.outbox_unsent", outbox=self.name, pending=left,
                        note="kept in " + str(self.path) if self.path else "lost: the outbox has no file")
        with self._lock:
            self._closed = True
            self._store.close()

    def _head(self) -> list[OutboxEntry]:
        with self._lock:
            return [self._pending[0]] if self._pending else []

    async def _run(self) -> None:
        assert self._wake is not None
        failures = refusals = 0
        retry_at = 0.0
        while True:
            self._wake.clear()  # before looking: an append after the look sets it again
            plan = plan_next(self._head(), now=time.monotonic(), retry_at=retry_at)
            if plan.entry is None:
                with contextlib.suppress(TimeoutError):
                    wait = None if math.isinf(plan.wait_s) else plan.wait_s
                    await asyncio.wait_for(self._wake.wait(), wait)
                continue
            entry = plan.entry
            refused = False
            try:
                ack = await self.bus.js.publish(entry.subject, entry.data, timeout=self.attempt_timeout_s,
                                                headers={**entry.headers, MSG_ID_HEADER: entry.msg_id})
            except nats.js.errors.APIError as e:
                refused, why = True, f"{e.description} (err_code {e.err_code})"
            except (nats.errors.Error, TimeoutError, OSError) as e:
                why = str(e) or type(e).__name__
            except Exception as e:  # noqa: BLE001 -- anything else: the sender must live on and retry
                why = repr(e)
                log.exception("bus.outbox_publish_error", outbox=self.name, subject=entry.subject, error=why)
            else:
                self._remove(entry)
                self.stats.sent += 1
                failures = refusals = 0
                retry_at = 0.0
                log.debug("bus.outbox_sent", outbox=self.name, subject=entry.subject, msg_id=entry.msg_id,
                          seq=int(ack.seq), duplicate=bool(getattr(ack, "duplicate", False)))
                continue
            failures += 1
            refusals += refused
            self.stats.failures += 1
            verdict = after_failure(failures, refusals, base_s=self.retry_wait_s, cap_s=self.max_retry_wait_s,
                                    max_refusals=self.max_refusals)
            if verdict.drop:
                self._remove(entry)
                self.stats.dropped += 1
                failures = refusals = 0
                retry_at = 0.0
                log.error("bus.outbox_dropped", outbox=self.name, subject=entry.subject, msg_id=entry.msg_id,
                          error=why, note=f"JetStream refused it {self.max_refusals} times")
                continue
            # the first failure of an outage is worth a line; the retries are not
            (log.warning if failures == 1 else log.debug)(
                "bus.outbox_retrying", outbox=self.name, subject=entry.subject, msg_id=entry.msg_id,
                pending=self.pending, attempt=failures, error=why)
            retry_at = time.monotonic() + verdict.delay_s

    def _remove(self, entry: OutboxEntry) -> None:
        with self._lock:
            if self._pending and self._pending[0].seq == entry.seq:
                self._pending.popleft()
            self._store.remove(entry.seq)

    def __repr__(self) -> str:
        return f"Outbox({self.name!r}, pending={self.pending}, path={str(self.path) if self.path else None!r})"
