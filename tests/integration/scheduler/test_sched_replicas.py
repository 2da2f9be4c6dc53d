"""Two replicas, one leader by lease: the follower serves reads and refuses writes naming the
leader; the leader killed mid-preemption (it keeps its lease, as after SIGKILL) -> the other takes
over within the lease, every task intact, and finishes the preemption.  And the same service over
PostgreSQL keeps its tasks across a restart."""

from __future__ import annotations

import time

import pytest
from sched_harness import TIMING, spec
from test_sched_owners_input import _raw

from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb


def test_follower_refuses_writes_naming_the_leader_and_serves_reads(sched, tokens) -> None:  # type: ignore[no-untyped-def]
    h = sched(replicas=2)
    h.register("n1")
    lead = h.leader()
    follower = h.replicas[1 - lead]
    tid = h.run(h.client("alice").submit(spec(nodes=1))).chain_id
    [(code, details)] = _raw(follower.address, tokens["alice"], [("task", "Create", pb.CreateRequest(
        spec=spec(nodes=1)))])
    assert code == "FAILED_PRECONDITION" and "not the leader" in details
    assert h.replicas[lead].address in details
    [(code, got)] = _raw(follower.address, tokens["alice"], [("task", "Get", pb.GetRequest(id=tid))])
    assert code == "OK" and f"chain_id: {tid}" in got


def test_leader_killed_mid_preemption_the_other_takes_over(sched) -> None:  # type: ignore[no-untyped-def]
    h = sched(replicas=2, grace_ack_s=30.0)
    for n in ("n1", "n2", "n3"):
        h.register(n)
    alice, bob = h.client("alice"), h.client("bob")
    low = h.run(alice.submit(spec(nodes=2, priority="LOW"))).chain_id
    low_run = h.wait_chain(low, lambda c: len(h.agents.ranks_of(c.runs[-1].id)) == 2, "low running").runs[-1]
    other = h.run(alice.submit(spec(nodes=1, priority="LOW"))).chain_id
    h.wait_chain(other, lambda c: c.runs[-1].chain_status == "running", "other running")
    high = h.run(bob.submit(spec(nodes=2, priority="HIGH"))).chain_id
    h.wait_chain(low, lambda c: c.runs[-1].suspend_code == 1, "low interrupted")
    before = {tid: h.chain(tid) for tid in (low, other, high)}

    old = h.leader()
    killed_at = time.monotonic()
    h.crash(old)
    new = h.leader(timeout_s=TIMING["lease_s"] + 5)
    took = time.monotonic() - killed_at
    assert new != old and took < TIMING["lease_s"] + 2 * TIMING["renew_s"] + 1.0, took
    # every task as it was
    for tid, chain in before.items():
        now = h.chain(tid)
        assert [(r.id, r.chain_status, list(r.nodes), r.suspend_code) for r in now.runs] == \
            [(r.id, r.chain_status, list(r.nodes), r.suspend_code) for r in chain.runs]
    # the new leader re-sent the interrupt in flight, and finishes the preemption
    sends = [c for c in h.agents.calls if c[0] == "suspend" and c[2] == low_run.id]
    assert len(sends) >= 4  # two nodes, by each leader
    h.run(h.agents.go_suspend(low_run.id))
    got = h.wait_chain(low, lambda c: len(c.runs) == 2, "low requeued by the new leader")
    assert got.runs[1].restart_count == 1
    h.wait_chain(high, lambda c: c.runs[-1].chain_status == "running", "high runs under the new leader")


@pytest.mark.postgres
def test_tasks_persist_in_postgresql_across_a_restart(sched, pg_dsn, pg_schema) -> None:  # type: ignore[no-untyped-def]
    url = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}schema={pg_schema}"
    h = sched(kv_url=url)
    h.register("n1", zone="A")
    h.register("n2", zone="B")
    root, alice = h.client("root"), h.client("alice")
    h.run(root.set_quota(pb.Quota(owner="alice", group="default", priority="HIGH", max_nodes=1)))
    a = h.run(alice.submit(spec(nodes=2, name="wide"))).chain_id  # spans the zones (the only one that may)
    run = h.wait_chain(a, lambda c: c.runs[-1].chain_status == "running", "a running").runs[-1]
    assert sorted(run.nodes) == ["n1", "n2"]
    b = h.run(alice.submit(spec(nodes=1, priority="HIGH"))).chain_id
    h.run(root.set_node_state("n2", "drained", "disk"))
    h.close()

    h2 = sched(kv_url=url)
    assert h2.chain(a).runs[-1].chain_status == "running" and sorted(h2.chain(a).runs[-1].nodes) == ["n1", "n2"]
    assert h2.chain(b).runs[-1].spec.priority == "HIGH"
    nodes = {n.name: n for n in h2.run(h2.client("root").nodes())}
    assert nodes["n2"].state == "drained" and nodes["n2"].reason == "disk" and nodes["n1"].task == run.id
    assert [(q.owner, q.priority, q.max_nodes) for q in h2.run(h2.client("root").quotas())] == [("alice", "HIGH", 1)]
    # the restarted service leads and decides: b (HIGH) waits for the interrupted run a to release n1
    got = h2.wait_chain(b, lambda c: c.runs[-1].reason_code == "waiting_release", "b waits for a's nodes")
    assert str(run.id) in got.runs[-1].reason and h2.chain(a).runs[-1].suspend_code >= 1
