"""The health service's core with a fake scheduler and fake agents over a real SQLite KV: incidents
drain, validate and re-enable nodes; failures leave them drained; periodic validation; verdicts."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import msgspec
import pytest

from fireflyer.core.clock import ManualClock
from fireflyer.core.errors import FailedPrecondition, InvalidArgument, NotFound
from fireflyer.core.log import get_logger
from fireflyer.health.checks import Baseline, CheckResult, LevelPlan, NodeReport, Status
from fireflyer.health.records import Blame, IncidentRecord, NodeVerdict
from fireflyer.health.states import NodeState
from fireflyer.kv import open_kv
from services.health.core import CoreConfig, HealthCore, SchedNode, plans_for


class FakeSched:
    def __init__(self, *names: str) -> None:
        self.nodes_ = {n: SchedNode(name=n, state="enabled", address=f"agent-{n}") for n in names}
        self.calls: list[tuple[str, str, bool]] = []
        #: evict frees the node at once (the scheduler stopped and requeued its run)
        self.free_on_evict = True
        self.fail = False

    async def nodes(self) -> list[SchedNode]:
        return list(self.nodes_.values())

    async def set_state(self, name: str, state: str, reason: str, *, evict: bool) -> None:
        if self.fail:
            from fireflyer.core.errors import Unavailable
            raise Unavailable("scheduler away")
        self.calls.append((name, state, evict))
        n = self.nodes_[name]
        self.nodes_[name] = msgspec.structs.replace(n, state=state, task=0 if evict and self.free_on_evict else n.task)


class FakeAgents:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, dict[str, str], Baseline]] = []
        self.broken: set[str] = set()

    async def validate(self, address: str, node: str, level: int, *, baseline: Baseline, inject: Mapping[str, str],
                       plan: LevelPlan | None, timeout_s: float) -> NodeReport:
        self.calls.append((node, level, dict(inject), baseline))
        bad = node in self.broken or bool(inject)
        gemm = CheckResult("gemm", Status.FAIL if bad else Status.PASS,
                           "row 3 col 5 wrong" if bad else "ok", {"gemm_gflops": 10.0}, 0.1, inject.get("gemm", ""))
        return NodeReport(level=level, status=gemm.status, results=[gemm])


class Env:
    def __init__(self, tmp: Path, *names: str, **cfg: object) -> None:
        self.kv = open_kv(f"sqlite:///{tmp}/health.db")
        self.sched = FakeSched(*names)
        self.agents = FakeAgents()
        self.clock = ManualClock()
        self.verdicts: list[NodeVerdict] = []
        self.core = HealthCore(CoreConfig(**{"periodic_interval_s": 0.0, "quarantine_s": 0.0, **cfg}), kv=self.kv,  # type: ignore[arg-type]
                               sched=self.sched, agents=self.agents, clock=self.clock, log=get_logger("test"),
                               publish=self.verdicts.append)

    def run(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.get_event_loop().run_until_complete(coro)

    def settle(self, ticks: int = 3) -> None:
        for _ in range(ticks):
            self.run(self.core.tick())
            self.run(self.core.idle())

    def state(self, name: str) -> NodeState:
        return self.run(self.core.node(name)).state


@pytest.fixture
def env(tmp_path: Path):  # type: ignore[no-untyped-def]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    made: list[Env] = []

    def make(*names: str, **cfg: object) -> Env:
        e = Env(tmp_path, *names, **cfg)
        made.append(e)
        return e
    yield make
    for e in made:
        e.kv.close()
    loop.close()


def test_a_node_blaming_incident_drains_validates_and_enables_the_node(env) -> None:  # type: ignore[no-untyped-def]
    e = env("node0", "node1")
    e.sched.nodes_["node1"] = msgspec.structs.replace(e.sched.nodes_["node1"], task=7)
    e.settle(1)
    inc = e.run(e.core.report_incident(IncidentRecord(kind="xid.79", node="node1", summary="GPU fell off the bus",
                                                      evidence={"xid": 79}), reporter="svc-node"))
    assert inc.id == "inc-000001" and inc.task == 7 and inc.reporter == "svc-node" and inc.at > 0
    assert e.sched.calls == [("node1", "drained", True)]  # drained with evict: its run requeued
    assert e.state("node1") is NodeState.DRAINING
    e.settle()
    assert e.sched.calls[-1] == ("node1", "enabled", False)
    assert e.state("node1") is NodeState.HEALTHY
    assert [(c[0], c[1]) for c in e.agents.calls] == [("node1", 2)]  # the incident level
    assert [(v.before, v.after) for v in e.verdicts if v.node == "node1"][-5:] == [
        ("healthy", "suspect"), ("suspect", "draining"), ("draining", "drained"), ("drained", "validating"),
        ("validating", "healthy")]
    assert all(v.incident == inc.id for v in e.verdicts if v.node == "node1" and v.after != "healthy")
    actions = e.run(e.core.incident(inc.id)).actions
    assert actions[0] == "node1 marked suspect"
    assert "drained node1 at the scheduler (its run 7 stopped to be requeued elsewhere)" in actions
    assert any("PASS" in a for a in actions) and actions[-1] == "enabled node1 at the scheduler"
    # the first good run sets the baseline
    assert e.run(e.core.baseline("node1")).values == {"gemm_gflops": 10.0}


def test_a_node_drained_for_an_incident_is_validated_only_after_its_quarantine(env) -> None:  # type: ignore[no-untyped-def]
    """The run it held must be placed elsewhere before a quick pass could hand the node back."""
    e = env("node0", "node1", quarantine_s=30.0)
    e.settle(1)
    inc = e.run(e.core.report_incident(IncidentRecord(kind="c4.noncomm_slow", node="node1")))
    e.settle()
    assert e.state("node1") is NodeState.DRAINED and e.agents.calls == [], "no validation inside the quarantine"
    assert any("after 30 s of quarantine" in a for a in e.run(e.core.incident(inc.id)).actions)
    e.clock.advance(29)
    e.settle()
    assert e.agents.calls == []
    e.clock.advance(2)
    e.settle()
    assert [(c[0], c[1]) for c in e.agents.calls] == [("node1", 2)] and e.state("node1") is NodeState.HEALTHY
    assert e.sched.calls[-1] == ("node1", "enabled", False)


def test_a_node_that_fails_its_validation_stays_drained(env) -> None:  # type: ignore[no-untyped-def]
    e = env("node1")
    e.agents.broken.add("node1")
    e.run(e.core.report_incident(IncidentRecord(kind="c4.hang", node="node1")))
    e.settle()
    h = e.run(e.core.node("node1"))
    assert h.state is NodeState.DRAINED and "FAIL" in h.reason and h.pending_level is None
    assert ("node1", "enabled", False) not in e.sched.calls
    assert len(e.agents.calls) == 1  # not retried in a loop: an operator validates it again
    # an operator's validation that passes brings it back
    e.agents.broken.clear()
    rec, h = e.run(e.core.validate("node1", 1, requested_by="root"))
    assert rec.status is Status.PASS and h.state is NodeState.HEALTHY
    assert e.sched.calls[-1] == ("node1", "enabled", False)


def test_an_on_demand_validation_of_a_healthy_node_drains_it_when_it_fails(env) -> None:  # type: ignore[no-untyped-def]
    e = env("node2")
    e.settle(1)
    rec, h = e.run(e.core.validate("node2", 1, inject={"gemm": "corrupt"}, requested_by="root"))
    assert rec.status is Status.FAIL and rec.inject == {"gemm": "corrupt"} and rec.requested_by == "root"
    assert h.state is NodeState.DRAINED and e.sched.calls == [("node2", "drained", True)]
    # an injected run never sets the baseline
    assert e.run(e.core.baseline("node2")).values == {}
    e.settle()
    assert e.state("node2") is NodeState.DRAINED


def test_validation_is_refused_while_the_node_drains_and_for_unknown_nodes(env) -> None:  # type: ignore[no-untyped-def]
    e = env("node1")
    e.sched.free_on_evict = False
    e.sched.nodes_["node1"] = msgspec.structs.replace(e.sched.nodes_["node1"], task=3)
    e.run(e.core.report_incident(IncidentRecord(kind="xid.48", node="node1")))
    e.settle(1)
    assert e.state("node1") is NodeState.DRAINING  # its run has not left yet
    with pytest.raises(FailedPrecondition):
        e.run(e.core.validate("node1", 1))
    with pytest.raises(NotFound):
        e.run(e.core.validate("node9", 1))
    with pytest.raises(InvalidArgument):
        e.run(e.core.validate("node1", 5))
    # a second incident on a node already out is recorded, nothing more
    inc = e.run(e.core.report_incident(IncidentRecord(kind="xid.48", node="node1")))
    assert "already draining" in inc.actions[-1]
    e.sched.nodes_["node1"] = msgspec.structs.replace(e.sched.nodes_["node1"], task=0)
    e.settle()
    assert e.state("node1") is NodeState.HEALTHY


def test_a_drain_that_did_not_reach_the_scheduler_is_sent_again(env) -> None:  # type: ignore[no-untyped-def]
    e = env("node1")
    e.sched.fail = True
    inc = e.run(e.core.report_incident(IncidentRecord(kind="xid.79", node="node1")))
    assert "FAILED" in inc.actions[-1] and e.state("node1") is NodeState.DRAINING
    e.sched.fail = False
    e.settle()
    assert e.sched.calls[0] == ("node1", "drained", True) and e.state("node1") is NodeState.HEALTHY


def test_link_and_job_incidents_are_recorded_without_a_drain(env) -> None:  # type: ignore[no-untyped-def]
    e = env("node0", "node1")
    inc = e.run(e.core.report_incident(IncidentRecord(kind="link.flap", blame=Blame.LINK, link="node0-node1",
                                                      task=4, job="j1")))
    assert e.sched.calls == [] and "blames a link" in inc.actions[0] and inc.task == 4
    assert [i.id for i in e.run(e.core.incidents(node="node1"))] == [inc.id]
    with pytest.raises(InvalidArgument):
        e.run(e.core.report_incident(IncidentRecord(kind="xid.79")))  # blames a node, names none
    with pytest.raises(InvalidArgument):
        e.run(e.core.report_incident(IncidentRecord(kind=" ", node="node1")))


def test_periodic_validation_drains_without_evicting_one_node_at_a_time(env) -> None:  # type: ignore[no-untyped-def]
    e = env("node0", "node1", periodic_interval_s=100.0)
    e.settle(1)
    assert e.sched.calls == []
    e.clock.advance(101)
    e.run(e.core.tick())
    # one node at a time (periodic_concurrency 1), its task allowed to finish (no evict)
    assert e.sched.calls == [("node0", "drained", False)]
    e.settle(4)
    assert [(c[0], c[1]) for c in e.agents.calls] == [("node0", 3), ("node1", 3)]
    assert e.state("node0") is NodeState.HEALTHY and e.state("node1") is NodeState.HEALTHY
    assert e.run(e.core.node("node0")).last_passed.get(3) is not None
    calls = len(e.agents.calls)
    e.settle(2)
    assert len(e.agents.calls) == calls  # not due again until another interval


def test_quick_sizes_cover_every_level_and_full_leaves_the_runner_sizes() -> None:
    quick = plans_for("quick")
    assert quick is not None and set(quick) == {1, 2, 3} and quick[3].gemm_budget_bytes > 0
    assert plans_for("full") is None
    with pytest.raises(InvalidArgument):
        plans_for("medium")
