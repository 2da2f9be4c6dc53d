"""Waiting for a cluster to do something, for the benchmarks that drive a running local cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fireflyer.core.errors import DeadlineExceeded

__all__ = ["until"]

T = TypeVar("T")


async def until(check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float, *, interval_s: float = 0.05,
                bench: str = "benchmark", hint: str = "") -> T:
    """Poll ``check`` until it returns something truthy; DeadlineExceeded naming ``what`` (and where to
    look, ``hint``) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise DeadlineExceeded(f"{bench}: {what} did not happen within {timeout_s:g} s"
                                   + (f"; see {hint}" if hint else ""), what=what)
        await asyncio.sleep(interval_s)
