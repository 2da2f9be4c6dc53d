"""The agent's labels from its settings and instance name, and StartTask validation."""

from __future__ import annotations

import pytest

from fireflyer.api.node.v1 import node_pb2 as pb
from fireflyer.core.errors import InvalidArgument, SettingsError
from services.node.app import AgentSection, AgentSettings, node_facts
from services.node.servicer import spec_from_pb


def test_local_cluster_instances_get_ff_launch_names_addresses_and_zones() -> None:
    s = AgentSettings(state_dir="/tmp/st", agent=AgentSection(zones="A,A,B", gpus=8, worker_command="w --x"))
    facts = [node_facts(s, f"node-{i}", {"FF_SCHED_ADDR": "h:1"}) for i in range(3)]
    assert [(f.name, f.address, f.zone) for f in facts] == [
        ("node0", "127.0.0.1", "A"), ("node1", "127.0.0.2", "A"), ("node2", "127.0.0.3", "B")]
    assert facts[0].gpus == 8 and facts[0].cpus >= 1 and facts[0].worker_prefix == ("w", "--x")
    assert facts[0].sched_addr == "h:1" and len(facts[0].socket_dir) < 60
    assert facts[0].socket_dir != facts[1].socket_dir
    named = node_facts(AgentSettings(agent=AgentSection(name="gpu7", zone="B", address="10.0.0.7")), "node-0", {})
    assert (named.name, named.zone, named.address) == ("gpu7", "B", "10.0.0.7")
    with pytest.raises(SettingsError) as e:
        node_facts(AgentSettings(agent=AgentSection(poll_interval_s=0)), "node-0", {})
    assert e.value.fields["key"] == "agent.poll_interval_s"


def req(**kw: object) -> pb.StartTaskRequest:
    base: dict[str, object] = dict(task_id="t1", command=["x"], ranks=[pb.Rank(rank=0)], nnodes=1)
    base.update(kw)
    return pb.StartTaskRequest(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "field"), [
    ({"task_id": ""}, "task_id"), ({"task_id": "a.b"}, "task_id"), ({"command": []}, "command"),
    ({"ranks": []}, "ranks"), ({"ranks": [pb.Rank(rank=1), pb.Rank(rank=1)]}, "ranks"), ({"grace_s": -1}, "grace_s"),
    ({"nnodes": 2, "node_rank": 2}, "node_rank"),
    ({"nnodes": 2, "hfreduce": pb.HFReduceSpec(peers=["a:1"])}, "hfreduce.peers"),
])
def test_bad_start_requests_name_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        spec_from_pb(req(**kw))
    assert e.value.fields["field"] == field


def test_a_good_request_converts() -> None:
    spec = spec_from_pb(req(grace_s=0, hfreduce=pb.HFReduceSpec(coord_addr="c:1")))
    assert spec.grace_s == 10.0 and spec.hfreduce is not None and spec.hfreduce.coord_addr == "c:1"
    assert spec.world == 1 and spec.job == "t1"
