"""Checkpoint jobs have owners: the catalog's checks by caller, and the private modes of the files
a rank writes (issue 48, point 3)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from fireflyer.ckpt import save
from fireflyer.ckpt.catalog import Catalog, index_digest
from fireflyer.ckpt.index import index_name
from fireflyer.ckpt.localfs import LocalFS
from fireflyer.ckpt.model import CheckpointRecord, CkptCaller, CkptState, RetentionPolicy
from fireflyer.ckpt.private import DIR_MODE, FILE_MODE, write_private
from fireflyer.core.clock import ManualClock
from fireflyer.core.errors import NotFound, PermissionDenied
from fireflyer.kv import open_kv

ALICE = CkptCaller("alice")
BOB = CkptCaller("bob")
ADMIN = CkptCaller("admin", admin=True)


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    kv = open_kv(f"sqlite:///{tmp_path / 'cat.db'}")
    yield Catalog(kv, LocalFS(tmp_path / "fs"), root="/ck", clock=ManualClock(), abandon_after_s=30)
    kv.close()


def _commit(cat: Catalog, job: str, step: int, who: CkptCaller, world: int = 1) -> CheckpointRecord:
    rec = cat.begin(job, step, world, caller=who)
    for r in range(world):
        data = b"index %d" % r
        cat.fs.write_bytes(f"{rec.directory}/{index_name(r)}", data)  # type: ignore[attr-defined]
        rec = cat.commit_shard(rec.id, r, index_digest(data), 10, caller=who)
    return rec


def _denied(fn: Callable[[], object], owner: str = "alice") -> PermissionDenied:
    with pytest.raises(PermissionDenied) as ei:
        fn()
    e = ei.value
    assert e.code == "PERMISSION_DENIED"
    assert f"belongs to user {owner!r}" in str(e) and e.fields["owner"] == owner
    return e


def test_first_saver_owns_the_job_and_others_are_refused_everything(cat: Catalog) -> None:
    rec = _commit(cat, "llama", 1, ALICE)
    assert rec.owner == "alice" and cat.owner("llama") == "alice"
    fs: LocalFS = cat.fs  # type: ignore[assignment]
    e = _denied(lambda: cat.list("llama", caller=BOB))
    assert rec.id not in str(e) and rec.directory not in str(e)  # whose job, never what it holds
    _denied(lambda: cat.list("llama", include_all=True, caller=BOB))
    _denied(lambda: cat.latest("llama", caller=BOB))
    _denied(lambda: cat.get(rec.id, caller=BOB))
    _denied(lambda: cat.shards(rec.id, caller=BOB))
    _denied(lambda: cat.retention("llama", caller=BOB))
    _denied(lambda: cat.set_retention("llama", RetentionPolicy(keep_last=1), caller=BOB))
    _denied(lambda: cat.pin(rec.id, True, caller=BOB))
    _denied(lambda: cat.delete(rec.id, force=True, caller=BOB))
    _denied(lambda: cat.begin("llama", 2, 1, caller=BOB))  # no saving into alice's job
    pending = cat.begin("llama", 3, 2, caller=ALICE)
    _denied(lambda: cat.commit_shard(pending.id, 0, "0" * 32, 1, caller=BOB))
    _denied(lambda: cat.abort(pending.id, caller=BOB))
    assert cat.jobs(caller=BOB) == []
    # nothing changed by bob's attempts
    after = cat.get(rec.id, caller=ALICE)
    assert after.state is CkptState.COMMITTED and not after.pinned and fs.exists(rec.directory)
    assert cat.retention("llama", caller=ALICE) == RetentionPolicy()
    assert cat.get(pending.id).state is CkptState.PENDING


def test_the_owner_does_everything_on_her_job(cat: Catalog) -> None:
    first = _commit(cat, "llama", 1, ALICE)
    second = _commit(cat, "llama", 2, ALICE)
    assert [r.id for r in cat.list("llama", caller=ALICE)] == [first.id, second.id]
    assert cat.latest("llama", caller=ALICE).id == second.id
    assert len(cat.shards(second.id, caller=ALICE)) == 1
    assert cat.pin(first.id, True, caller=ALICE).pinned
    assert not cat.pin(first.id, False, caller=ALICE).pinned
    assert cat.set_retention("llama", RetentionPolicy(keep_last=5), caller=ALICE).keep_last == 5
    cat.delete(first.id, caller=ALICE)
    with pytest.raises(NotFound):
        cat.get(first.id, caller=ALICE)
    assert cat.jobs(caller=ALICE) == ["llama"]


def test_an_admin_does_everything_on_any_job_and_sees_every_job(cat: Catalog) -> None:
    rec = _commit(cat, "llama", 1, ALICE)
    _commit(cat, "bobs", 1, BOB)
    assert cat.jobs(caller=ADMIN) == ["bobs", "llama"]
    assert cat.jobs(caller=ALICE) == ["llama"] and cat.jobs(caller=BOB) == ["bobs"]
    assert cat.get(rec.id, caller=ADMIN).owner == "alice"
    assert cat.list("llama", caller=ADMIN)[0].id == rec.id
    assert cat.pin(rec.id, True, caller=ADMIN).pinned
    cat.set_retention("llama", RetentionPolicy(keep_last=2), caller=ADMIN)
    more = _commit(cat, "llama", 2, ADMIN)  # an admin may save into it; the job stays alice's
    assert more.owner == "alice" and cat.owner("llama") == "alice"
    cat.delete(rec.id, force=True, caller=ADMIN)
    assert [r.id for r in cat.list("llama", caller=ALICE)] == [more.id]


def test_the_name_stays_taken_after_the_last_checkpoint_is_deleted(cat: Catalog) -> None:
    rec = _commit(cat, "llama", 1, ALICE)
    cat.delete(rec.id, caller=ALICE)
    _denied(lambda: cat.begin("llama", 5, 1, caller=BOB))
    assert cat.jobs(caller=ALICE) == ["llama"]
    assert cat.begin("llama", 5, 1, caller=ALICE).owner == "alice"


def test_setting_a_retention_claims_a_new_job(cat: Catalog) -> None:
    cat.set_retention("fresh", RetentionPolicy(keep_last=1), caller=BOB)
    assert cat.owner("fresh") == "bob"
    _denied(lambda: cat.begin("fresh", 1, 1, caller=ALICE), owner="bob")
    # an unknown job is simply unknown (no owner to name), whoever asks
    with pytest.raises(NotFound):
        cat.list("nobody", caller=ALICE)
    assert cat.retention("nobody", caller=ALICE) == RetentionPolicy()


def test_a_job_from_before_owners_is_admin_only(cat: Catalog) -> None:
    old = _commit(cat, "legacy", 1, None)  # type: ignore[arg-type]  # a catalog without callers
    assert old.owner == ""
    for who in (ALICE, BOB):
        with pytest.raises(PermissionDenied, match="before checkpoints had owners"):
            cat.list("legacy", caller=who)
        with pytest.raises(PermissionDenied):
            cat.begin("legacy", 2, 1, caller=who)
    assert cat.list("legacy", caller=ADMIN)[0].id == old.id
    assert "legacy" not in cat.jobs(caller=ALICE) and "legacy" in cat.jobs(caller=ADMIN)


def test_two_users_racing_for_one_name_get_one_owner(cat: Catalog) -> None:
    import threading

    got: dict[str, object] = {}

    def go(who: CkptCaller) -> None:
        try:
            got[who.user] = cat.begin("race", 1, 1, caller=who)
        except PermissionDenied as e:
            got[who.user] = e

    threads = [threading.Thread(target=go, args=(w,)) for w in (ALICE, BOB)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [u for u, v in got.items() if isinstance(v, CheckpointRecord)]
    assert len(winners) == 1 and cat.owner("race") == winners[0]


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_a_rank_writes_its_shards_and_index_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        fs = LocalFS(tmp_path)
        index = save(fs, "/ck/job/step1", {"w": np.ones(100, np.float32), "step": 1}, rank=0, shard_bytes=1 << 20)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "ck" / "job" / "step1") == DIR_MODE == 0o700
    files = [tmp_path / "ck/job/step1" / s.name for s in index.shards] + [tmp_path / "ck/job/step1" / index_name(0)]
    assert files and all(_mode(f) == FILE_MODE == 0o600 for f in files), {f.name: oct(_mode(f)) for f in files}


def test_write_private_leaves_a_file_system_without_modes_alone(tmp_path: Path) -> None:
    class NoModes:
        def __init__(self) -> None:
            self.files: dict[str, bytes] = {}

        def write_bytes(self, path: str, data: bytes) -> int:
            self.files[path] = bytes(data)
            return len(data)

    fs = NoModes()
    assert write_private(fs, "/a", b"xy") == 2 and fs.files == {"/a": b"xy"}


def test_a_local_catalog_makes_checkpoint_directories_private(cat: Catalog, tmp_path: Path) -> None:
    rec = cat.begin("llama", 1, 1)
    assert _mode(tmp_path / "fs" / rec.directory.lstrip("/")) == 0o700
