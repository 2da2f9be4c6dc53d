"""Fixtures for scheduler integration tests: replicas in-process over a SQLite (or PostgreSQL) KV."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sched_harness import SchedHarness, Tokens  # noqa: E402


@pytest.fixture
def tokens(tmp_path: Path) -> Tokens:
    return Tokens(tmp_path)


@pytest.fixture
def sched(tmp_path: Path, tokens: Tokens) -> Iterator[Callable[..., SchedHarness]]:
    """``sched(replicas=1, kv_url=None, **section)`` starts replicas over one KV (SQLite under
    tmp_path unless kv_url names another); all are stopped at the end."""
    made: list[SchedHarness] = []

    def start(replicas: int = 1, kv_url: str | None = None, **section: object) -> SchedHarness:
        h = SchedHarness(tmp_path, kv_url or f"sqlite:///{tmp_path}/scheduler.db", tokens, **section)
        made.append(h)
        return h.start(replicas)

    yield start
    for h in made:
        h.close()
