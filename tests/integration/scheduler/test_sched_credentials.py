"""The task's credential (docs/scheduler.md): the submitter's own token reaches the ranks (the
agents' StartTask, as FF_TOKEN) and nothing else -- no reply carries it, an admin submitting for
another user gives none, and it is gone from the KV once the chain has ended.  Also the agents'
watchdog report (stop code TIMEOUT: failed; requeued only as a user failure under max_restarts,
as should_requeue says, so not here)."""

from __future__ import annotations

import pytest
from sched_harness import spec

from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.core.errors import InvalidArgument
from services.scheduler import store
from services.scheduler.nodeclient import launch_env, signal_number


def _credential(h, chain_id: int) -> str:  # type: ignore[no-untyped-def]
    kv = h.replicas[0].core.kv
    return str(h.run(kv.arun(lambda t: store.load_credential(t, chain_id, snapshot=True))))


def test_the_submitters_token_reaches_the_ranks_only(sched, tokens) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    h.register("n1")
    alice = h.client("alice")
    chain = h.run(alice.submit(spec("train", name="mine")))
    run = h.wait_chain(chain.chain_id, lambda c: c.runs[-1].chain_status == "running", "running").runs[-1]
    launch = h.agents.launches[(run.id, 0)]
    assert launch.token == tokens["alice"]
    assert launch_env(launch)["FF_TOKEN"] == tokens["alice"]
    assert tokens["alice"] not in repr(launch), "a launch's repr (logs, tracebacks) leaves the token out"
    secret = tokens["alice"].encode()
    for reply in (h.run(alice.get(chain.chain_id)), *h.run(h.client("root").list(include_finished=True))):
        assert secret not in reply.SerializeToString()
    assert _credential(h, chain.chain_id) == tokens["alice"]

    h.run(h.agents.exit_all(run.id, 0))
    h.wait_chain(chain.chain_id, lambda c: c.runs[-1].slurm_state == "COMPLETED", "completed")
    assert _credential(h, chain.chain_id) == "", "the chain ended: its credential is gone"


def test_an_admin_submitting_for_someone_else_gives_no_token(sched, tokens) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    h.register("n1")
    chain = h.run(h.client("root").submit(spec("train", user="bob")))
    run = h.wait_chain(chain.chain_id, lambda c: c.runs[-1].chain_status == "running", "running").runs[-1]
    launch = h.agents.launches[(run.id, 0)]
    assert launch.user == "bob" and launch.token == ""
    assert "FF_TOKEN" not in launch_env(launch)


def test_a_stopped_chain_loses_its_credential(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    h.register("n1")
    alice = h.client("alice")
    big = h.run(alice.submit(spec("train")))  # holds n1
    h.wait_chain(big.chain_id, lambda c: c.runs[-1].chain_status == "running", "running")
    waiting = h.run(alice.submit(spec("train")))
    assert _credential(h, waiting.chain_id)
    h.run(alice.stop(waiting.chain_id))
    assert _credential(h, waiting.chain_id) == ""


def test_watchdog_report_fails_the_run_without_requeue(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    h.register("n1")
    h.register("n2")
    chain = h.run(h.client("alice").submit(spec("train", nodes=2)))
    run = h.wait_chain(chain.chain_id, lambda c: c.runs[-1].chain_status == "running"
                       and len(h.agents.ranks_of(c.runs[-1].id)) == 2, "running").runs[-1]
    node = h.agents.ranks_of(run.id)[0]
    svc = h.client("svc-node")
    with pytest.raises(InvalidArgument):
        h.run(svc.report(pb.ReportRequest(task_id=run.id, rank=0, node=node, whole_life_state=-1, stop_code=16)))
    h.run(svc.report(pb.ReportRequest(task_id=run.id, rank=0, node=node, whole_life_state=-1, stop_code=512)))
    done = h.wait_chain(chain.chain_id, lambda c: c.runs[-1].chain_status == "finished", "stopped", 20)
    assert len(done.runs) == 1 and "TIMEOUT" in done.runs[-1].stop_reasons and done.runs[-1].slurm_state == "FAILED"
    assert not h.agents.ranks_of(run.id), "both nodes were stopped"


def test_signal_names() -> None:
    assert signal_number("") == 0 and signal_number("USR1") == signal_number("SIGUSR1") == 10
    assert signal_number("15") == 15
    with pytest.raises(InvalidArgument):
        signal_number("SIGNOPE")
