"""KV store fixtures: one per backend, and ``kv_store`` parametrized over both.

``kv_store`` is the fixture the contract suite uses: its ids are ``sqlite`` and
``postgres``; the PostgreSQL one lives in a fresh ``pg_schema`` (so it fails under
``CI=true`` when PostgreSQL is missing, like every PostgreSQL test).  Backoff is
shortened so retry-heavy tests stay fast.  ``kv_url`` gives the URL instead, for
tests that open the store themselves (several processes, reopen).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fireflyer.kv import KV, open_kv

__all__ = ["sqlite_kv", "postgres_kv", "kv_store", "kv_url", "FAST_RETRY"]

#: options that keep retry loops short in tests
FAST_RETRY = {"backoff_base_s": 0.001, "backoff_max_s": 0.02}


def _sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/kv.db"


def _pg_url(dsn: str, schema: str) -> str:
    """A URL naming the schema (``FF_TEST_PG_DSN`` must be a URL, not key=value pairs)."""
    return f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"


@pytest.fixture
def sqlite_kv(tmp_path: Path) -> Iterator[KV]:
    kv = open_kv(_sqlite_url(tmp_path), **FAST_RETRY)
    yield kv
    kv.close()


@pytest.fixture
def postgres_kv(pg_dsn: str, pg_schema: str) -> Iterator[KV]:
    kv = open_kv(pg_dsn, schema=pg_schema, **FAST_RETRY)
    yield kv
    kv.close()


@pytest.fixture(params=["sqlite", "postgres"])
def kv_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return _sqlite_url(tmp_path)
    return _pg_url(request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema"))


@pytest.fixture(params=["sqlite", "postgres"])
def kv_store(request: pytest.FixtureRequest) -> Iterator[KV]:
    yield request.getfixturevalue(f"{request.param}_kv")
