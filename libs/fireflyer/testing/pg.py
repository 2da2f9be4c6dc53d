"""PostgreSQL for tests: a DSN from ``FF_TEST_PG_DSN`` and a schema per test.

The default DSN is the machine's server (``postgresql://postgres@127.0.0.1:5432/test``).
Outside CI an unreachable server skips the test with the reason; under
``CI=true`` it fails instead, because CI must run the PostgreSQL tests.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

__all__ = ["DEFAULT_PG_DSN", "pg_dsn_from_env", "pg_dsn", "pg_schema", "in_ci"]

DEFAULT_PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pg_dsn_from_env() -> str:
    return os.environ.get("FF_TEST_PG_DSN") or DEFAULT_PG_DSN


def _reachable(dsn: str) -> str | None:
    """None if a connection works, else the reason."""
    try:
        import psycopg
    except ImportError as e:  # psycopg is a dev dependency
        return f"psycopg is not installed ({e}); run `make setup`"
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except Exception as e:
        return f"PostgreSQL at {dsn} is not reachable: {e}"
    return None


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """A DSN that answers; skips (or, under CI=true, fails) when there is none."""
    dsn = pg_dsn_from_env()
    reason = _reachable(dsn)
    if reason:
        if in_ci():
            pytest.fail(f"{reason} (CI=true: PostgreSQL tests must run; set FF_TEST_PG_DSN)")
        pytest.skip(reason)
    return dsn


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A fresh schema name for one test, dropped afterwards (tests never share tables)."""
    import psycopg

    name = f"fft_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
