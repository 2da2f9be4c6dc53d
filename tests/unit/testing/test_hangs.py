"""The hang reporter: a test stopped by pytest-timeout prints where its asyncio tasks wait."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

from fireflyer.testing.hangs import await_chain, describe_tasks

HUNG_TEST = textwrap.dedent("""
    import asyncio
    import pytest

    async def stuck_on(event):
        await event.wait()

    @pytest.mark.timeout(1)
    async def test_hangs():
        event = asyncio.Event()
        side = asyncio.create_task(asyncio.sleep(3600), name="sleeper")
        try:
            await stuck_on(event)
        finally:
            side.cancel()
""")


def test_a_hung_asyncio_test_names_the_await_it_is_stuck_on(tmp_path: Path) -> None:
    (tmp_path / "test_hung.py").write_text(HUNG_TEST)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "fireflyer.testing.hangs", "-o", "asyncio_mode=auto",
         "-p", "no:cacheprovider", "-q", str(tmp_path / "test_hung.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "asyncio tasks at the timeout" in out, out
    # the test's own task, down through the helper coroutine to Event.wait, with file and line
    assert "test_hung.py:6 in stuck_on" in out, out
    assert "in Event.wait" in out, out
    assert "waiting on <Future pending" in out, out
    # the other task of the loop too
    assert "task sleeper" in out and "in sleep" in out, out
    assert "Timeout (>1.0s)" in out, out


async def test_describe_tasks_follows_each_task_to_its_leaf() -> None:
    gate = asyncio.Event()

    async def inner():
        await gate.wait()

    async def outer():
        await inner()

    task = asyncio.create_task(outer(), name="outer-task")
    await asyncio.sleep(0)
    try:
        chain = list(await_chain(task.get_coro()))
        assert [link.rsplit(" in ", 1)[-1] for link in chain[:3]] == [
            "test_describe_tasks_follows_each_task_to_its_leaf.<locals>.outer",
            "test_describe_tasks_follows_each_task_to_its_leaf.<locals>.inner",
            "Event.wait"]
        assert len(chain) == 3
        lines = describe_tasks(asyncio.get_running_loop())
        at = next(i for i, line in enumerate(lines) if line.startswith("task outer-task"))
        assert lines[at + 4].startswith("    waiting on <Future pending")
        assert lines[-1].startswith("2 task(s)")  # this test's own task and outer-task
    finally:
        task.cancel()
