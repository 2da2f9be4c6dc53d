"""Fault injection at commit, so tests can exercise conflict, unknown-result and slow paths.

Every KV has ``kv.faults``; a test arms faults and the next matching commits fire them::

    kv.faults.inject("conflict", times=2)                     # next two commits conflict
    kv.faults.inject("unknown_result", key=b"counter")        # commit applies, caller hears "unknown"
    kv.faults.inject("unknown_result_not_committed", nth=3)   # the 3rd commit from now: not applied
    kv.faults.inject("slow_commit", delay_s=0.2, match=lambda c: not c.read_only)

Kinds:

- ``conflict``: the commit is rolled back and raises ``KVConflict(injected=True)``.
- ``unknown_result``: the commit **is applied**, then ``CommitUnknown`` is raised: the
  dangerous case, where a blind retry would apply the transaction twice.
- ``unknown_result_not_committed``: rolled back, then ``CommitUnknown``.
- ``slow_commit``: the backend sleeps ``delay_s`` inside its commit, holding its locks
  (SQLite: the write lock; PostgreSQL: the row locks, before ``COMMIT``).

Internal transactions (idempotency-record GC) never consume faults.  A fault is keyed
like torchft's injectors: by position (``skip`` matching commits first, or ``nth``
commit counted from when it was armed) and by content (``key`` in the write set,
or any ``match`` predicate on :class:`CommitInfo`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from .errors import KVInvalidArgument

__all__ = ["FaultKind", "CommitInfo", "Fault", "FaultInjector"]

FaultKind = Literal["conflict", "unknown_result", "unknown_result_not_committed", "slow_commit"]
_KINDS = ("conflict", "unknown_result", "unknown_result_not_committed", "slow_commit")


@dataclass(frozen=True)
class CommitInfo:
    """What a fault predicate sees about one commit."""

    number: int  # 1-based count of (non-internal) commits on this KV object
    set_keys: tuple[bytes, ...]
    clear_ranges: tuple[tuple[bytes, bytes], ...]

    @property
    def read_only(self) -> bool:
        return not self.set_keys and not self.clear_ranges

    def writes(self, key: bytes) -> bool:
        """True if this commit sets or clears ``key``."""
        return key in self.set_keys or any(b <= key < e for b, e in self.clear_ranges)


@dataclass
class Fault:
    kind: FaultKind
    times: int | None = 1  # None: fire on every matching commit until removed
    skip: int = 0  # let this many matching commits pass first
    nth: int | None = None  # only the nth commit counted from arming (1-based)
    key: bytes | None = None  # only commits that write this key
    match: Callable[[CommitInfo], bool] | None = None
    delay_s: float = 0.0
    armed_at: int = 0
    fired: int = 0
    seen: int = field(default=0, repr=False)

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.fired >= self.times

    def _matches(self, info: CommitInfo) -> bool:
        if self.nth is not None and info.number - self.armed_at != self.nth:
            return False
        if self.key is not None and not info.writes(self.key):
            return False
        return self.match is None or bool(self.match(info))


class FaultInjector:
    """Thread-safe list of armed faults; the KV asks :meth:`take` at each commit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._commits = 0
        #: (kind, commit number) of every fault that fired, for assertions
        self.fired: list[tuple[str, int]] = []

    def inject(
        self,
        kind: FaultKind,
        *,
        times: int | None = 1,
        skip: int = 0,
        nth: int | None = None,
        key: bytes | None = None,
        match: Callable[[CommitInfo], bool] | None = None,
        delay_s: float = 0.0,
    ) -> Fault:
        if kind not in _KINDS:
            raise KVInvalidArgument(f"unknown fault kind {kind!r}; expected one of {_KINDS}", kind=kind)
        if kind == "slow_commit" and delay_s <= 0:
            raise KVInvalidArgument("slow_commit needs delay_s > 0", delay_s=delay_s)
        with self._lock:
            fault = Fault(kind, times, skip, nth, key, match, delay_s, armed_at=self._commits)
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def pending(self) -> list[Fault]:
        with self._lock:
            return [f for f in self._faults if not f.exhausted]

    def take(
        self, set_keys: tuple[bytes, ...], clear_ranges: tuple[tuple[bytes, bytes], ...]
    ) -> Fault | None:
        """Count one commit and return the first armed fault it fires, if any."""
        with self._lock:
            self._commits += 1
            if not self._faults:
                return None
            info = CommitInfo(self._commits, set_keys, clear_ranges)
            for f in self._faults:
                if f.exhausted or not f._matches(info):
                    continue
                f.seen += 1
                if f.seen <= f.skip:
                    continue
                f.fired += 1
                self.fired.append((f.kind, info.number))
                self._faults = [g for g in self._faults if not g.exhausted]
                return f
            return None
