"""Log a wait for something the cluster will provide soon: INFO first, WARNING if it lasts.

A cluster coming up (or failing over) makes its services wait for one another: a heartbeat
before mgmtd has a primary, a routing pull before storage made the chain tables.  Such a
failure is normal life for a while, and a WARNING means a person should look, so::

    patience = Patience(log, "storage.heartbeat_failed", grace_s=30.0)
    while True:
        try:
            send_heartbeat()
        except FireFlyerError as e:
            patience.failed(e)        # INFO (a new reason) or DEBUG (the same again) ...
        else:
            patience.ok()             # ... WARNING once failures have lasted grace_s

Within ``grace_s`` of the first failure of a run of failures, each new reason is logged once
at INFO and repeats at DEBUG.  After it the run escalates: WARNING (with ``waited_s``) at the
first failure past the grace, at each new reason, and again every ``repeat_s`` for the same
one; DEBUG in between.  ``ok()`` ends the run; one that had escalated logs the recovery at
INFO (``storage.heartbeat_failed`` -> ``storage.heartbeat_recovered``).  The time comes from ``clock`` (monotonic seconds), so tests drive it by hand.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .log import EventLogger

__all__ = ["Patience", "DEFAULT_GRACE_S"]

#: how long a failure may last before it is a warning (a local cluster forms in a few seconds)
DEFAULT_GRACE_S = 30.0


class Patience:
    """One wait's log lines; see the module docs.  Not thread-safe: one loop owns it."""

    def __init__(self, log: EventLogger, event: str, *, grace_s: float = DEFAULT_GRACE_S,
                 repeat_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        self.log = log
        self.event = event
        self.grace_s = grace_s
        self.repeat_s = grace_s if repeat_s is None else repeat_s
        self.clock = clock
        #: when the current run of failures began (None: not failing)
        self.since: float | None = None
        self.failures = 0
        self._said = ""
        self._warned_at: float | None = None

    @property
    def escalated(self) -> bool:
        return self._warned_at is not None

    def level(self, reason: str, now: float | None = None) -> int:
        """The level :meth:`failed` would log ``reason`` at now (no state change)."""
        now = self.clock() if now is None else now
        since = now if self.since is None else self.since
        if now - since < self.grace_s:
            return logging.INFO if reason != self._said else logging.DEBUG
        if self._warned_at is None or reason != self._said or now - self._warned_at >= self.repeat_s:
            return logging.WARNING
        return logging.DEBUG

    def failed(self, error: BaseException | str, **fields: Any) -> int:
        """One more failure; logs it at the level the wait has reached and returns that level."""
        now = self.clock()
        reason = str(error)
        lvl = self.level(reason, now)
        if self.since is None:
            self.since = now
        self.failures += 1
        self._said = reason
        if lvl == logging.WARNING:
            self._warned_at = now
        out = dict(fields)
        out.setdefault("error", reason)
        out["failures"] = self.failures
        out["waited_s"] = round(now - self.since, 3)
        getattr(self.log, logging.getLevelName(lvl).lower())(self.event, **out)
        return lvl

    def ok(self, **fields: Any) -> None:
        """The wait is over; a run that reached WARNING says so at INFO."""
        if self.since is not None and self._warned_at is not None:
            self.log.info(self.event.removesuffix("_failed") + "_recovered", failures=self.failures,
                          waited_s=round(self.clock() - self.since, 3), **fields)
        self.since, self.failures, self._said, self._warned_at = None, 0, "", None
