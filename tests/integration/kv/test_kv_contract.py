"""The KV contract: every backend (``kv_store`` is parametrized: sqlite, postgres) must pass.

Where the backends differ on purpose (PostgreSQL tracks snapshot reads and only aborts
read-write cycles) the test asserts each backend's documented behaviour, keyed on
``kv.untracked_snapshot_reads`` / ``kv.backend``.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from fireflyer.core.errors import Conflict as CoreConflict
from fireflyer.core.errors import InvalidArgument as CoreInvalidArgument
from fireflyer.kv import (
    KV,
    MAX_KEY_SIZE,
    MAX_VALUE_SIZE,
    CommitUnknown,
    KVConflict,
    KVError,
    KVInvalidArgument,
    KVTimeout,
    Txn,
)
from fireflyer.kv.keys import pack, prefix_range

pytestmark = pytest.mark.postgres


def _int(b: bytes | None) -> int:
    return 0 if b is None else int.from_bytes(b, "big")


def _incr(key: bytes, calls: list[int] | None = None):
    def fn(t: Txn) -> int:
        if calls is not None:
            calls.append(1)
        n = _int(t.get(key)) + 1
        t.set(key, n.to_bytes(8, "big"))
        return n

    return fn


def _all(kv: KV) -> list[tuple[bytes, bytes]]:
    return kv.run(lambda t: t.get_range(b"", b"\xff"))


def _race(kv: KV, first, second) -> list[BaseException | None]:
    """Open two txns, run ``first``/``second`` on each (reads then writes), commit both."""
    t1, t2 = kv.begin(), kv.begin()
    first(t1)
    second(t2)
    out: list[BaseException | None] = []
    for t in (t1, t2):
        try:
            t.commit()
            out.append(None)
        except KVConflict as e:
            out.append(e)
    return out


# -- basic operations ----------------------------------------------------------------


def test_crud(kv_store: KV) -> None:
    kv = kv_store
    assert kv.run(lambda t: t.get(b"a")) is None
    kv.run(lambda t: t.set(b"a", b"1"))
    assert kv.run(lambda t: t.get(b"a")) == b"1"
    kv.run(lambda t: t.set(b"a", b"2"))
    assert kv.run(lambda t: t.get(b"a")) == b"2"
    kv.run(lambda t: t.set(b"empty", b""))
    assert kv.run(lambda t: t.get(b"empty")) == b""
    kv.run(lambda t: t.clear(b"a"))
    assert kv.run(lambda t: t.get(b"a")) is None
    kv.run(lambda t: t.clear(b"never-there"))  # clearing a missing key is fine
    assert _all(kv) == [(b"empty", b"")]


def test_keys_are_ordered_bytewise(kv_store: KV) -> None:
    keys = [
        b"",
        b"\x00",
        b"\x00\x00",
        b"\x01",
        b"A",
        b"a",
        b"a\x00",
        b"ab",
        b"b",
        b"\x7f",
        b"\x80",
        b"\xfe\xff",
    ]
    kv_store.run(lambda t: [t.set(k, k) for k in reversed(keys)])
    assert [k for k, _ in _all(kv_store)] == sorted(keys)
    tuples = [
        ("DENT", 1, "b"),
        ("DENT", 1, "a"),
        ("DENT", 2, ""),
        ("DENT", -5, "z"),
        ("INOD", 7),
        ("DENT", 256, ""),
    ]
    kv_store.run(lambda t: [t.set(pack(x), b"") for x in tuples])
    got = kv_store.run(lambda t: [k for k, _ in t.get_range(*prefix_range(pack(("DENT",))))])
    assert got == [pack(x) for x in sorted(x for x in tuples if x[0] == "DENT")]


def test_range_reads(kv_store: KV) -> None:
    kv = kv_store
    kv.run(lambda t: [t.set(b"k%d" % i, b"v%d" % i) for i in range(10)])

    def rng(*a, **kw):
        return [k for k, _ in kv.run(lambda t: t.get_range(*a, **kw))]

    assert rng(b"k2", b"k5") == [b"k2", b"k3", b"k4"]  # begin inclusive, end exclusive
    assert rng(b"k2", b"k5", reverse=True) == [b"k4", b"k3", b"k2"]
    assert rng(b"k", b"l", limit=3) == [b"k0", b"k1", b"k2"]
    assert rng(b"k", b"l", limit=3, reverse=True) == [b"k9", b"k8", b"k7"]
    assert rng(b"k", b"l", limit=100) == [b"k%d" % i for i in range(10)]
    assert rng(b"k3", b"k3") == []
    assert rng(b"x", b"z") == []
    assert rng(b"k", b"l", snapshot=True) == [b"k%d" % i for i in range(10)]
    assert kv.run(lambda t: t.get_range(b"k1", b"k2")) == [(b"k1", b"v1")]


def test_clear_range(kv_store: KV) -> None:
    kv = kv_store
    kv.run(lambda t: [t.set(b"k%d" % i, b"") for i in range(10)])
    kv.run(lambda t: t.clear_range(b"k3", b"k7"))
    assert [k for k, _ in _all(kv)] == [b"k0", b"k1", b"k2", b"k7", b"k8", b"k9"]
    kv.run(lambda t: t.clear_range(b"k5", b"k5"))  # empty range: no-op
    kv.run(lambda t: t.clear_range(b"", b"\xff"))
    assert _all(kv) == []


def test_read_your_writes(kv_store: KV) -> None:
    kv = kv_store
    kv.run(lambda t: [t.set(b"k%d" % i, b"old") for i in range(6)])

    def fn(t: Txn) -> None:
        t.set(b"k1", b"new")
        t.set(b"k9", b"added")
        assert t.get(b"k1") == b"new"
        t.clear(b"k2")
        assert t.get(b"k2") is None
        t.clear_range(b"k4", b"k6")
        assert t.get(b"k4") is None and t.get(b"k5") is None
        t.set(b"k5", b"back")  # a set after a clear_range wins
        assert t.get(b"k5") == b"back"
        rows = t.get_range(b"k", b"l")
        assert rows == [
            (b"k0", b"old"),
            (b"k1", b"new"),
            (b"k3", b"old"),
            (b"k5", b"back"),
            (b"k9", b"added"),
        ]
        assert t.get_range(b"k", b"l", reverse=True) == rows[::-1]
        assert t.get_range(b"k", b"l", limit=2) == rows[:2]
        assert t.get_range(b"k", b"l", limit=2, reverse=True) == rows[::-1][:2]
        assert t.get_range(b"k2", b"k6") == [(b"k3", b"old"), (b"k5", b"back")]
        t.clear_range(b"k", b"l")
        assert t.get_range(b"k", b"l") == []
        t.set(b"k7", b"last")

    kv.run(fn)
    assert _all(kv) == [(b"k7", b"last")]


def test_manual_transactions(kv_store: KV) -> None:
    kv = kv_store
    t = kv.begin()
    t.set(b"a", b"1")
    t.rollback()
    assert kv.run(lambda t: t.get(b"a")) is None
    with kv.begin() as t:
        t.set(b"a", b"2")
    assert kv.run(lambda t: t.get(b"a")) == b"2"
    with pytest.raises(RuntimeError), kv.begin() as t:
        t.set(b"a", b"3")
        raise RuntimeError("boom")
    assert kv.run(lambda t: t.get(b"a")) == b"2"
    t = kv.begin()
    t.commit()
    with pytest.raises(KVInvalidArgument):
        t.get(b"a")


def test_exception_in_fn_rolls_back(kv_store: KV) -> None:
    def fn(t: Txn) -> None:
        t.set(b"a", b"1")
        raise ValueError("user error")

    with pytest.raises(ValueError):
        kv_store.run(fn)
    assert _all(kv_store) == []


# -- conflicts -------------------------------------------------------------------------


def test_read_then_write_same_key_one_conflicts(kv_store: KV) -> None:
    kv = kv_store
    kv.run(lambda t: t.set(b"c", (0).to_bytes(8, "big")))

    def rmw(t: Txn) -> None:
        t.set(b"c", (_int(t.get(b"c")) + 1).to_bytes(8, "big"))

    res = _race(kv, rmw, rmw)
    assert res[0] is None and isinstance(res[1], KVConflict)
    assert isinstance(res[1], CoreConflict) and isinstance(res[1], KVError)
    assert _int(kv.run(lambda t: t.get(b"c"))) == 1


def test_write_skew_is_prevented(kv_store: KV) -> None:
    kv = kv_store
    kv.run(lambda t: (t.set(b"a", b"1"), t.set(b"b", b"1")))

    def make(read: bytes, write: bytes):
        def fn(t: Txn) -> None:
            t.get(read)
            t.set(write, b"0")

        return fn

    res = _race(kv, make(b"a", b"b"), make(b"b", b"a"))
    assert sum(r is not None for r in res) == 1, res


def test_snapshot_reads(kv_store: KV) -> None:
    """SQLite: snapshot reads add no conflicts, so this write skew commits (as in FDB).
    PostgreSQL tracks them (documented deviation): one side aborts."""
    kv = kv_store
    kv.run(lambda t: (t.set(b"a", b"1"), t.set(b"b", b"1")))

    def make(read: bytes, write: bytes):
        def fn(t: Txn) -> None:
            assert t.get(read, snapshot=True) == b"1"
            t.get_range(read, read + b"\x00", snapshot=True)
            t.set(write, b"0")

        return fn

    res = _race(kv, make(b"a", b"b"), make(b"b", b"a"))
    conflicts = sum(r is not None for r in res)
    assert conflicts == (0 if kv.untracked_snapshot_reads else 1), res


def test_snapshot_read_sees_consistent_snapshot(kv_store: KV) -> None:
    kv = kv_store
    kv.run(lambda t: t.set(b"a", b"1"))
    t = kv.begin()
    assert t.get(b"a", snapshot=True) == b"1"
    kv.run(lambda t2: t2.set(b"a", b"2"))
    assert t.get(b"a", snapshot=True) == b"1"  # repeatable within the txn
    assert t.get_range(b"a", b"b") == [(b"a", b"1")]
    t.rollback()


def test_explicit_read_conflict_keys(kv_store: KV) -> None:
    kv = kv_store
    kv.run(lambda t: (t.set(b"a", b"1"), t.set(b"b", b"1")))

    def make(conflict_on: bytes, write: bytes):
        def fn(t: Txn) -> None:
            t.add_read_conflict_key(conflict_on)
            t.set(write, b"0")

        return fn

    res = _race(kv, make(b"a", b"b"), make(b"b", b"a"))
    assert sum(r is not None for r in res) == 1, res

    def make_range(conflict_on: bytes, write: bytes):
        def fn(t: Txn) -> None:
            t.add_read_conflict_range(conflict_on, conflict_on + b"\xff")
            t.set(write, b"0")

        return fn

    res = _race(kv, make_range(b"a", b"b\x01"), make_range(b"b", b"a\x01"))
    assert sum(r is not None for r in res) == 1, res


@pytest.mark.parametrize("how", ["get", "conflict_key", "range"])
def test_overwritten_read_aborts_on_sqlite(kv_store: KV, how: str) -> None:
    """FDB's rule (SQLite): a tracked read overwritten by a concurrent commit aborts.
    PostgreSQL serializes the reader first instead (documented); both must commit consistently."""
    kv = kv_store
    t = kv.begin()
    if how == "get":
        t.get(b"k")
    elif how == "conflict_key":
        t.add_read_conflict_key(b"k")
    else:
        t.get_range(b"j", b"l")
    t.set(b"other", b"1")
    kv.run(lambda t2: t2.set(b"k", b"1"))
    if kv.backend == "sqlite":
        with pytest.raises(KVConflict) as ei:
            t.commit()
        assert ei.value.key == str(b"k")
    else:
        t.commit()


def test_blind_writes_to_different_keys_both_commit(kv_store: KV) -> None:
    res = _race(kv_store, lambda t: t.set(b"x", b"1"), lambda t: t.set(b"y", b"2"))
    assert res == [None, None]
    assert _all(kv_store) == [(b"x", b"1"), (b"y", b"2")]


def test_blind_writes_to_same_key_last_wins(kv_store: KV) -> None:
    res = _race(kv_store, lambda t: t.set(b"x", b"1"), lambda t: t.set(b"x", b"2"))
    if kv_store.backend == "sqlite":  # blind writes never conflict (FDB)
        assert res == [None, None]
        assert _all(kv_store) == [(b"x", b"2")]
    else:  # PostgreSQL: the second writer waits on the row lock, then fails to serialize
        assert res[0] is None
        assert _all(kv_store) == [(b"x", b"1")] if res[1] else [(b"x", b"2")]


# -- retries and injected faults ------------------------------------------------------------


def test_retries_with_backoff_succeed_under_injected_conflicts(kv_store: KV) -> None:
    calls: list[int] = []
    kv_store.faults.inject("conflict", times=3)
    assert kv_store.run(_incr(b"n", calls)) == 1
    assert len(calls) == 4
    assert kv_store.stats.retries >= 3 and [k for k, _ in kv_store.faults.fired] == ["conflict"] * 3
    assert _int(kv_store.run(lambda t: t.get(b"n"))) == 1


def test_bounded_retry_raises_conflict_with_attempts(kv_store: KV) -> None:
    calls: list[int] = []
    kv_store.faults.inject("conflict", times=None)
    with pytest.raises(KVConflict) as ei:
        kv_store.run(_incr(b"n", calls), max_retries=2)
    assert ei.value.attempts == 3 and len(calls) == 3
    kv_store.faults.clear()
    assert kv_store.run(lambda t: t.get(b"n")) is None


def test_real_conflict_retried_by_run(kv_store: KV) -> None:
    """A genuinely concurrent writer (not an injected fault) makes run() retry fn."""
    kv = kv_store
    calls: list[int] = []
    other = threading.Thread(target=lambda: kv.run(_incr(b"n")))

    def fn(t: Txn) -> int:
        calls.append(1)
        n = _int(t.get(b"n"))
        if len(calls) == 1:  # someone else increments between our read and our commit
            other.start()
            deadline = time.monotonic() + 10
            while kv.run(lambda t2: t2.get(b"n", snapshot=True)) is None and time.monotonic() < deadline:
                time.sleep(0.005)
        t.set(b"n", (n + 1).to_bytes(8, "big"))
        return n + 1

    assert kv.run(fn) == 2
    other.join()
    assert len(calls) == 2 and _int(kv.run(lambda t: t.get(b"n"))) == 2


def test_commit_unknown_with_idempotency_key_applies_once(kv_store: KV) -> None:
    kv = kv_store
    calls: list[int] = []
    kv.faults.inject("unknown_result")  # the commit happens; the client hears "unknown"
    assert kv.run(_incr(b"n", calls), idempotency_key=b"req-1") == 1
    assert len(calls) == 1  # the retry found the record instead of running fn again
    assert _int(kv.run(lambda t: t.get(b"n"))) == 1
    # the same request again (a client retrying its RPC) returns the recorded result
    assert kv.run(_incr(b"n", calls), idempotency_key=b"req-1") == 1
    assert len(calls) == 1 and _int(kv.run(lambda t: t.get(b"n"))) == 1
    # a different request runs
    assert kv.run(_incr(b"n", calls), idempotency_key=b"req-2") == 2


def test_commit_unknown_not_committed_with_idempotency_key(kv_store: KV) -> None:
    calls: list[int] = []
    kv_store.faults.inject("unknown_result_not_committed")
    assert kv_store.run(_incr(b"n", calls), idempotency_key=b"req") == 1
    assert len(calls) == 2  # not applied the first time, so fn ran again
    assert _int(kv_store.run(lambda t: t.get(b"n"))) == 1


def test_commit_unknown_without_key_raises(kv_store: KV) -> None:
    kv = kv_store
    kv.faults.inject("unknown_result")
    with pytest.raises(CommitUnknown) as ei:
        kv.run(_incr(b"n"))
    assert ei.value.attempts == 1
    assert _int(kv.run(lambda t: t.get(b"n"))) == 1  # it did apply: why blind retry is unsafe
    # a caller that declares fn idempotent gets it retried
    calls: list[int] = []
    kv.faults.inject("unknown_result_not_committed")
    assert kv.run(lambda t: (calls.append(1), t.set(b"flag", b"1"))[0], idempotent=True) is None
    assert len(calls) == 2 and kv.run(lambda t: t.get(b"flag")) == b"1"


def test_idempotent_results_round_trip_and_expire(kv_store: KV) -> None:
    kv = kv_store
    calls: list[int] = []

    def fn(t: Txn) -> dict:
        calls.append(1)
        t.set(b"x", b"1")
        return {"inode": 42, "name": "f", "blob": b"\x00"}

    first = kv.run(fn, idempotency_key=b"k")
    assert first == kv.run(fn, idempotency_key=b"k") == {"inode": 42, "name": "f", "blob": b"\x00"}
    assert len(calls) == 1
    assert kv.gc_idempotency() == 0  # not expired yet
    assert kv.gc_idempotency(now=time.time() + kv.idempotency_expiry_s + 60) == 1
    kv.run(fn, idempotency_key=b"k")
    assert len(calls) == 2
    with pytest.raises(KVInvalidArgument):
        kv.run(lambda t: object(), idempotency_key=b"unencodable")


def test_fault_targets_by_key(kv_store: KV) -> None:
    kv = kv_store
    kv.faults.inject("conflict", key=b"target", times=None)
    kv.run(lambda t: t.set(b"other", b"1"))  # not targeted
    with pytest.raises(KVConflict):
        kv.run(lambda t: t.set(b"target", b"1"), max_retries=1)
    kv.faults.clear()
    kv.faults.inject("conflict", nth=2)
    kv.run(lambda t: t.set(b"a", b"1"))
    calls: list[int] = []
    kv.run(lambda t: (calls.append(1), t.set(b"b", b"1"))[0])
    assert len(calls) == 2


def test_slow_commit(kv_store: KV) -> None:
    kv = kv_store
    kv.faults.inject("slow_commit", delay_s=0.3)
    t0 = time.monotonic()
    kv.run(lambda t: t.set(b"a", b"1"))
    assert time.monotonic() - t0 >= 0.3
    assert kv.run(lambda t: t.get(b"a")) == b"1"
    # a slow commit bounded by a timeout: the deadline fires and nothing is half-applied
    kv.faults.inject("conflict", times=None)
    with pytest.raises(KVTimeout) as ei:
        kv.run(lambda t: t.set(b"b", b"1"), timeout_s=0.2)
    assert ei.value.attempts >= 1
    kv.faults.clear()
    assert kv.run(lambda t: t.get(b"b")) is None


def test_slow_commit_does_not_block_readers(kv_store: KV) -> None:
    kv = kv_store
    kv.run(lambda t: t.set(b"a", b"old"))
    kv.faults.inject("slow_commit", delay_s=1.0)
    th = threading.Thread(target=lambda: kv.run(lambda t: t.set(b"a", b"new")))
    th.start()
    deadline = time.monotonic() + 10
    while not kv.faults.fired and time.monotonic() < deadline:  # the writer reached its commit
        time.sleep(0.005)
    t0 = time.monotonic()
    assert kv.run(lambda t: t.get(b"a", snapshot=True)) in (b"old", b"new")
    assert time.monotonic() - t0 < 0.8
    th.join()
    assert kv.run(lambda t: t.get(b"a")) == b"new"


# -- concurrency ----------------------------------------------------------------------------


def test_threads_increment_counters_exactly(kv_store: KV) -> None:
    kv = kv_store
    threads_n, per_thread = 8, 15
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for j in range(per_thread):
                key = b"ctr%d" % ((i + j) % 2)
                kv.run(_incr(key), max_retries=200)
                kv.run(_incr(b"idem"), idempotency_key=b"w%d-%d" % (i, j), max_retries=200)
        except BaseException as e:
            errors.append(e)

    ths = [threading.Thread(target=worker, args=(i,)) for i in range(threads_n)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert not errors, errors[:1]
    total = threads_n * per_thread
    got = kv.run(lambda t: [_int(t.get(k)) for k in (b"ctr0", b"ctr1", b"idem")])
    assert got[0] + got[1] == total and got[2] == total


async def test_arun(kv_store: KV) -> None:
    results = await asyncio.gather(*(kv_store.arun(_incr(b"n"), max_retries=100) for _ in range(5)))
    assert sorted(results) == [1, 2, 3, 4, 5]


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.set("str-key", b"v"),
        lambda t: t.set(b"k", "str-value"),
        lambda t: t.set(bytearray(b"k"), b"v"),
        lambda t: t.get(123),
        lambda t: t.set(b"k" * (MAX_KEY_SIZE + 1), b"v"),
        lambda t: t.set(b"k", b"v" * (MAX_VALUE_SIZE + 1)),
        lambda t: t.get_range(b"b", b"a"),
        lambda t: t.clear_range(b"b", b"a"),
        lambda t: t.add_read_conflict_range(b"b", b"a"),
        lambda t: t.get_range(b"a", b"b", limit=-1),
        lambda t: t.set(b"\xff/idem/forged", b"v"),
        lambda t: t.clear_range(b"a", b"\xff\x00"),
    ],
)
def test_bad_input_writes_nothing(kv_store: KV, op) -> None:
    def fn(t: Txn) -> None:
        t.set(b"good", b"1")
        op(t)

    with pytest.raises(KVInvalidArgument) as ei:
        kv_store.run(fn)
    assert isinstance(ei.value, CoreInvalidArgument)
    assert _all(kv_store) == []


def test_largest_key_and_value_fit(kv_store: KV) -> None:
    key, value = b"\xfe" * MAX_KEY_SIZE, bytes(range(256)) * (MAX_VALUE_SIZE // 256)
    kv_store.run(lambda t: t.set(key, value))
    assert kv_store.run(lambda t: t.get(key)) == value
    assert kv_store.run(lambda t: t.get_range(key, key + b"\x00")) == [(key, value)]


def test_large_transaction_in_one_commit(kv_store: KV) -> None:
    keys = [pack(("bulk", i)) for i in range(1234)]  # more than one upsert batch on PostgreSQL
    kv_store.run(lambda t: [t.set(k, b"%d" % i) for i, k in enumerate(keys)])
    rows = kv_store.run(lambda t: t.get_range(*prefix_range(pack(("bulk",)))))
    assert [k for k, _ in rows] == keys and rows[-1][1] == b"1233"
    kv_store.run(lambda t: t.clear_range(*prefix_range(pack(("bulk",)))))
    assert _all(kv_store) == []
