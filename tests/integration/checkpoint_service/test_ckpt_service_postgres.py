"""The checkpoint service over PostgreSQL: the same commit protocol, with ranks committing at once
(serializable transactions conflicting and retrying in the KV), retention and a restart."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from ckptsvc_harness import commit_rank, committed_events

from fireflyer.ckpt.model import MANIFEST_NAME, CkptState, RetentionPolicy
from fireflyer.core.errors import FailedPrecondition


def test_commit_retention_and_restart_on_postgres(ckpt_service, pg_dsn: str, pg_schema: str) -> None:  # type: ignore[no-untyped-def]
    url = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={pg_schema}"
    svc = ckpt_service(FF_CHECKPOINT_KV_URL=url)
    fs = svc.fs()
    world = 4

    def save_step(step: int) -> list[CkptState]:
        barrier = threading.Barrier(world)

        def rank_main(rank: int) -> CkptState:
            with svc.client() as c:
                rec = c.begin("pgjob", step, world, retention=RetentionPolicy(keep_last=2))
                barrier.wait()
                return commit_rank(c, fs, rec, rank).state

        with ThreadPoolExecutor(world) as pool:
            return list(pool.map(rank_main, range(world)))

    for step in (10, 20, 30):
        assert sorted(save_step(step)) == sorted([CkptState.COMMITTED] + [CkptState.PENDING] * (world - 1))

    with svc.client() as c:
        recs = c.list("pgjob", include_all=True)
        assert [(r.step, r.state, r.ranks_committed) for r in recs] == [
            (20, CkptState.COMMITTED, world), (30, CkptState.COMMITTED, world)]
        assert all((svc.path(r.directory) / MANIFEST_NAME).exists() for r in recs)
        with pytest.raises(FailedPrecondition):
            c.begin("pgjob", 25, world)
        assert c.retention("pgjob") == RetentionPolicy(keep_last=2)
    assert sorted(e.step for e in committed_events(svc.nats_url, "pgjob", expect=3)) == [10, 20, 30]

    svc.restart()
    with svc.client() as c:
        assert c.latest("pgjob").step == 30 and [r.step for r in c.list("pgjob")] == [20, 30]
