"""Resync: one case per row of the diff table, the plan, and a run that brings a stale
replica to equal content while writes continue."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from storage_harness import CHAIN, Cluster

from fireflyer.mgmt.model import PublicState
from fireflyer.storage import (
    ChunkId,
    ChunkMeta,
    ChunkState,
    ChunkStore,
    Decision,
    ResyncFatal,
    crc32c,
    decide,
    diff,
    run_resync,
)

X = ChunkId(1, 0, 0)


def meta(
    committed: int, chain_ver: int, crc: int = 7, *, pending: int | None = None, length: int = 3
) -> ChunkMeta:
    return ChunkMeta(
        chunk_id=X, committed_ver=committed, pending_ver=pending or committed,
        state=ChunkState.CLEAN if pending else ChunkState.COMMIT, length=length, crc=crc, chain_ver=chain_ver,
    )  # fmt: skip


ROWS = [
    # (row, local, remote, decision)
    ("1 neither", None, None, Decision.SKIP),
    ("2 local only", meta(3, 2), None, Decision.SEND),
    ("3 remote only", None, meta(3, 2), Decision.REMOVE),
    ("3 local only uncommitted first write", meta(0, 2, pending=1), meta(3, 2), Decision.REMOVE),
    ("4 local chain ver newer", meta(3, 5), meta(3, 4), Decision.SEND),
    ("4 local chain ver newer, even if remote version higher", meta(3, 5), meta(9, 4), Decision.SEND),
    ("5 remote pending", meta(3, 2), meta(2, 2, pending=3), Decision.SEND),
    ("6 equal chain ver, local ahead", meta(4, 2), meta(3, 2), Decision.SEND),
    ("6 equal chain ver, remote ahead", meta(3, 2), meta(4, 2, crc=9), Decision.SEND),
    # the write in flight at the predecessor (pending 3 over committed 2, chain ver 1) already
    # committed at the syncing tail as a full replace under chain ver 2: a torn dump, no fault
    ("7 local mid-write, the tail already has it", meta(2, 1, crc=1, pending=3), meta(3, 2, crc=2), Decision.SEND),
    ("8 equal versions, checksum differs", meta(3, 2, crc=1), meta(3, 2, crc=2), Decision.FATAL),
    ("8 equal versions, length differs", meta(3, 2, length=3), meta(3, 2, length=4), Decision.FATAL),
    ("8 stale local chain ver, checksum differs", meta(3, 2, crc=1), meta(3, 3, crc=2), Decision.FATAL),
    ("8 equal committed versions differ, a write in flight here", meta(3, 2, crc=1, pending=4), meta(3, 2, crc=2),
     Decision.FATAL),
    ("9 identical", meta(3, 2), meta(3, 2), Decision.SKIP),
    ("9 stale local chain ver, same checksum", meta(3, 2), meta(3, 3), Decision.SKIP),
    ("9 local pending over equal committed", meta(3, 2, pending=4), meta(3, 2), Decision.SKIP),
]


@pytest.mark.parametrize(("row", "local", "remote", "want"), ROWS, ids=[r[0] for r in ROWS])
def test_diff_rule(row: str, local: ChunkMeta | None, remote: ChunkMeta | None, want: Decision) -> None:
    assert decide(local, remote) is want


def test_every_table_row_is_covered() -> None:
    assert {r[0].split()[0] for r in ROWS} == {str(i) for i in range(1, 10)}


def test_diff_builds_a_plan() -> None:
    ids = [ChunkId(1, 0, i) for i in range(5)]

    def m(i: int, committed: int, chain_ver: int, crc: int = 7) -> ChunkMeta:
        return ChunkMeta(
            chunk_id=ids[i], committed_ver=committed, pending_ver=committed, state=ChunkState.COMMIT, length=1,
            crc=crc, chain_ver=chain_ver,
        )  # fmt: skip

    local = [m(0, 1, 1), m(1, 2, 2), m(3, 1, 1, crc=1), m(4, 1, 1)]
    remote = [m(1, 1, 1), m(2, 1, 1), m(3, 1, 1, crc=2), m(4, 1, 1)]
    plan = diff(reversed(local), remote)
    assert plan.send == (ids[0], ids[1]) and plan.remove == (ids[2],) and plan.fatal == (ids[3],)
    assert plan.skipped == 1


def test_fatal_plan_changes_nothing(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path, fsync=False)
    store.replace_full(X, b"abc", version=3, chain_ver=2)
    remote = [meta(3, 2, crc=crc32c(b"abd"))]
    calls: list = []
    with pytest.raises(ResyncFatal) as ei:
        run_resync(
            store,
            diff(store.all_meta(), remote),
            send_replace=lambda *a: calls.append(a),
            remove=calls.append,
        )
    assert calls == [] and ei.value.fields["chunks"] == X.hex


def test_plan_rechecked_under_the_lock(tmp_path: Path) -> None:
    """Writes continue after the metadata dump: a chunk planned for removal that now exists
    locally is sent, one planned for sending that is gone is removed."""
    local = ChunkStore(tmp_path / "l", fsync=False)
    remote = ChunkStore(tmp_path / "r", fsync=False)
    a, b = ChunkId(1, 0, 0), ChunkId(1, 0, 1)
    local.replace_full(a, b"A", version=1, chain_ver=1)
    remote.replace_full(b, b"old", version=1, chain_ver=1)
    plan = diff(local.all_meta(), remote.all_meta())
    assert plan.send == (a,) and plan.remove == (b,)
    local.remove(a)  # GC after the dump
    local.replace_full(b, b"B", version=2, chain_ver=2)  # a write after the dump
    stats = run_resync(
        local, plan, workers=1, remove=remote.remove,
        send_replace=lambda c, d, v, cv: remote.replace_full(c, d, version=v, chain_ver=cv),
    )  # fmt: skip
    assert (stats.sent, stats.removed) == (1, 1)
    assert remote.meta(a) is None and remote.read(b) == b"B" and remote.meta(b).committed_ver == 2  # type: ignore[union-attr]


def test_resync_brings_stale_replica_level_while_writes_continue(tmp_path: Path) -> None:
    cl = Cluster(tmp_path, 3)
    rng = random.Random(5)
    chunks = [ChunkId(3, 0, i) for i in range(40)]
    for cid in chunks:
        cl.write(cid, 0, rng.randbytes(300))
    cl.down.add(3)
    cl.fail(3)
    for cid in chunks[:20]:  # the stale replica misses these ...
        cl.write(cid, 100, rng.randbytes(50))
    for cid in chunks[30:]:
        cl.stores[1].remove(cid)  # ... and these deletions (GC on the live replicas)
        cl.stores[2].remove(cid)
    extra = ChunkId(4, 0, 0)
    cl.write(extra, 0, b"new file")  # ... and a new chunk
    # 3 returns as syncing; the resync runs in a thread while a client keeps writing
    cl.down.discard(3)
    cl.set_states({3: PublicState.SYNCING})
    stop = threading.Event()
    errors: list[BaseException] = []
    touched: set[ChunkId] = set()

    def client() -> None:
        r = random.Random(9)
        try:
            while not stop.is_set():
                cid = r.choice(chunks[:30])
                touched.add(cid)
                cl.write(cid, r.randrange(300), r.randbytes(20), client="bg")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=client)
    th.start()
    remote = cl.stores[3]
    from fireflyer.storage import resync

    stats = resync(
        cl.stores[2], list(remote.all_meta()), workers=4, remove=remote.remove,
        send_replace=lambda c, d, v, cv: remote.replace_full(c, d, version=v, chain_ver=cv),
    )  # fmt: skip
    stop.set()
    th.join(30)
    assert errors == []
    # A concurrent write reaches the syncing replica as a full-chunk replacement and can bring
    # a stale chunk level before the resync gets to it, so only the stale chunks the client
    # never touched (and the new file's chunk) are certain to be sent by the resync.
    untouched_stale = set(chunks[:20]) - touched
    assert stats.sent >= len(untouched_stale) + 1 and stats.removed == 10
    cl.set_states({3: PublicState.SERVING})
    for cid in chunks[:30] + [extra]:
        got = {t: (cl.stores[t].meta(cid).committed_ver, cl.read(t, cid)) for t in (1, 2, 3)}  # type: ignore[union-attr]
        assert len(set(got.values())) == 1, (cid, got)
    for cid in chunks[30:]:
        assert remote.meta(cid) is None
    assert [m.chunk_id for m in remote.all_meta()] == [m.chunk_id for m in cl.stores[1].all_meta()]
    assert cl.chain.chain_id == CHAIN
    cl.close()


def test_a_write_in_flight_between_the_dumps_is_sent_not_fatal(tmp_path: Path) -> None:
    """The flake this rule fixes, made deterministic: the dumps are taken while a write has
    committed at the syncing tail (a full replace, new chain version) and is still pending at
    the predecessor (old committed content, old chain version)."""
    cl = Cluster(tmp_path, 3)
    cid = ChunkId(5, 0, 0)
    cl.write(cid, 0, b"a" * 100)
    cl.down.add(3)
    cl.fail(3)
    cl.write(cid, 0, b"b" * 100)  # 3 misses this one
    cl.down.discard(3)
    cl.set_states({3: PublicState.SYNCING})
    pred, remote = cl.stores[2], cl.stores[3]
    plans = []
    deliver = cl.replicas[3].handle_update

    def deliver_then_dump(req, data):  # type: ignore[no-untyped-def]
        ack = deliver(req, data)  # the tail has committed; the predecessor commits on this ack
        plans.append(diff(pred.all_meta(), list(remote.all_meta())))
        return ack

    cl.replicas[3].handle_update = deliver_then_dump  # type: ignore[method-assign]
    cl.write(cid, 0, b"c" * 100)
    cl.replicas[3].handle_update = deliver  # type: ignore[method-assign]
    (plan,) = plans
    local = next(m for m in pred.all_meta() if m.chunk_id == cid)
    assert local.committed_ver == 3  # (committed since the dump)
    assert plan.fatal == () and plan.send == (cid,)
    run_resync(pred, plan, remove=remote.remove,
               send_replace=lambda c, d, v, cv: remote.replace_full(c, d, version=v, chain_ver=cv))
    assert remote.read(cid) == pred.read(cid) == b"c" * 100
