"""The checkpoint catalog: commit protocol, refusals, retention, sweep (SQLite and PostgreSQL KV)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fireflyer.ckpt.catalog import Catalog, index_digest
from fireflyer.ckpt.index import index_name
from fireflyer.ckpt.localfs import LocalFS
from fireflyer.ckpt.model import (
    MANIFEST_NAME,
    CheckpointRecord,
    CkptState,
    RetentionPolicy,
    decode_manifest,
    retention_victims,
)
from fireflyer.ckpt.shard import CheckpointCorrupted
from fireflyer.core.clock import ManualClock
from fireflyer.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from fireflyer.kv import open_kv


class Env:
    def __init__(self, kv_url: str, root: Path, **kv_opts: object) -> None:
        self.kv = open_kv(kv_url, **kv_opts)
        self.fs = LocalFS(root)
        self.root = root
        self.clock = ManualClock()
        self.events: list[CheckpointRecord] = []
        self.cat = Catalog(self.kv, self.fs, root="/ck", clock=self.clock, abandon_after_s=30,
                           on_committed=self.events.append)

    def write_rank(self, rec: CheckpointRecord, rank: int, payload: bytes = b"") -> str:
        data = b"index of rank %d " % rank + payload
        self.fs.write_bytes(f"{rec.directory}/{index_name(rank)}", data)
        return index_digest(data)

    def commit_all(self, job: str, step: int, world: int = 2) -> CheckpointRecord:
        rec = self.cat.begin(job, step, world)
        for r in range(world):
            rec = self.cat.commit_shard(rec.id, r, self.write_rank(rec, r), 100)
        return rec

    def on_disk(self, rec: CheckpointRecord) -> bool:
        return self.fs.exists(rec.directory)


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    if request.param == "sqlite":
        e = Env(f"sqlite:///{tmp_path / 'cat.db'}", tmp_path / "fs")
    else:
        dsn = request.getfixturevalue("pg_dsn")
        e = Env(dsn, tmp_path / "fs", schema=request.getfixturevalue("pg_schema"))
    yield e
    e.kv.close()


def test_commit_needs_every_rank_and_writes_the_manifest_last(env: Env) -> None:
    rec = env.cat.begin("train", 10, 3, {"model": "tiny"})
    assert rec.state is CkptState.PENDING and env.cat.begin("train", 10, 3).id == rec.id  # every rank may Begin
    for r in range(2):
        rec = env.cat.commit_shard(rec.id, r, env.write_rank(rec, r), 1000)
        assert rec.state is CkptState.PENDING
        assert not env.fs.exists(f"{rec.directory}/{MANIFEST_NAME}")
    assert env.cat.list("train") == [] and env.events == []
    with pytest.raises(NotFound):
        env.cat.latest("train")
    done = env.cat.commit_shard(rec.id, 2, env.write_rank(rec, 2), 1000)
    assert done.state is CkptState.COMMITTED and done.nbytes == 3000 and done.ranks_committed == 3
    manifest = decode_manifest(env.fs.read_bytes(f"{done.directory}/{MANIFEST_NAME}"))
    assert (manifest.id, manifest.step, manifest.meta) == (done.id, 10, {"model": "tiny"})
    assert [s.rank for s in manifest.shards] == [0, 1, 2]
    assert env.cat.latest("train").id == done.id and [e.id for e in env.events] == [done.id]
    # a retried CommitShard with the same digest is harmless
    assert env.cat.get(done.id).state is CkptState.COMMITTED


def test_concurrent_ranks_commit_exactly_once(env: Env) -> None:
    world = 4
    rec = env.cat.begin("par", 1, world)
    digests = [env.write_rank(rec, r) for r in range(world)]
    results: list[CheckpointRecord | BaseException] = []

    def rank(r: int) -> None:
        try:
            results.append(env.cat.commit_shard(rec.id, r, digests[r], 10))
        except BaseException as e:  # noqa: BLE001
            results.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(isinstance(r, CheckpointRecord) for r in results), results
    assert len(env.events) == 1 and env.cat.latest("par").ranks_committed == world


def test_refusals_commit_nothing(env: Env) -> None:
    first = env.commit_all("j", 5)
    with pytest.raises(FailedPrecondition, match="step 4 goes backwards.*step 5"):
        env.cat.begin("j", 4, 2)
    with pytest.raises(AlreadyExists):
        env.cat.begin("j", 5, 2)
    rec = env.cat.begin("j", 6, 2)
    with pytest.raises(FailedPrecondition, match="2 ranks, this rank says 3"):
        env.cat.begin("j", 6, 3)
    with pytest.raises(InvalidArgument, match="rank 2 is outside"):
        env.cat.commit_shard(rec.id, 2, "x", 1)
    with pytest.raises(FailedPrecondition, match="missing"):
        env.cat.commit_shard(rec.id, 0, "x", 1)
    env.write_rank(rec, 0)
    with pytest.raises(CheckpointCorrupted, match="digest"):
        env.cat.commit_shard(rec.id, 0, "0" * 32, 1)
    d0 = env.write_rank(rec, 0)
    env.cat.commit_shard(rec.id, 0, d0, 1)
    with pytest.raises(AlreadyExists, match="different shard"):
        env.cat.commit_shard(rec.id, 0, env.write_rank(rec, 0, b"rewritten"), 1)
    for bad in ("", "a/b", "../x", "x y", "-lead", "llama.7b"):
        with pytest.raises(InvalidArgument, match="bad job name"):
            env.cat.begin(bad, 1, 1)
    with pytest.raises(InvalidArgument):
        env.cat.begin("j", -1, 1)
    with pytest.raises(InvalidArgument):
        env.cat.begin("j", 7, 0)
    with pytest.raises(NotFound, match="unknown job"):
        env.cat.list("nobody")
    with pytest.raises(NotFound):
        env.cat.commit_shard("ckpt-nope", 0, "x", 1)
    assert [r.id for r in env.cat.list("j")] == [first.id] and env.cat.get(rec.id).ranks_committed == 1


def test_abort_removes_data_and_refuses_later_commits(env: Env) -> None:
    rec = env.cat.begin("a", 1, 2)
    d = env.write_rank(rec, 0)
    aborted = env.cat.abort(rec.id, "rank 1 died")
    assert aborted.state is CkptState.ABORTED and not env.on_disk(rec)
    with pytest.raises(FailedPrecondition, match="aborted: rank 1 died"):
        env.cat.commit_shard(rec.id, 0, d, 1)
    assert [r.state for r in env.cat.list("a", include_all=True)] == [CkptState.ABORTED]


def test_sweep_aborts_abandoned_and_a_newer_commit_supersedes_older_pending(env: Env) -> None:
    prev = env.commit_all("s", 1)
    stale = env.cat.begin("s", 2, 2)
    env.cat.commit_shard(stale.id, 0, env.write_rank(stale, 0), 5)
    env.clock.advance(10)
    assert env.cat.sweep() == []  # not idle long enough
    env.clock.advance(25)
    (acted,) = env.cat.sweep()
    assert acted.id == stale.id and "abandoned" in acted.reason and "1 of 2 ranks" in acted.reason
    assert not env.on_disk(stale) and env.cat.latest("s").id == prev.id
    older = env.cat.begin("s", 3, 1)
    newer = env.commit_all("s", 4, world=1)
    assert env.cat.get(older.id).state is CkptState.ABORTED and "superseded by step 4" in env.cat.get(older.id).reason
    assert not env.on_disk(older) and env.cat.latest("s").id == newer.id


def test_sweep_finishes_an_interrupted_commit(env: Env) -> None:
    class Crash(Exception):
        pass

    rec = env.cat.begin("c", 1, 1)
    real = env.fs.write_bytes

    def crash_on_manifest(path: str, data: object) -> int:
        if path.endswith(MANIFEST_NAME):
            raise Crash
        return real(path, data)

    env.fs.write_bytes = crash_on_manifest  # type: ignore[method-assign]
    with pytest.raises(Crash):
        env.cat.commit_shard(rec.id, 0, env.write_rank(rec, 0), 1)
    env.fs.write_bytes = real  # type: ignore[method-assign]
    assert env.cat.get(rec.id).state is CkptState.COMMITTING and env.cat.list("c") == []
    (done,) = env.cat.sweep()
    assert done.state is CkptState.COMMITTED and env.cat.latest("c").id == rec.id
    assert env.fs.exists(f"{rec.directory}/{MANIFEST_NAME}") and len(env.events) == 1


def test_retention_deletes_only_what_the_policy_says(env: Env) -> None:
    env.cat.set_retention("r", RetentionPolicy(keep_last=2, keep_every=3))
    recs = [env.commit_all("r", 1, world=1)]
    env.cat.pin(recs[0].id)
    for step in range(2, 9):
        recs.append(env.commit_all("r", step, world=1))
    kept = [r.step for r in env.cat.list("r")]
    assert kept == [1, 3, 6, 7, 8]  # pinned 1; every 3rd: 3, 6; last two: 7, 8
    for r in recs:
        assert env.on_disk(r) == (r.step in kept)
    with pytest.raises(FailedPrecondition, match="pinned"):
        env.cat.delete(recs[0].id)
    env.cat.delete(recs[0].id, force=True)
    with pytest.raises(NotFound):
        env.cat.get(recs[0].id)
    assert [r.step for r in env.cat.list("r")] == [3, 6, 7, 8]


@pytest.mark.parametrize(
    ("policy", "steps", "pinned", "deleted"),
    [
        (RetentionPolicy(keep_last=3), [1, 2, 3, 4, 5], set(), [1, 2]),
        (RetentionPolicy(keep_last=0), [1, 2, 3], set(), []),
        (RetentionPolicy(keep_last=1, keep_every=2), [1, 2, 3, 4, 5], set(), [1, 3]),
        (RetentionPolicy(keep_last=1), [1, 2, 3], {1}, [2]),
        (RetentionPolicy(keep_last=5), [1, 2], set(), []),
    ],
)
def test_retention_rule(policy: RetentionPolicy, steps: list[int], pinned: set[int], deleted: list[int]) -> None:
    recs = [CheckpointRecord(id=f"c{s}", job="j", step=s, world_size=1, directory="/d", state=CkptState.COMMITTED,
                             pinned=s in pinned) for s in steps]
    pending = CheckpointRecord(id="p", job="j", step=99, world_size=1, directory="/d", state=CkptState.PENDING)
    assert [r.step for r in retention_victims([*reversed(recs), pending], policy)] == deleted


def test_bad_retention_and_jobs(env: Env) -> None:
    with pytest.raises(InvalidArgument):
        env.cat.set_retention("x", RetentionPolicy(keep_last=-1))
    env.commit_all("b", 1, world=1)
    env.cat.begin("a", 1, 1)
    assert env.cat.jobs() == ["a", "b"]
