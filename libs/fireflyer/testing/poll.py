"""Polling with deadlines, instead of sleeps, for tests and start-up waits.

    await wait_for(lambda: len(got) == 3, timeout_s=5, what="3 events delivered")
    wait_until(lambda: path.exists(), timeout_s=5, what="span file written")

On timeout both raise :class:`~fireflyer.core.errors.DeadlineExceeded` naming
``what`` and the last value seen, so a failing test says what it waited for.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fireflyer.core.errors import DeadlineExceeded

__all__ = ["wait_for", "wait_until"]


async def wait_for(
    predicate: Callable[[], Any | Awaitable[Any]],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
    what: str = "condition",
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns a truthy value; return it."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        last = predicate()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() >= deadline:
            raise DeadlineExceeded(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})", what=what)
        await asyncio.sleep(interval_s)


def wait_until(
    predicate: Callable[[], Any],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
    what: str = "condition",
) -> Any:
    """Blocking twin of :func:`wait_for`."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise DeadlineExceeded(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})", what=what)
        time.sleep(interval_s)
