"""Preemption through the service: a higher-priority submit interrupts a lower run (the suspend
flag to every node of it); the fake runtime acknowledges and goes; the agents stop it; the chain is
requeued as its next run with restart_count 1 and whole_life_state carried, and restarts once the
high run is done.  An unacknowledged interrupt is stopped after the acknowledge grace; a user's
suspend holds the chain until resume."""

from __future__ import annotations

from sched_harness import spec


def _running(h, tid):  # type: ignore[no-untyped-def]
    return h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "running"
                        and len(h.agents.ranks_of(c.runs[-1].id)) == len(c.runs[-1].ranks), f"{tid} running").runs[-1]


def test_high_priority_preempts_low_which_is_requeued_and_resumes(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    for n in ("n1", "n2"):
        h.register(n)
    alice, bob = h.client("alice"), h.client("bob")
    low = h.run(alice.submit(spec("train", nodes=2, priority="LOW", name="low"))).chain_id
    low_run = _running(h, low)

    high = h.run(bob.submit(spec("eval", nodes=2, priority="HIGH", name="high"))).chain_id
    # the interrupt goes to every node of the low run, not rank 0 only
    h.wait_chain(low, lambda c: c.runs[-1].suspend_code == 1, "suspend sent")
    assert {(low_run.id, "n1"), (low_run.id, "n2")} <= h.agents.flags
    hc = h.chain(high)
    assert hc.runs[-1].reason_code == "waiting_release" and str(low_run.id) in hc.runs[-1].reason
    assert h.chain(low).runs[-1].slurm_state == "PREEMPTED"

    h.run(h.agents.ack(low_run.id))
    h.wait_chain(low, lambda c: c.runs[-1].suspend_code == 2, "acknowledged")
    h.run(h.agents.go_suspend(low_run.id, whole_life_state=7))  # saved: stop it now, carry state 7
    requeued = h.wait_chain(low, lambda c: len(c.runs) == 2, "low requeued")
    first, second = requeued.runs
    assert first.chain_status == "finished" and "INTERRUPT" in first.stop_reasons
    assert first.slurm_state == "PREEMPTED"
    assert second.restart_count == 1 and second.chain_status == "suspended" and second.slurm_state == "REQUEUED"
    assert second.whole_life_state == 7 and second.chain_id == low
    assert [c[0] for c in h.agents.calls if c[2] == first.id and c[0] == "stop"] == ["stop", "stop"]

    high_run = _running(h, high)
    assert sorted(high_run.nodes) == ["n1", "n2"]
    assert h.chain(low).runs[-1].chain_status == "suspended"
    h.run(h.agents.exit_all(high_run.id, 0))
    resumed = _running(h, low)
    assert resumed.id == second.id and resumed.restart_count == 1
    launch = h.agents.launches[(resumed.id, 0)]
    assert launch.restart_count == 1 and launch.whole_life_state == 7 and launch.chain_id == low


def test_unacknowledged_interrupt_is_stopped_after_the_ack_grace(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched(grace_ack_s=0.5)
    h.register("n1")
    alice, bob = h.client("alice"), h.client("bob")
    low = h.run(alice.submit(spec(nodes=1, priority="LOW"))).chain_id
    low_run = _running(h, low)
    h.run(bob.submit(spec(nodes=1, priority="HIGH")))
    # no ack: after grace_ack_s the agents are told to stop it, and it is requeued
    got = h.wait_chain(low, lambda c: len(c.runs) == 2, "low stopped and requeued")
    assert ("stop", "n1", low_run.id, 1.0) in h.agents.calls
    assert got.runs[0].ranks[0].exit_code == -15 and got.runs[1].restart_count == 1


def test_user_suspend_holds_the_chain_until_resume(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched(grace_ack_s=0.3)
    h.register("n1")
    alice = h.client("alice")
    tid = h.run(alice.submit(spec(nodes=1))).chain_id
    run = _running(h, tid)
    h.run(alice.suspend(tid))
    held = h.wait_chain(tid, lambda c: len(c.runs) == 2, "suspended and requeued").runs[-1]
    assert held.held and held.reason_code == "held"
    assert ("suspend", "n1", run.id, "") in h.agents.calls
    # held: it does not start although n1 is free
    h.run(h.replicas[h.leader()].core.cycle_once())
    assert h.chain(tid).runs[-1].chain_status == "suspended"
    h.run(alice.resume(tid))
    again = _running(h, tid)
    assert again.restart_count == 1 and not again.held


def test_stop_ends_a_running_chain_without_requeue(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    h.register("n1")
    alice = h.client("alice")
    tid = h.run(alice.submit(spec(nodes=1))).chain_id
    _running(h, tid)
    h.run(alice.stop(tid))
    end = h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "finished", "stopped")
    assert len(end.runs) == 1 and end.runs[0].slurm_state == "CANCELLED"
    assert "MANUAL_STOP" in end.runs[0].stop_reasons and ("stop", "n1", end.runs[0].id, 1.0) in h.agents.calls


def test_lost_node_fails_its_runs_with_node_lost_and_they_are_requeued_elsewhere(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched(node_timeout_s=1.0, heartbeat_interval_s=0.2)
    for n in ("n1", "n2", "n3"):
        h.register(n)
    stop_beats = h.heartbeat("n2", "n3")
    try:
        stop_n1 = h.heartbeat("n1")
        alice = h.client("alice")
        tid = h.run(alice.submit(spec(nodes=2))).chain_id
        first = _running(h, tid)
        assert sorted(first.nodes) == ["n1", "n2"]
        stop_n1()  # n1's agent dies: silent past node_timeout_s
        got = h.wait_chain(tid, lambda c: len(c.runs) == 2 and c.runs[-1].chain_status == "running",
                           "requeued and running on the other nodes")
        assert "NODE_LOST" in got.runs[0].stop_reasons and got.runs[0].slurm_state == "FAILED"
        assert "n1 lost" in got.runs[0].reason
        assert sorted(got.runs[1].nodes) == ["n2", "n3"] and got.runs[1].restart_count == 1
        nodes = {n.name: n for n in h.run(alice.nodes())}
        assert nodes["n1"].lost and not nodes["n2"].lost and nodes["n1"].task == 0
        # its heartbeat brings it back
        h.register("n1")
        assert not {n.name: n for n in h.run(alice.nodes())}["n1"].lost
    finally:
        stop_beats()
