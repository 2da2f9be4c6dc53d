"""SQLite backend specifics, URL handling, fault-injector keying and error classes."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from fireflyer.core.errors import Aborted, DeadlineExceeded, Unavailable, error_from_dict
from fireflyer.core.errors import Conflict as CoreConflict
from fireflyer.kv import (
    KV,
    CommitUnknown,
    FaultInjector,
    KVConflict,
    KVError,
    KVInvalidArgument,
    KVTimeout,
    TransactionTooOld,
    open_kv,
)
from fireflyer.kv.sqlite import SqliteKV


def test_memory_url_is_private_temp_file_removed_on_close() -> None:
    kv = open_kv("sqlite://:memory:")
    assert isinstance(kv, SqliteKV)
    path = kv.path
    kv.run(lambda t: t.set(b"a", b"1"))
    assert kv.run(lambda t: t.get(b"a")) == b"1"
    kv.close()
    assert not os.path.exists(path)


def test_url_forms_and_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_kv(f"sqlite:///{tmp_path}/a.db?synchronous=full&max_txn_age_s=5&max_retries=3") as kv:
        assert isinstance(kv, SqliteKV)
        assert kv.path == f"{tmp_path}/a.db" and kv.synchronous == "FULL" and kv.max_txn_age_s == 5.0
        assert kv.max_retries == 3
    monkeypatch.chdir(tmp_path)
    with open_kv("sqlite:///rel.db") as kv:
        kv.run(lambda t: t.set(b"x", b"1"))
    assert (tmp_path / "rel.db").exists()
    for bad in [
        "mysql://x",
        "sqlite://",
        "sqlite:///",
        f"sqlite:///{tmp_path}/b.db?nope=1",
        f"sqlite:///{tmp_path}/c.db?max_retries=many",
        f"sqlite:///{tmp_path}/d.db?synchronous=SOMETIMES",
    ]:
        with pytest.raises(KVInvalidArgument):
            open_kv(bad)


def test_data_survives_reopen(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/kv.db"
    with open_kv(url) as kv:
        kv.run(lambda t: t.set(b"k", b"v"))
    with open_kv(url) as kv:
        assert kv.run(lambda t: t.get(b"k")) == b"v"


def test_concurrent_open_of_new_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/kv.db"
    kvs: list[KV] = []
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            kvs.append(open_kv(url))
        except BaseException as e:
            errors.append(e)

    ths = [threading.Thread(target=opener) for _ in range(6)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert not errors and len(kvs) == 6
    for i, kv in enumerate(kvs):
        kv.run(lambda t, i=i: t.set(b"%d" % i, b""))
    assert len(kvs[0].run(lambda t: t.get_range(b"", b"\xff"))) == 6
    for kv in kvs:
        kv.close()


def test_transaction_too_old_after_log_pruning(tmp_path: Path) -> None:
    with open_kv(f"sqlite:///{tmp_path}/kv.db", max_txn_age_s=0.0, backoff_base_s=0.001) as kv:
        old = kv.begin()
        old.get(b"k")
        old.set(b"k", b"mine")
        for i in range(130):  # crosses a pruning point (every 128 commits)
            kv.run(lambda t, i=i: t.set(b"other%d" % i, b""))
        with pytest.raises(TransactionTooOld) as ei:
            old.commit()
        assert ei.value.read_version == 0 and ei.value.log_floor > 0
        # run() retries it with a fresh snapshot
        assert kv.run(lambda t: (t.get(b"k"), t.set(b"k", b"mine"))[0]) is None
        assert kv.run(lambda t: t.get(b"k")) == b"mine"


def test_no_false_conflicts_on_neighbouring_keys(sqlite_kv: KV) -> None:
    t = sqlite_kv.begin()
    t.get(b"k")
    t.get_range(b"m", b"n")
    t.set(b"mine", b"1")
    sqlite_kv.run(lambda t2: (t2.set(b"k\x00", b""), t2.set(b"n", b""), t2.set(b"j", b"")))
    t.commit()


def test_limited_range_read_tracks_only_what_it_returned(sqlite_kv: KV) -> None:
    kv = sqlite_kv
    kv.run(lambda t: [t.set(b"k%d" % i, b"") for i in range(5)])
    t = kv.begin()
    assert [k for k, _ in t.get_range(b"k", b"l", limit=2)] == [b"k0", b"k1"]
    t.set(b"x", b"")
    kv.run(lambda t2: t2.set(b"k3", b"changed"))  # beyond what t saw
    t.commit()
    t = kv.begin()
    assert [k for k, _ in t.get_range(b"k", b"l", limit=2, reverse=True)] == [b"k4", b"k3"]
    t.set(b"x", b"")
    kv.run(lambda t2: t2.set(b"k3", b"again"))  # inside what t saw
    with pytest.raises(KVConflict):
        t.commit()


def test_timeout_while_another_writer_holds_the_lock(sqlite_kv: KV) -> None:
    kv = sqlite_kv
    kv.faults.inject("slow_commit", delay_s=0.6)
    th = threading.Thread(target=lambda: kv.run(lambda t: t.set(b"slow", b"1")))
    th.start()
    deadline = time.monotonic() + 10
    while not kv._commit_lock.locked() and time.monotonic() < deadline:  # the slow writer holds the lock
        time.sleep(0.005)
    with pytest.raises(KVTimeout):
        kv.run(lambda t: t.set(b"fast", b"1"), timeout_s=0.1)
    th.join()
    assert kv.run(lambda t: t.get(b"fast")) is None and kv.run(lambda t: t.get(b"slow")) == b"1"


def test_fault_injector_keying() -> None:
    fi = FaultInjector()
    fi.inject("conflict", skip=1, times=2)
    fi.inject("slow_commit", delay_s=0.1, match=lambda c: c.writes(b"k"))
    fi.inject("unknown_result", nth=5)
    seq = [fi.take((b"a",), ()) for _ in range(3)]
    assert [f.kind if f else None for f in seq] == [None, "conflict", "conflict"]
    assert fi.take((), ((b"j", b"l"),)).kind == "slow_commit"  # range clear covering k
    assert fi.take((b"z",), ()).kind == "unknown_result"  # 5th commit since arming
    assert fi.take((b"k",), ()) is None  # everything exhausted
    assert fi.fired == [("conflict", 2), ("conflict", 3), ("slow_commit", 4), ("unknown_result", 5)]
    with pytest.raises(KVInvalidArgument):
        fi.inject("explode")  # type: ignore[arg-type]
    with pytest.raises(KVInvalidArgument):
        fi.inject("slow_commit")


def test_error_classes() -> None:
    assert issubclass(KVConflict, CoreConflict) and issubclass(KVConflict, KVError)
    assert KVConflict("x").code == "ABORTED" and CommitUnknown("x").code == "UNAVAILABLE"
    assert issubclass(CommitUnknown, Unavailable) and issubclass(TransactionTooOld, Aborted)
    assert issubclass(KVTimeout, DeadlineExceeded) and KVInvalidArgument("x").code == "INVALID_ARGUMENT"
    e = KVConflict("conflict", key="b'k'", attempts=3)
    back = error_from_dict(e.to_dict())
    assert type(back) is KVConflict and back.attempts == 3
    # the core registry still decodes plain Conflict as the core class
    assert type(error_from_dict(CoreConflict("c").to_dict())) is CoreConflict
