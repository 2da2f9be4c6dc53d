"""The scheduler service over real gRPC with fake node agents: submit -> started on the nodes
decide() chose; a run's ranks end -> the chain finishes; logs come from the node; a drained node
gets no tasks."""

from __future__ import annotations

import pytest
from sched_harness import spec


def test_submit_starts_on_nodes_and_finishes(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    for name, zone in (("n1", "A"), ("n2", "A"), ("n3", "B")):
        h.register(name, zone=zone)
    alice = h.client("alice")
    chain = h.run(alice.submit(spec("python", "train.py", nodes=2, name="first")))
    assert chain.user == "alice" and chain.runs[0].chain_status == "waiting_init"
    tid = chain.chain_id
    got = h.wait_chain(tid, lambda c: all(r.state == "running" for r in c.runs[-1].ranks) and c.runs[-1].ranks,
                       "both ranks running")
    run = got.runs[-1]
    # packed inside one zone: the two nodes of zone A
    assert sorted(run.nodes) == ["n1", "n2"] and run.slurm_state == "RUNNING" and run.priority == "NORMAL"
    assert sorted(h.agents.ranks_of(run.id).values()) == ["n1", "n2"]
    launch = h.agents.launches[(run.id, 1)]
    assert launch.command == ("python", "train.py") and launch.nodes == tuple(run.nodes) and launch.restart_count == 0
    nodes = {n.name: n for n in h.run(alice.nodes())}
    assert nodes["n1"].task == run.id and nodes["n3"].task == 0

    h.run(h.agents.write(run.id, 1, "step 1\n"))
    out = h.run(_collect(alice.logs(tid, 1)))
    assert b"rank 1 on" in out and b"step 1" in out

    h.run(h.agents.exit_all(run.id, 0))
    done = h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "finished", "the chain finished")
    assert len(done.runs) == 1 and done.runs[0].slurm_state == "COMPLETED"
    assert [r.state for r in done.runs[0].ranks] == ["succeeded", "succeeded"]
    assert all(n.task == 0 for n in h.run(alice.nodes()))
    assert [c.chain_id for c in h.run(alice.list())] == []
    assert [c.chain_id for c in h.run(alice.list(include_finished=True))] == [tid]


def test_failed_rank_stops_the_others_and_requeues_per_max_restarts(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    h.register("n1")
    h.register("n2")
    alice = h.client("alice")
    tid = h.run(alice.submit(spec("crash", nodes=2, max_restarts=1))).chain_id
    first = h.wait_chain(tid, lambda c: len(h.agents.ranks_of(c.runs[-1].id)) == 2, "running").runs[-1]
    h.run(h.agents.exit(first.id, 0, 3))  # rank 0 fails: rank 1 is stopped, the chain requeued once
    again = h.wait_chain(tid, lambda c: len(c.runs) == 2 and len(h.agents.ranks_of(c.runs[-1].id)) == 2,
                         "the second run running")
    assert again.runs[0].slurm_state == "FAILED" and "FAILED" in again.runs[0].stop_reasons
    assert sorted(r.exit_code for r in again.runs[0].ranks) == [-15, 3]
    assert again.runs[1].restart_count == 1
    h.run(h.agents.exit(again.runs[1].id, 1, 1))  # fails again: max_restarts spent, no third run
    end = h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "finished", "the chain finished")
    assert len(end.runs) == 2 and end.runs[-1].slurm_state == "FAILED"


def test_drained_node_gets_no_tasks(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    for name in ("n1", "n2"):
        h.register(name)
    root, alice = h.client("root"), h.client("alice")
    node = h.run(root.set_node_state("n1", "drained", "bad GPU"))
    assert node.state == "drained" and node.reason == "bad GPU"
    a = h.run(alice.submit(spec(nodes=1))).chain_id
    run = h.wait_chain(a, lambda c: c.runs[-1].chain_status == "running", "a running").runs[-1]
    assert list(run.nodes) == ["n2"]
    b = h.run(alice.submit(spec(nodes=1))).chain_id
    waiting = h.wait_chain(b, lambda c: c.runs[-1].reason_code == "not_enough_nodes", "b waits").runs[-1]
    assert waiting.chain_status == "waiting_init"
    two = h.run(alice.submit(spec(nodes=2))).chain_id
    r = h.wait_chain(two, lambda c: c.runs[-1].reason_code == "drained", "two waits for the drained node").runs[-1]
    assert "bad GPU" in r.reason
    h.run(root.set_node_state("n1", "enabled"))
    h.wait_chain(b, lambda c: c.runs[-1].chain_status == "running", "b runs once n1 is enabled")
    assert ("start", "n1", h.chain(b).runs[-1].id, 0) in h.agents.calls


async def _collect(chunks) -> bytes:  # type: ignore[no-untyped-def]
    out = b""
    async for c in chunks:
        out += c
    return out




def test_a_lost_start_is_sent_again(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched(resend_s=0.5)
    h.register("n1")
    h.agents.lose_next_start.add("n1")
    tid = h.run(h.client("alice").submit(spec(nodes=1))).chain_id
    run = h.wait_chain(tid, lambda c: c.runs[-1].ranks and c.runs[-1].ranks[0].state == "running",
                       "the rank running after a resend").runs[-1]
    assert [c for c in h.agents.calls if c[0] == "start" and c[2] == run.id] == [("start", "n1", run.id, 0)] * 2


def test_a_retried_submit_makes_one_task(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    h.register("n1")
    alice = h.client("alice")
    a = h.run(alice.submit(spec(nodes=1), request_id="req-1"))
    b = h.run(alice.submit(spec(nodes=1), request_id="req-1"))
    assert a.chain_id == b.chain_id
    assert [c.chain_id for c in h.run(alice.list(include_finished=True))] == [a.chain_id]
    # another user's request id is another request
    c = h.run(h.client("bob").submit(spec(nodes=1), request_id="req-1"))
    assert c.chain_id != a.chain_id


def test_a_run_whose_start_was_lost_can_still_be_stopped(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched(resend_s=0.5)
    h.register("n1")
    h.register("n2")
    h.agents.lose_starts.add("n2")
    alice = h.client("alice")
    tid = h.run(alice.submit(spec(nodes=2))).chain_id
    h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "running", "started")
    h.run(alice.stop(tid))  # rank 1 never ran on n2 (every start lost), and n2's agent reports nothing
    end = h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "finished", "stopped all the same")
    assert sorted((r.node, r.state) for r in end.runs[0].ranks) == [("n1", "stopped"), ("n2", "stopped")]
    assert all(n.task == 0 for n in h.run(alice.nodes()))
    assert [r.exit_code for r in end.runs[0].ranks] == [-15, -1]


def test_a_service_drain_with_evict_requeues_the_run_elsewhere(sched) -> None:  # type: ignore[no-untyped-def]
    """The health service (role service) drains a faulty node with evict: the run holding it is stopped
    with HOOK_RESTART and its chain requeued (not finished) onto a healthy node; a user may not drain."""
    from fireflyer.core.errors import InvalidArgument, PermissionDenied

    h = sched()
    for name in ("n1", "n2"):
        h.register(name)
    alice, health = h.client("alice"), h.client("svc-other")
    tid = h.run(alice.submit(spec(nodes=1))).chain_id
    first = h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "running" and c.runs[-1].ranks, "running").runs[-1]
    bad = first.nodes[0]
    good = "n2" if bad == "n1" else "n1"
    with pytest.raises(PermissionDenied):
        h.run(alice.set_node_state(bad, "drained", "I do not like it"))
    with pytest.raises(InvalidArgument):
        h.run(health.set_node_state(bad, "enabled", "", evict=True))
    node = h.run(health.set_node_state(bad, "drained", "xid 79: GPU fell off the bus", evict=True))
    assert node.state == "drained"
    again = h.wait_chain(tid, lambda c: len(c.runs) == 2 and c.runs[-1].chain_status == "running"
                         and c.runs[-1].ranks, "the chain requeued and running on the other node")
    assert "HOOK_RESTART" in again.runs[0].stop_reasons and again.runs[0].chain_status == "finished"
    assert list(again.runs[1].nodes) == [good] and again.runs[1].restart_count == 1
    assert "xid 79" in again.runs[0].reason
    nodes = {n.name: n for n in h.run(alice.nodes())}
    assert nodes[bad].task == 0 and nodes[bad].state == "drained"


def test_a_drain_without_evict_lets_the_run_finish(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    h.register("n1")
    alice, health = h.client("alice"), h.client("svc-other")
    tid = h.run(alice.submit(spec(nodes=1))).chain_id
    run = h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "running" and c.runs[-1].ranks, "running").runs[-1]
    h.run(health.set_node_state("n1", "drained", "periodic validation"))
    h.run(h.agents.exit_all(run.id, 0))
    done = h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "finished", "the chain finished")
    assert len(done.runs) == 1 and done.runs[0].slurm_state == "COMPLETED"
