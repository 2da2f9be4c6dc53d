"""NATS killed with -9 during checkpoint commits and restarted on its port: the commits do not wait
for it, and every ``committed`` event is delivered once it is back (issue 48, point 7)."""

from __future__ import annotations

import time

from ckptsvc_harness import commit_rank, committed_events


def test_commits_during_a_nats_kill_9_are_all_published_after_its_restart(ckpt_service, nats_server) -> None:  # type: ignore[no-untyped-def]
    svc = ckpt_service()
    ids: list[str] = []
    with svc.client() as c:
        def commit(step: int) -> float:
            rec = c.begin("nk", step, 1)
            t0 = time.monotonic()
            commit_rank(c, svc.fs(), rec, 0)
            ids.append(rec.id)
            return time.monotonic() - t0

        for step in (1, 2):
            commit(step)
        port = nats_server.port
        nats_server.kill()
        # before the outbox, each of these waited publish_timeout_s and then dropped its event
        slowest = max(commit(step) for step in (3, 4, 5))
        assert slowest < 1.5, f"a commit waited {slowest:.1f}s on the dead bus"
        nats_server.start()  # the same command line: the same port, the same JetStream store
        assert nats_server.port == port
        commit(6)
        assert c.latest("nk").id == ids[-1]

    events = committed_events(svc.nats_url, "nk", expect=len(ids), timeout_s=20.0)
    assert [e.id for e in events] == ids, "every commit's event, once each, in commit order"
    assert [e.step for e in events] == [1, 2, 3, 4, 5, 6]
