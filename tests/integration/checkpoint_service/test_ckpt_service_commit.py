"""The checkpoint service as a process (SQLite KV, local root): concurrent commits by 4 ranks,
the JetStream event, what List/Latest show, retention."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from ckptsvc_harness import commit_rank, committed_events

from fireflyer.ckpt.model import MANIFEST_NAME, CkptState, RetentionPolicy, decode_manifest
from fireflyer.core.errors import NotFound


def test_four_ranks_commit_once_and_publish_once(ckpt_service) -> None:  # type: ignore[no-untyped-def]
    svc = ckpt_service()
    fs = svc.fs()
    barrier = threading.Barrier(4)

    def rank_main(rank: int) -> CkptState:
        # each rank has its own client, as each training process would
        with svc.client() as c:
            rec = c.begin("llama", 100, 4, {"lr": "3e-4"})  # every rank calls Begin and gets the same one
            barrier.wait()
            return commit_rank(c, fs, rec, rank).state

    with ThreadPoolExecutor(4) as pool:
        states = list(pool.map(rank_main, range(4)))
    # exactly one CommitShard was the last one and committed; the others saw it still pending
    assert states.count(CkptState.COMMITTED) == 1 and states.count(CkptState.PENDING) == 3

    with svc.client() as c:
        rec = c.latest("llama")
        assert (rec.step, rec.world_size, rec.ranks_committed, rec.meta) == (100, 4, 4, {"lr": "3e-4"})
        assert rec.state is CkptState.COMMITTED and rec.committed_at > 0
        manifest = decode_manifest((svc.path(rec.directory) / MANIFEST_NAME).read_bytes())
        assert manifest.id == rec.id and [s.rank for s in manifest.shards] == [0, 1, 2, 3]
        assert sum(s.nbytes for s in manifest.shards) == rec.nbytes > 0
        assert [s.rank for s in c.shards(rec.id)] == [0, 1, 2, 3]

        events = committed_events(svc.nats_url, "llama", expect=1)
        assert len(events) == 1
        ev = events[0]
        assert (ev.id, ev.job, ev.step, ev.world_size, ev.directory, ev.nbytes) == (
            rec.id, "llama", 100, 4, rec.directory, rec.nbytes)
        assert ev.committed_at == rec.committed_at

        # a pending checkpoint of a later step is not usable: List and Latest skip it, --all shows it
        pending = c.begin("llama", 200, 2)
        commit_rank(c, fs, pending, 0)
        assert [r.step for r in c.list("llama")] == [100]
        assert c.latest("llama").id == rec.id
        assert {r.step: r.state for r in c.list("llama", include_all=True)} == {
            100: CkptState.COMMITTED, 200: CkptState.PENDING}
        assert c.jobs() == ["llama"]
        with pytest.raises(NotFound):
            c.get("ckpt-nope")


def test_retention_keeps_last_every_and_pinned(ckpt_service) -> None:  # type: ignore[no-untyped-def]
    svc = ckpt_service()
    fs = svc.fs()
    with svc.client() as c:
        policy = c.set_retention("gpt", RetentionPolicy(keep_last=2, keep_every=3))
        assert c.retention("gpt") == policy
        dirs = {}
        for step in range(1, 9):
            rec = c.begin("gpt", step, 1)
            dirs[step] = svc.path(rec.directory)
            assert commit_rank(c, fs, rec, 0).committed
            if step == 2:
                c.pin(rec.id)
        # kept: the newest two (7, 8), multiples of 3 (3, 6), the pinned one (2)
        kept = {r.step for r in c.list("gpt", include_all=True)}
        assert kept == {2, 3, 6, 7, 8}
        assert {s for s, d in dirs.items() if d.exists()} == kept
        # unpinning and tightening the policy deletes what no rule keeps any more
        c.pin(c.list("gpt")[0].id, pinned=False)
        c.set_retention("gpt", RetentionPolicy(keep_last=1, keep_every=0))
        assert [r.step for r in c.list("gpt", include_all=True)] == [8]
        assert {s for s, d in dirs.items() if d.exists()} == {8}
