"""pytest plugin: a failed test's report says how each service process it started is doing.

A test against real service processes that fails because one of them died shows, at best, that
process's log stopping short: a death by signal (SIGKILL, SIGSEGV) writes nothing.  This adds a
"service processes" section to the report of a failed setup, call or teardown: each
:class:`~fireflyer.testing.services.ServiceProcess` started since the test's setup began, its
pid, whether it still runs or how it ended, and the last lines of its log.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from fireflyer.testing.services import ServiceProcess, started_processes

__all__ = ["describe"]

_SINCE = pytest.StashKey[float]()
#: log lines shown per process (the whole log stays in its file)
TAIL_LINES = 3


def describe(procs: list[ServiceProcess]) -> str:
    """One block per process: instance, module, pid and state, then its log's last lines."""
    out: list[str] = []
    for p in procs:
        out.append(f"{p.instance} ({p.module}, pid {p.pid}): {p.state()}; log {p.log_path}")
        out.extend(f"    {line}" for line in p.log().splitlines()[-TAIL_LINES:])
    return "\n".join(out)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_SINCE] = time.monotonic()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    since = item.stash.get(_SINCE, None)
    if report.failed and since is not None:
        procs = [p for p in started_processes() if p.started_at >= since]
        if procs:
            report.sections.append(("service processes", describe(procs)))
    return report
