"""Owners and bad input over raw gRPC (issue 49, point 6): with two user tokens (alice, bob) and an
admin's (root), bob cannot see, stop, suspend, resume, reprioritise or read the logs of alice's
task (PERMISSION_DENIED naming her) and nothing changes; the admin sees all; node and quota changes
are admin-only, registration and reports service-only.  A bad spec is INVALID_ARGUMENT naming the
field and creates nothing.  Quotas cap what a user runs."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from sched_harness import spec

from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.api.scheduler.v1 import scheduler_pb2_grpc as pb_grpc


def _raw(address: str, token: str, calls: list[tuple[str, str, Any]]) -> list[tuple[str, str]]:
    """Each (service, method, request) on a bare stub with ``token``: (status code name, details)."""
    stubs = {"task": pb_grpc.TaskServiceStub, "node": pb_grpc.NodeServiceStub, "quota": pb_grpc.QuotaServiceStub}

    async def run() -> list[tuple[str, str]]:
        out = []
        async with grpc.aio.insecure_channel(address) as ch:
            for kind, method, req in calls:
                call = getattr(stubs[kind](ch), method)(req, metadata=(("authorization", f"Bearer {token}"),),
                                                         timeout=10)
                try:
                    if method == "StreamLogs":
                        reply = [c async for c in call]
                    else:
                        reply = await call
                    out.append(("OK", str(reply)))
                except grpc.aio.AioRpcError as e:
                    out.append((e.code().name, e.details() or ""))
        return out
    return asyncio.run(run())


def test_owners_over_raw_grpc(sched, tokens) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    h.register("n1")
    h.register("n2")
    addr = h.addresses()[0]
    [(code, _)] = _raw(addr, tokens["alice"], [("task", "Create", pb.CreateRequest(spec=spec("a.sh", nodes=1)))])
    assert code == "OK"
    tid = h.run(h.client("alice").list())[0].chain_id
    h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "running" and h.agents.ranks_of(c.runs[-1].id),
                 "alice's task running")
    before = h.chain(tid)

    refused = _raw(addr, tokens["bob"], [
        ("task", "Get", pb.GetRequest(id=tid)),
        ("task", "Stop", pb.TaskIdRequest(id=tid)),
        ("task", "Suspend", pb.TaskIdRequest(id=tid)),
        ("task", "Resume", pb.TaskIdRequest(id=tid)),
        ("task", "UpdatePriority", pb.UpdatePriorityRequest(id=tid, priority="HIGH")),
        ("task", "StreamLogs", pb.LogsRequest(id=tid, rank=0)),
        ("task", "List", pb.ListRequest(user="alice")),
        ("node", "SetState", pb.SetNodeStateRequest(name="n1", state="drained", reason="mine")),
        ("quota", "Set", pb.QuotaSetRequest(quota=pb.Quota(owner="bob", group="default", priority="HIGH",
                                                            max_nodes=9))),
        ("node", "Register", pb.RegisterNodeRequest(name="evil", group="default")),
        ("node", "Report", pb.ReportRequest(task_id=tid, rank=0, node="n1", state="failed", exit_code=1)),
    ])
    assert [c for c, _ in refused] == ["PERMISSION_DENIED"] * len(refused), refused
    assert all("alice" in d for _, d in refused[:6]), refused
    # another service's agent may not report about a node svc-node registered
    [(code, details)] = _raw(addr, tokens["svc-other"], [("node", "Report", pb.ReportRequest(
        task_id=tid, rank=0, node=h.chain(tid).runs[-1].ranks[0].node, state="failed", exit_code=1))])
    assert code == "PERMISSION_DENIED" and "svc-node" in details
    # bob's own list does not show alice's task
    [(code, listed)] = _raw(addr, tokens["bob"], [("task", "List", pb.ListRequest())])
    assert code == "OK" and "a.sh" not in listed
    # nothing changed
    after = h.chain(tid)
    assert after.runs[-1].chain_status == "running" and after.runs[-1].spec.priority == "NORMAL"
    assert after.runs[-1].suspend_code == 0 and len(after.runs) == len(before.runs)
    assert all(n.state == "enabled" for n in h.run(h.client("root").nodes()))
    assert not [n for n in h.run(h.client("root").nodes()) if n.name == "evil"]

    # the owner and the admin may
    ok = _raw(addr, tokens["alice"], [("task", "Get", pb.GetRequest(id=tid)),
                                      ("task", "StreamLogs", pb.LogsRequest(id=tid, rank=0)),
                                      ("task", "UpdatePriority", pb.UpdatePriorityRequest(id=tid, priority="HIGH"))])
    assert [c for c, _ in ok] == ["OK"] * 3 and "a.sh" in ok[1][1]
    admin = _raw(addr, tokens["root"], [("task", "List", pb.ListRequest()),
                                        ("task", "Stop", pb.TaskIdRequest(id=tid))])
    assert [c for c, _ in admin] == ["OK", "OK"] and "a.sh" in admin[0][1]
    h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "finished", "stopped by the admin")


@pytest.mark.parametrize(("request_spec", "field"), [
    (dict(nodes=0), "nodes"),
    (dict(nodes=3), "nodes"),
    (dict(priority="URGENT"), "priority"),
    (dict(group="gpu-h800"), "group"),
    (dict(command=[]), "command"),
    (dict(command=[""]), "command"),
    (dict(grace_ack_s=-1.0), "grace_ack_s"),
    (dict(grace_final_s=1e9), "grace_final_s"),
    (dict(zone="Z"), "zone"),
    (dict(signal="SIGFOO"), "signal"),
])
def test_bad_input_is_invalid_argument_naming_the_field(sched, tokens, request_spec, field) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    h.register("n1")
    h.register("n2")
    fields = {"command": ["x"], "nodes": 1, **request_spec}
    [(code, details)] = _raw(h.addresses()[0], tokens["alice"],
                             [("task", "Create", pb.CreateRequest(spec=pb.TaskSpec(**fields)))])
    assert code == "INVALID_ARGUMENT" and field in details, details
    assert h.run(h.client("root").list(include_finished=True)) == []


def test_quotas_cap_a_user_and_are_admin_only(sched, tokens) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    for n in ("n1", "n2", "n3"):
        h.register(n)
    root, alice = h.client("root"), h.client("alice")
    q = pb.Quota(owner="alice", group="default", priority="NORMAL", max_nodes=1)
    assert [x.owner for x in h.run(root.set_quota(q))] == ["alice"]
    assert [(x.owner, x.max_nodes) for x in h.run(alice.quotas())] == [("alice", 1)]
    a = h.run(alice.submit(spec(nodes=1))).chain_id
    b = h.run(alice.submit(spec(nodes=1))).chain_id
    h.wait_chain(a, lambda c: c.runs[-1].chain_status == "running", "a runs")
    wb = h.wait_chain(b, lambda c: c.runs[-1].reason_code == "over_quota", "b over quota").runs[-1]
    assert "quota" in wb.reason
    used = h.run(alice.used())
    assert [(u.owner, u.priority, u.used, u.limit) for u in used] == [("alice", "NORMAL", 1, 1)]
    # bob's tasks are not alice's quota
    c = h.run(h.client("bob").submit(spec(nodes=1))).chain_id
    h.wait_chain(c, lambda ch: ch.runs[-1].chain_status == "running", "bob runs")
    # raising it lets b start
    h.run(root.set_quota(pb.Quota(owner="alice", group="default", priority="NORMAL", max_nodes=2)))
    h.wait_chain(b, lambda ch: ch.runs[-1].chain_status == "running", "b runs under the raised quota")
    [(code, details)] = _raw(h.addresses()[0], tokens["alice"], [("quota", "Used", pb.QuotaGetRequest(owner="bob"))])
    assert code == "PERMISSION_DENIED"
    [(code, details)] = _raw(h.addresses()[0], tokens["root"], [
        ("quota", "Set", pb.QuotaSetRequest(quota=pb.Quota(owner="alice", group="default", priority="AUTO")))])
    assert code == "INVALID_ARGUMENT" and "priority" in details
