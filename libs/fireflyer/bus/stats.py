"""Counters a :class:`~fireflyer.bus.Bus` keeps about what it received.

In-process numbers, read by tests, ``ff`` status pages and the telemetry
exporter.  Per-subject counters use the concrete subject a message arrived on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["BusStats"]


@dataclass
class BusStats:
    #: messages decoded and handed to a handler
    delivered_total: int = 0
    #: messages whose payload did not decode (logged as ``bus.malformed``)
    malformed_total: int = 0
    malformed: Counter[str] = field(default_factory=Counter)
    #: handler calls that raised (logged as ``bus.handler_failed``)
    handler_errors_total: int = 0
    handler_errors: Counter[str] = field(default_factory=Counter)
    #: JetStream messages given up on after max_deliver failed attempts
    gave_up_total: int = 0
    disconnects: int = 0
    reconnects: int = 0

    def count_delivered(self) -> None:
        self.delivered_total += 1

    def count_malformed(self, subject: str) -> None:
        self.malformed_total += 1
        self.malformed[subject] += 1

    def count_handler_error(self, subject: str) -> None:
        self.handler_errors_total += 1
        self.handler_errors[subject] += 1
