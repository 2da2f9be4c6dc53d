"""pytest plugin: when pytest-timeout stops a hung test, say where its asyncio tasks wait.

pytest-timeout's signal method prints every *thread's* stack, but an asyncio test that hangs
shows only its event loop idle in ``select``: the coroutine that will never resume is not on
any thread's stack.  This plugin wraps that handler and first prints, for every task of the
loop running in the main thread, the chain of awaits from the task's coroutine down to what
it is suspended on (a future, a sleep, a gRPC call), with file and line for each coroutine.

Listed in ``tests/conftest.py``'s ``pytest_plugins``; it does nothing unless a timeout fires.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["await_chain", "describe_tasks"]

#: how deep to follow one task's awaits (a chain longer than this is cut, and says so)
MAX_DEPTH = 40


def _frame_line(frame: Any, name: str) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {name}"


def await_chain(awaitable: Any) -> Iterator[str]:
    """One line per coroutine from ``awaitable`` down the chain of awaits, where each is suspended.

    Coroutines, generator-based awaitables and async generators give ``file:line in name``;
    a leaf that is neither (an extension type's awaitable, say) gives its repr.  asyncio's own
    future iterator ends the chain silently: the task's waiter names the future instead.
    """
    obj = awaitable
    for _ in range(MAX_DEPTH):
        if obj is None or type(obj).__name__ == "FutureIter":
            return
        frame = next((getattr(obj, a) for a in ("cr_frame", "gi_frame", "ag_frame") if hasattr(obj, a)), None)
        awaited = next((getattr(obj, a) for a in ("cr_await", "gi_await", "ag_await") if hasattr(obj, a)), None)
        name = getattr(obj, "__qualname__", type(obj).__qualname__)
        if frame is not None:
            yield _frame_line(frame, name)
        elif awaited is None:
            yield f"waiting in {obj!r}"[:400]
            return
        else:
            yield f"{name} (no frame)"
        obj = awaited
    yield f"... (cut at {MAX_DEPTH} links)"


def describe_tasks(loop: asyncio.AbstractEventLoop) -> list[str]:
    """Lines describing every unfinished task of ``loop`` and where each one waits."""
    lines: list[str] = []
    tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
    for task in tasks:
        lines.append(f"task {task.get_name()} ({task.get_coro().__qualname__})")  # type: ignore[union-attr]
        lines.extend(f"    {link}" for link in await_chain(task.get_coro()))
        waiter = getattr(task, "_fut_waiter", None)  # what the task's next step waits for
        if waiter is not None:
            lines.append(f"    waiting on {waiter!r}"[:400])
    timers = sorted(getattr(loop, "_scheduled", []), key=lambda h: h.when())
    lines.append(f"{len(tasks)} task(s); {len(timers)} timer(s) scheduled"
                 + (f", the next in {timers[0].when() - loop.time():.1f}s: {timers[0]!r}"[:300] if timers else ""))
    return lines


@pytest.hookimpl(wrapper=True, optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> Iterator[None]:
    """After pytest-timeout sets its SIGALRM handler, put ours in front of it."""
    result = yield
    if settings.method != "signal":
        return result
    inner = signal.getsignal(signal.SIGALRM)
    if not callable(inner):
        return result

    def handler(signum: int, frame: Any) -> None:
        __tracebackhide__ = True
        # the handler runs in the main thread between two bytecodes of whatever ran: inside an
        # asyncio test that is the loop's select(), so the running loop is the test's
        loop = asyncio._get_running_loop()
        if loop is not None:
            terminal = item.config.get_terminal_writer()
            terminal.sep("+", title="asyncio tasks at the timeout")
            try:
                for line in describe_tasks(loop):
                    terminal.line(line)
            except Exception as exc:  # diagnostics must never hide the timeout itself
                terminal.line(f"(could not list the tasks: {exc!r})")
            terminal.flush()
        inner(signum, frame)

    signal.signal(signal.SIGALRM, handler)
    return result
