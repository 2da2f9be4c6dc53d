"""Exponential backoff with jitter, for reconnects and JetStream redeliveries."""

from __future__ import annotations

import random

__all__ = ["backoff_delay"]


def backoff_delay(attempt: int, first_s: float, max_s: float, *, jitter: float = 0.2) -> float:
    """``first_s * 2**attempt`` capped at ``max_s``, spread by +-``jitter`` (a fraction).

    The jitter keeps a fleet of clients that lost the same server from
    retrying in lock step.
    """
    base = min(max_s, first_s * (2 ** min(max(attempt, 0), 30)))
    return max(0.0, base * (1.0 + random.uniform(-jitter, jitter)))
