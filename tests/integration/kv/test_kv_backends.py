"""Backend behaviour that needs real processes or a real server: several processes on one
store, PostgreSQL connections dying around COMMIT, and concurrent table creation."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from fireflyer.kv import KV, CommitUnknown, KVUnavailable, open_kv

pytestmark = pytest.mark.postgres

_WORKER = """
import sys, threading
from fireflyer.kv import open_kv
kv = open_kv(sys.argv[1], backoff_base_s=0.001, backoff_max_s=0.05)
def incr(t):
    n = int.from_bytes(t.get(b"ctr") or b"\\0", "big") + 1
    t.set(b"ctr", n.to_bytes(8, "big"))
def idem(t):
    n = int.from_bytes(t.get(b"idem") or b"\\0", "big") + 1
    t.set(b"idem", n.to_bytes(8, "big"))
    return n
def work(w):
    for i in range(int(sys.argv[2])):
        kv.run(incr, max_retries=1000)
        kv.run(idem, idempotency_key=f"{sys.argv[3]}-{w}-{i}".encode(), max_retries=1000)
ths = [threading.Thread(target=work, args=(w,)) for w in range(2)]
[t.start() for t in ths]
[t.join() for t in ths]
kv.close()
"""


def test_two_processes_increment_exactly(kv_url: str) -> None:
    per_thread = 30
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, kv_url, str(per_thread), f"p{i}"], stderr=subprocess.PIPE
        )
        for i in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()[-2000:]
    with open_kv(kv_url) as kv:
        got = kv.run(lambda t: [int.from_bytes(t.get(k) or b"\0", "big") for k in (b"ctr", b"idem")])
    assert got == [2 * 2 * per_thread] * 2


def test_sqlite_processes_see_each_others_conflicts(tmp_path: Path) -> None:
    """A reader in this process conflicts with a writer in another process."""
    url = f"sqlite:///{tmp_path}/kv.db"
    with open_kv(url) as kv:
        t = kv.begin()
        assert t.get(b"ctr") is None
        t.set(b"mine", b"1")
        subprocess.run([sys.executable, "-c", _WORKER, url, "1", "x"], check=True, timeout=60)
        with pytest.raises(Exception) as ei:
            t.commit()
        assert ei.value.kind == "KVConflict" and ei.value.key == str(b"ctr")


def _terminate_later(dsn: str, pid: int, after_s: float) -> threading.Thread:
    def kill() -> None:
        time.sleep(after_s)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))

    th = threading.Thread(target=kill)
    th.start()
    return th


def test_postgres_connection_lost_during_commit_is_commit_unknown(postgres_kv: KV, pg_dsn: str) -> None:
    kv = postgres_kv
    t = kv.begin()
    t.get(b"k")
    t.set(b"k", b"v")
    pid = t._conn.info.backend_pid  # type: ignore[attr-defined]
    kv.faults.inject("slow_commit", delay_s=0.5)  # writes are sent, COMMIT not yet
    killer = _terminate_later(pg_dsn, pid, 0.1)
    with pytest.raises(CommitUnknown) as ei:
        t.commit()
    killer.join()
    assert not ei.value.fields.get("injected")
    assert kv.run(lambda t2: t2.get(b"k")) is None  # this time the server had not committed


def test_postgres_connection_lost_before_commit_is_retried(postgres_kv: KV, pg_dsn: str) -> None:
    kv = postgres_kv
    calls: list[int] = []

    def fn(t) -> None:
        calls.append(1)
        t.get(b"k")
        if len(calls) == 1:
            pid = t._conn.info.backend_pid
            with psycopg.connect(pg_dsn, autocommit=True) as c:
                c.execute("SELECT pg_terminate_backend(%s)", (pid,))
        t.set(b"k", b"v")

    kv.run(fn)  # the first attempt's commit fails before COMMIT: KVUnavailable, retried
    assert len(calls) == 2 and kv.run(lambda t: t.get(b"k")) == b"v"
    t = kv.begin()
    t.get(b"k")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(%s)", (t._conn.info.backend_pid,))  # type: ignore[attr-defined]
    with pytest.raises(KVUnavailable):
        t.get(b"other")
    t.rollback()


def test_postgres_concurrent_open_creates_schema_once(pg_dsn: str, pg_schema: str) -> None:
    schema = pg_schema + "_new"  # not yet created: every opener races on CREATE SCHEMA/TABLE
    errors: list[BaseException] = []
    kvs: list[KV] = []

    def opener() -> None:
        try:
            kvs.append(open_kv(pg_dsn, schema=schema))
        except BaseException as e:
            errors.append(e)

    try:
        ths = [threading.Thread(target=opener) for _ in range(8)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        assert not errors, errors[:1]
        kvs[0].run(lambda t: t.set(b"a", b"1"))
        assert kvs[-1].run(lambda t: t.get(b"a")) == b"1"
    finally:
        for kv in kvs:
            kv.close()
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_postgres_bytea_ordering_matches_sqlite(postgres_kv: KV, sqlite_kv: KV) -> None:
    import random

    rng = random.Random(11)
    keys = sorted(
        {
            bytes(rng.choice(b"\x00\x01\x7f\x80\xfe\xff") for _ in range(rng.randrange(0, 5)))
            for _ in range(200)
        }
    )
    keys = [k for k in keys if not k.startswith(b"\xff")]
    for kv in (postgres_kv, sqlite_kv):
        kv.run(lambda t, kv=kv: [t.set(k, b"") for k in keys])
    pg = [k for k, _ in postgres_kv.run(lambda t: t.get_range(b"", b"\xff"))]
    lite = [k for k, _ in sqlite_kv.run(lambda t: t.get_range(b"", b"\xff"))]
    assert pg == lite == keys


async def test_aopen_kv_retries_until_the_store_answers_then_gives_up(tmp_path, monkeypatch):
    """Services open their store with aopen_kv: unavailable at first, then fine; or never."""
    import pytest

    from fireflyer.kv import KVUnavailable, aopen_kv, opener

    real = opener.open_kv
    calls = {"n": 0}

    def flaky(url, **kw):
        calls["n"] += 1
        if calls["n"] < 3:
            raise KVUnavailable("not yet", path=url)
        return real(url, **kw)

    monkeypatch.setattr(opener, "open_kv", flaky)
    kv = await aopen_kv(f"sqlite:///{tmp_path / 'a.db'}", wait_s=5)
    kv.close()
    assert calls["n"] == 3

    def never(url, **kw):
        raise KVUnavailable("down", path=url)

    monkeypatch.setattr(opener, "open_kv", never)
    with pytest.raises(KVUnavailable):
        await aopen_kv("postgresql://u:secret@127.0.0.1:1/x", wait_s=0.2)
    assert opener._redact("postgresql://u:secret@h:1/x") == "postgresql://u@h:1/x"
