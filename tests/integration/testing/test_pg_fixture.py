import psycopg
import pytest

from fireflyer.testing import pg


@pytest.mark.postgres
def test_pg_dsn_connects_and_schema_is_private(pg_dsn, pg_schema):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{pg_schema}".t (k bytea PRIMARY KEY, v bytea)')
        conn.execute(f'INSERT INTO "{pg_schema}".t VALUES (%s, %s)', (b"a", b"1"))
        assert conn.execute(f'SELECT v FROM "{pg_schema}".t').fetchone()[0] == b"1"


def test_unreachable_server_fails_under_ci(monkeypatch):
    monkeypatch.setenv("FF_TEST_PG_DSN", "postgresql://nobody@127.0.0.1:1/none")
    assert pg._reachable(pg.pg_dsn_from_env()) is not None
    monkeypatch.setenv("CI", "true")
    assert pg.in_ci()
    monkeypatch.setenv("CI", "")
    assert not pg.in_ci()
