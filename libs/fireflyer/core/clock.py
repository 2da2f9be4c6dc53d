"""An injectable clock, so decision logic can be tested with time passed in.

Code that needs the time takes a ``Clock``; production passes ``SystemClock``,
tests pass ``ManualClock`` and call ``advance``.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock", "ManualClock", "SYSTEM_CLOCK"]


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch (for records, leases across hosts)."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds (for timeouts and intervals inside one process)."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told to; thread safe."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._t = start
        self._mono = 0.0
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self._t

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        with self._lock:
            self._t += seconds
            self._mono += seconds


SYSTEM_CLOCK = SystemClock()
