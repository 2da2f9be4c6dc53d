"""Concurrency: unique inode ids across threads and processes, and serializability of
the namespace operations (8 clients, 2 stores, SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import pytest
from meta_model import (
    ADMIN,
    RETRY,
    TABLES,
    Record,
    RecordingStore,
    check_serial,
    client_process,
    run_client,
    sqlite_marker_versions,
    tree_of,
)

from fireflyer.kv import open_kv
from fireflyer.meta import MetaStore
from fireflyer.meta.alloc import InodeAllocator

NOPS = 40


def _alloc_ids(url: str, n: int, threads: int) -> list[int]:
    kv = open_kv(url, **RETRY)
    try:
        alloc = InodeAllocator(kv, shards=2, block_size=8)  # few shards, small blocks: contention
        out: list[list[int]] = [[] for _ in range(threads)]

        def work(i: int) -> None:
            out[i].extend(alloc.next_id() for _ in range(n))

        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return [x for o in out for x in o]
    finally:
        kv.close()


def test_alloc_unique_threads_and_processes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/alloc.db"
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        futs = [pool.submit(_alloc_ids, url, 100, 4) for _ in range(2)]
        mine = _alloc_ids(url, 100, 4)
        ids = mine + [x for f in futs for x in f.result()]
    assert len(ids) == 1200 and len(set(ids)) == 1200
    assert min(ids) >= 2 * 8  # counters start at 1: never the root's id


def _order_by_log(db: str, records: list[Record]) -> list[Record]:
    versions = sqlite_marker_versions(db)
    assert len(versions) == len(records)
    return sorted(((versions[r[0]], *r[1:]) for r in records), key=lambda r: r[0])


def _finish(store: MetaStore, records: list[Record]) -> None:
    model = check_serial(records)
    assert tree_of(store) == model.tree
    codes = {r[3] for r in records}
    assert 0 in codes and len(codes) >= 4, codes  # the workload exercised successes and errors


@pytest.mark.parametrize("seed", [0, 100, 200])
def test_serializable_threads_sqlite(tmp_path: Path, seed: int) -> None:
    db = f"{tmp_path}/ser.db"
    kv = open_kv(f"sqlite:///{db}", **RETRY)
    MetaStore.init(kv)
    stores = [RecordingStore(kv, tables=TABLES, tag=f"s{i}", mode="log", alloc_block=16) for i in range(2)]
    outs: list[list[Record]] = [[] for _ in range(8)]
    ts = [
        threading.Thread(target=run_client, args=(stores[i % 2], seed + i, NOPS, outs[i])) for i in range(8)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    records = _order_by_log(db, [r for o in outs for r in o])
    assert kv.stats.as_dict()["conflicts"] > 0  # the clients really raced
    _finish(stores[0], records)
    kv.close()


def test_serializable_two_processes_sqlite(tmp_path: Path) -> None:
    db = f"{tmp_path}/ser.db"
    url = f"sqlite:///{db}"
    kv = open_kv(url, **RETRY)
    MetaStore.init(kv)
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        futs = [pool.submit(client_process, url, f"p{i}", i + 1, NOPS, 4) for i in range(2)]
        records = [r for f in futs for r in f.result()]
    _finish(MetaStore(kv, tables=TABLES), _order_by_log(db, records))
    kv.close()


@pytest.mark.postgres
def test_serializable_threads_postgres(pg_dsn: str, pg_schema: str) -> None:
    kv = open_kv(pg_dsn, schema=pg_schema, **{k: v for k, v in RETRY.items() if k != "max_txn_age_s"})
    try:
        MetaStore.init(kv)
        stores = [RecordingStore(kv, tables=TABLES, tag=f"s{i}", mode="seq") for i in range(2)]
        outs: list[list[Record]] = [[] for _ in range(8)]
        ts = [threading.Thread(target=run_client, args=(stores[i % 2], i, 25, outs[i])) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        records = sorted((r for o in outs for r in o), key=lambda r: r[0])
        assert [r[0] for r in records] == list(range(len(records)))
        _finish(stores[0], records)
        assert stores[0].stat(ADMIN, "/").id == 1
    finally:
        kv.close()


def test_crossing_renames_never_make_a_loop(tmp_path: Path) -> None:
    """rename /x -> /y/x racing rename /y -> /x/y: exactly one wins, the other is EINVAL
    (or ENOENT), and every directory stays reachable from the root."""
    kv = open_kv(f"sqlite:///{tmp_path}/loop.db", **RETRY)
    MetaStore.init(kv)
    a, b = MetaStore(kv, tables=TABLES), MetaStore(kv, tables=TABLES)
    kv.faults.inject("slow_commit", delay_s=0.002, times=None)  # widen the race window
    for i in range(15):
        a.mkdir(ADMIN, f"/r{i}/x", parents=True)
        a.mkdir(ADMIN, f"/r{i}/y")
        barrier = threading.Barrier(2)
        results: list[object] = [None, None]

        def go(
            k: int,
            store: MetaStore,
            src: str,
            dst: str,
            barrier: threading.Barrier = barrier,
            results: list[object] = results,
        ) -> None:
            barrier.wait()
            try:
                store.rename(ADMIN, src, dst)
                results[k] = 0
            except OSError as e:
                results[k] = e.errno

        ts = [
            threading.Thread(target=go, args=(0, a, f"/r{i}/x", f"/r{i}/y/x")),
            threading.Thread(target=go, args=(1, b, f"/r{i}/y", f"/r{i}/x/y")),
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sorted(map(bool, results)) == [False, True], results
        assert len(tree_of(a)) - 1 == a.statfs(ADMIN).dirs - 1  # every dir reachable
    kv.faults.clear()
    kv.close()
