"""SQLite: ``KV.nonblocking()`` (fail fast instead of waiting), the writer's own lock wait,
and the background checkpoint that keeps the WAL from growing."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from fireflyer.kv import KVTimeout, KVWouldBlock, open_kv
from fireflyer.kv import sqlite as sqlite_backend
from fireflyer.kv.sqlite import SqliteKV


def _hold_write_lock(path: str) -> sqlite3.Connection:
    """Another "process": a plain connection holding SQLite's write lock."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def test_nonblocking_commit_fails_fast_when_another_process_holds_the_lock(tmp_path: Path) -> None:
    with open_kv(f"sqlite:///{tmp_path}/kv.db") as kv:
        assert kv.supports_nonblocking
        holder = _hold_write_lock(f"{tmp_path}/kv.db")
        try:
            t0 = time.monotonic()
            with pytest.raises(KVWouldBlock) as info, kv.nonblocking():
                kv.run(lambda t: t.set(b"a", b"1"))
            assert time.monotonic() - t0 < 0.5
            assert isinstance(info.value, KVTimeout)  # a timeout to code that does not know the subclass
            # nothing of the attempt was applied; reads still work while the lock is held
            assert kv.run(lambda t: t.get(b"a")) is None
        finally:
            holder.rollback()
            holder.close()
        with kv.nonblocking():
            kv.run(lambda t: t.set(b"a", b"1"))
        assert kv.run(lambda t: t.get(b"a")) == b"1"


def test_blocking_commit_waits_for_the_lock_with_short_sleeps(tmp_path: Path) -> None:
    with open_kv(f"sqlite:///{tmp_path}/kv.db") as kv:
        holder = _hold_write_lock(f"{tmp_path}/kv.db")
        timer = threading.Timer(0.05, lambda: (holder.rollback(), holder.close()))
        timer.start()
        try:
            t0 = time.monotonic()
            kv.run(lambda t: t.set(b"a", b"1"))
            assert time.monotonic() - t0 >= 0.04
        finally:
            timer.join()
        assert kv.run(lambda t: t.get(b"a")) == b"1"


def test_blocking_commit_times_out_after_busy_timeout(tmp_path: Path) -> None:
    with SqliteKV(f"{tmp_path}/kv.db", busy_timeout_s=0.1) as kv:
        holder = _hold_write_lock(f"{tmp_path}/kv.db")
        try:
            with pytest.raises(KVTimeout):
                kv.run(lambda t: t.set(b"a", b"1"))
        finally:
            holder.rollback()
            holder.close()


def test_nonblocking_run_does_not_retry_and_applies_nothing(tmp_path: Path) -> None:
    with open_kv(f"sqlite:///{tmp_path}/kv.db") as kv:
        calls = []

        def fn(t):  # type: ignore[no-untyped-def]
            calls.append(1)
            t.set(b"k", b"v")

        kv.faults.inject("conflict", times=1)
        with pytest.raises(KVWouldBlock) as info, kv.nonblocking():
            kv.run(fn)
        assert len(calls) == 1 and info.value.fields["last_error"] == "KVConflict"
        assert kv.run(lambda t: t.get(b"k")) is None
        # outside the block the same call retries as before
        kv.faults.inject("conflict", times=1)
        kv.run(fn)
        assert len(calls) == 3 and kv.run(lambda t: t.get(b"k")) == b"v"


def test_nonblocking_is_per_thread_and_nests(tmp_path: Path) -> None:
    with open_kv(f"sqlite:///{tmp_path}/kv.db") as kv:
        seen: list[bool] = []
        with kv.nonblocking():
            with kv.nonblocking():
                pass
            assert kv._nonblocking_now()
            t = threading.Thread(target=lambda: seen.append(kv._nonblocking_now()))
            t.start()
            t.join()
        assert seen == [False] and not kv._nonblocking_now()


def test_nonblocking_commit_fails_fast_when_another_thread_is_committing(tmp_path: Path) -> None:
    with open_kv(f"sqlite:///{tmp_path}/kv.db") as kv:
        assert isinstance(kv, SqliteKV)
        with kv._commit_lock:
            with pytest.raises(KVWouldBlock), kv.nonblocking():
                kv.run(lambda t: t.set(b"a", b"1"))
        assert kv.run(lambda t: t.get(b"a")) is None


def test_wal_stays_bounded_under_steady_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Background RESTART checkpoints let the WAL start over instead of growing (with
    PASSIVE ones only the WAL keeps growing while commits keep coming)."""
    monkeypatch.setattr(sqlite_backend, "_CHECKPOINT_EVERY", 50)
    path = f"{tmp_path}/kv.db"
    with open_kv(f"sqlite:///{path}") as kv:
        for i in range(1500):
            kv.run(lambda t, i=i: [t.set(f"k{i}-{j}".encode(), os.urandom(200)) for j in range(4)])
            if i % 50 == 49:
                time.sleep(0.01)  # give the checkpoint thread a moment, as real traffic would
        wal = os.path.getsize(path + "-wal")
        assert wal < 8 * 1024 * 1024, wal
        assert kv.run(lambda t: len(t.get_range(b"k", b"l"))) == 6000
    with open_kv(f"sqlite:///{path}") as kv:  # reopened: everything is there
        assert kv.run(lambda t: len(t.get_range(b"k", b"l"))) == 6000
