"""The node health state machine: every legal transition with its actions, and every illegal one."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from fireflyer.health.states import (
    ACCEPTS,
    Action,
    ActionKind,
    Drain,
    Drained,
    IllegalTransition,
    Incident,
    NodeHealth,
    NodeState,
    ValidationFailed,
    ValidationPassed,
    ValidationStarted,
    transition,
)

H = NodeState

ALL_EVENTS = [Incident(incident="inc-1", reason="xid 79"), Drain(reason="xid 79", level=2, evict=True), Drained(),
              ValidationStarted(validation="v1", level=2), ValidationPassed(validation="v1", level=2),
              ValidationFailed(validation="v1", level=2, reason="gemm FAIL")]


def node(state: NodeState, **kw: object) -> NodeHealth:
    return NodeHealth(name="node1", state=state, **kw)  # type: ignore[arg-type]


def test_incident_makes_a_healthy_node_suspect_without_an_action() -> None:
    t = transition(node(H.HEALTHY), Incident(incident="inc-1", reason="C4: node1 hung"), now=10.0)
    assert (t.before, t.after, t.actions) == (H.HEALTHY, H.SUSPECT, ())
    assert t.health.incident == "inc-1" and t.health.since == 10.0 and t.reason == "C4: node1 hung"
    # a second incident on a suspect node keeps it suspect and names the newer incident
    t2 = transition(t.health, Incident(incident="inc-2", reason="xid 74"), now=11.0)
    assert t2.after is H.SUSPECT and t2.health.incident == "inc-2"


@pytest.mark.parametrize("start", [H.HEALTHY, H.SUSPECT])
@pytest.mark.parametrize("evict", [True, False])
def test_drain_asks_the_scheduler_to_drain_and_remembers_the_level(start: NodeState, evict: bool) -> None:
    t = transition(node(start), Drain(reason="xid 79", level=2, evict=evict), now=5.0)
    assert t.after is H.DRAINING
    assert t.actions == (Action(kind=ActionKind.DRAIN, reason="xid 79", evict=evict),)
    assert t.health.drained and t.health.pending_level == 2


def test_drained_requests_the_pending_validation() -> None:
    h = transition(node(H.SUSPECT), Drain(reason="xid 79", level=2), now=1.0).health
    t = transition(h, Drained(), now=2.0)
    assert t.after is H.DRAINED
    assert t.actions == (Action(kind=ActionKind.VALIDATE, level=2, reason="xid 79"),)


def test_drained_without_a_pending_level_asks_nothing() -> None:
    t = transition(node(H.DRAINING, drained=True, pending_level=None, reason="r"), Drained(), now=2.0)
    assert t.after is H.DRAINED and t.actions == ()


def test_validation_start_clears_the_pending_level() -> None:
    h = node(H.DRAINED, drained=True, pending_level=2)
    t = transition(h, ValidationStarted(validation="v7", level=2), now=3.0)
    assert t.after is H.VALIDATING and t.actions == () and t.health.pending_level is None
    assert t.health.validation == "v7"


def test_a_drained_node_that_passes_is_enabled() -> None:
    h = node(H.VALIDATING, drained=True, incident="inc-1")
    t = transition(h, ValidationPassed(validation="v7", level=2), now=4.0)
    assert t.after is H.HEALTHY
    assert [a.kind for a in t.actions] == [ActionKind.ENABLE]
    assert not t.health.drained and t.health.incident == "" and t.health.last_passed == {2: 4.0}


def test_a_node_validated_in_service_that_passes_needs_no_enable() -> None:
    h = transition(node(H.HEALTHY), ValidationStarted(validation="v1", level=1), now=1.0).health
    t = transition(h, ValidationPassed(validation="v1", level=1), now=2.0)
    assert t.after is H.HEALTHY and t.actions == ()


def test_a_drained_node_that_fails_stays_drained_with_no_action() -> None:
    h = node(H.VALIDATING, drained=True)
    t = transition(h, ValidationFailed(validation="v7", level=2, reason="gemm: FAIL"), now=4.0)
    assert t.after is H.DRAINED and t.actions == () and t.health.drained
    assert "gemm: FAIL" in t.reason and t.health.pending_level is None


def test_a_node_validated_in_service_that_fails_is_drained_and_its_task_evicted() -> None:
    h = transition(node(H.HEALTHY), ValidationStarted(validation="v1", level=1), now=1.0).health
    t = transition(h, ValidationFailed(validation="v1", level=1, reason="cpu: FAIL"), now=2.0)
    assert t.after is H.DRAINED and t.health.drained
    assert len(t.actions) == 1 and t.actions[0].kind is ActionKind.DRAIN and t.actions[0].evict


def test_the_full_incident_cycle_returns_the_node_to_service() -> None:
    h = node(H.HEALTHY)
    seen = [h.state]
    kinds: list[ActionKind] = []
    for ev in (Incident(incident="i", reason="xid"), Drain(reason="xid", level=2), Drained(),
               ValidationStarted(validation="v", level=2), ValidationPassed(validation="v", level=2)):
        t = transition(h, ev, now=1.0)
        h = t.health
        seen.append(h.state)
        kinds += [a.kind for a in t.actions]
    assert seen == [H.HEALTHY, H.SUSPECT, H.DRAINING, H.DRAINED, H.VALIDATING, H.HEALTHY]
    assert kinds == [ActionKind.DRAIN, ActionKind.VALIDATE, ActionKind.ENABLE]


ILLEGAL = [(s, e) for s, e in itertools.product(NodeState, ALL_EVENTS) if not isinstance(e, ACCEPTS[s])]


def test_the_illegal_table_is_what_the_design_says() -> None:
    illegal = {(s.value, type(e).__name__) for s, e in ILLEGAL}
    assert ("draining", "ValidationStarted") in illegal  # a node whose task still runs is not validated
    assert ("validating", "Drain") in illegal and ("validating", "Incident") in illegal
    assert ("drained", "Incident") in illegal and ("healthy", "Drained") in illegal
    assert ("healthy", "ValidationPassed") in illegal and ("drained", "ValidationFailed") in illegal
    assert len(ILLEGAL) == 5 * 6 - sum(len(v) for v in ACCEPTS.values())


@pytest.mark.parametrize(("state", "event"), ILLEGAL, ids=[f"{s.value}-{type(e).__name__}" for s, e in ILLEGAL])
def test_illegal_transitions_raise_and_change_nothing(state: NodeState, event: object) -> None:
    h = node(state, reason="before")
    with pytest.raises(IllegalTransition) as info:
        transition(h, event, now=1.0)  # type: ignore[arg-type]
    assert info.value.fields["node"] == "node1" and info.value.fields["state"] == state.value
    assert info.value.code == "FAILED_PRECONDITION"
    assert h.state is state and h.reason == "before"


def test_node_health_round_trips_through_msgpack() -> None:
    h = node(H.DRAINED, drained=True, pending_level=3, last_passed={1: 1.5, 3: 2.5})
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(h), type=NodeHealth) == h
