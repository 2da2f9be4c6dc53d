"""Node registry: heartbeats, failure scans, recovery, events; and registry -> chain update."""

from __future__ import annotations

import msgspec
import pytest

from fireflyer.bus.events import decode, encode
from fireflyer.core.clock import ManualClock
from fireflyer.core.errors import InvalidArgument
from fireflyer.mgmt.chains import update_chains
from fireflyer.mgmt.model import Chain, ChainTarget, LocalState, NodeStatus, NodeType, PublicState
from fireflyer.mgmt.registry import (
    DEFAULT_FAIL_INTERVAL_S,
    DEFAULT_HEARTBEAT_INTERVAL_S,
    Heartbeat,
    NodeFailed,
    NodeRecovered,
    NodeRegistered,
    RegistryEvent,
    RegistryState,
    TargetReport,
    TargetStateChanged,
    apply_heartbeat,
    grace_after_takeover,
    local_states,
    scan_failures,
)

L = LocalState
FAIL = 60.0


def storage_hb(node: str, **targets: LocalState) -> Heartbeat:
    return Heartbeat(
        node_id=node,
        node_type=NodeType.STORAGE,
        address=f"{node}:9000",
        hostname=f"host-{node}",
        targets=tuple(TargetReport(target_id=int(t[1:]), local_state=s) for t, s in targets.items()),
    )


def meta_hb(node: str) -> Heartbeat:
    return Heartbeat(node_id=node, node_type=NodeType.META, address=f"{node}:8000")


def test_defaults_are_3fs() -> None:
    assert (DEFAULT_HEARTBEAT_INTERVAL_S, DEFAULT_FAIL_INTERVAL_S) == (10.0, 60.0)


def test_first_heartbeat_registers_node_and_targets() -> None:
    clock = ManualClock()
    st, ev = apply_heartbeat(RegistryState(), storage_hb("s1", t1=L.UPTODATE, t2=L.ONLINE), clock.time())
    n = st.nodes["s1"]
    assert (n.status, n.type, n.address, n.hostname) == (
        NodeStatus.ALIVE,
        NodeType.STORAGE,
        "s1:9000",
        "host-s1",
    )
    assert n.last_heartbeat == n.registered_at == clock.time()
    assert local_states(st) == {1: L.UPTODATE, 2: L.ONLINE}
    assert [type(e) for e in ev] == [NodeRegistered, TargetStateChanged, TargetStateChanged]
    assert ev[1].target_id == 1 and ev[1].old is None and ev[1].new is L.UPTODATE
    assert all(e.sent_at == clock.time() for e in ev)


def test_repeated_heartbeat_refreshes_without_events() -> None:
    clock = ManualClock()
    st, _ = apply_heartbeat(RegistryState(), storage_hb("s1", t1=L.UPTODATE), clock.time())
    clock.advance(10)
    st2, ev = apply_heartbeat(st, storage_hb("s1", t1=L.UPTODATE), clock.time())
    assert ev == []
    assert st2.nodes["s1"].last_heartbeat == clock.time()
    assert st2.targets[1] == st.targets[1]  # unchanged target record, `since` kept
    assert st.nodes["s1"].last_heartbeat == clock.time() - 10  # inputs are not mutated


def test_target_state_change_and_omitted_target() -> None:
    clock = ManualClock()
    st, _ = apply_heartbeat(RegistryState(), storage_hb("s1", t1=L.ONLINE, t2=L.UPTODATE), clock.time())
    clock.advance(10)
    st, ev = apply_heartbeat(st, storage_hb("s1", t1=L.UPTODATE), clock.time())
    assert local_states(st) == {1: L.UPTODATE, 2: L.OFFLINE}
    changes = {(e.target_id, e.old, e.new) for e in ev if isinstance(e, TargetStateChanged)}
    assert changes == {(1, L.ONLINE, L.UPTODATE), (2, L.UPTODATE, L.OFFLINE)}
    assert st.targets[1].since == clock.time()


def test_silent_node_fails_after_the_interval_and_its_targets_go_offline() -> None:
    clock = ManualClock()
    st, _ = apply_heartbeat(RegistryState(), storage_hb("s1", t1=L.UPTODATE, t2=L.ONLINE), clock.time())
    st, _ = apply_heartbeat(st, storage_hb("s2", t3=L.UPTODATE), clock.time())
    st, _ = apply_heartbeat(st, meta_hb("meta1"), clock.time())
    for _ in range(5):  # s2 and meta1 keep heartbeating every 10 s; s1 went silent
        clock.advance(10)
        st, _ = apply_heartbeat(st, storage_hb("s2", t3=L.UPTODATE), clock.time())
        st, _ = apply_heartbeat(st, meta_hb("meta1"), clock.time())
        res = scan_failures(st, clock.time(), FAIL)
        assert res.failed == () and res.state is st and res.events == []
    clock.advance(10)  # 60 s since s1's last heartbeat
    res = scan_failures(st, clock.time(), FAIL)
    assert res.failed == ("s1",) and res.offlined == (1, 2)
    assert res.state.nodes["s1"].status is NodeStatus.HEARTBEAT_FAILED
    assert local_states(res.state) == {1: L.OFFLINE, 2: L.OFFLINE, 3: L.UPTODATE}
    failed = [e for e in res.events if isinstance(e, NodeFailed)]
    assert len(failed) == 1 and failed[0].targets == (1, 2) and failed[0].last_heartbeat == clock.time() - 60
    assert {(e.target_id, e.new) for e in res.events if isinstance(e, TargetStateChanged)} == {
        (1, L.OFFLINE),
        (2, L.OFFLINE),
    }
    # scanning again does not fail it twice
    clock.advance(10)
    again = scan_failures(res.state, clock.time(), FAIL)
    assert again.failed == () and again.events == []


def test_just_under_the_interval_is_alive() -> None:
    st, _ = apply_heartbeat(RegistryState(), meta_hb("meta1"), 1000.0)
    assert scan_failures(st, 1000.0 + FAIL - 0.001, FAIL).failed == ()
    assert scan_failures(st, 1000.0 + FAIL, FAIL).failed == ("meta1",)


def test_failed_node_heartbeating_again_recovers() -> None:
    clock = ManualClock()
    st, _ = apply_heartbeat(RegistryState(), storage_hb("s1", t1=L.UPTODATE), clock.time())
    down_since = clock.time()
    clock.advance(70)
    st = scan_failures(st, clock.time(), FAIL).state
    clock.advance(5)
    st, ev = apply_heartbeat(st, storage_hb("s1", t1=L.ONLINE), clock.time())
    n = st.nodes["s1"]
    assert n.status is NodeStatus.ALIVE and n.registered_at == clock.time()
    assert isinstance(ev[0], NodeRecovered) and ev[0].down_since == down_since
    assert [(e.old, e.new) for e in ev if isinstance(e, TargetStateChanged)] == [(L.OFFLINE, L.ONLINE)]


def test_disabled_node_is_left_to_the_operator() -> None:
    st, _ = apply_heartbeat(RegistryState(), meta_hb("meta1"), 0.0)
    st = RegistryState(
        nodes={"meta1": msgspec.structs.replace(st.nodes["meta1"], status=NodeStatus.DISABLED)}
    )
    assert scan_failures(st, 1000.0, FAIL).failed == ()
    st2, ev = apply_heartbeat(st, meta_hb("meta1"), 1000.0)
    assert st2.nodes["meta1"].status is NodeStatus.DISABLED and ev == []


def test_node_id_reused_by_another_type_is_refused() -> None:
    st, _ = apply_heartbeat(RegistryState(), meta_hb("n1"), 0.0)
    with pytest.raises(InvalidArgument) as ei:
        apply_heartbeat(st, storage_hb("n1", t1=L.UPTODATE), 1.0)
    assert ei.value.node == "n1" and ei.value.expected == "meta" and ei.value.got == "storage"
    assert "unique node id" in str(ei.value)


def test_grace_after_takeover_restarts_the_fail_clock() -> None:
    st, _ = apply_heartbeat(RegistryState(), meta_hb("meta1"), 0.0)
    st = grace_after_takeover(st, 500.0)  # a new primary loaded the registry at t=500
    assert scan_failures(st, 500.0 + FAIL - 1, FAIL).failed == ()
    assert scan_failures(st, 500.0 + FAIL, FAIL).failed == ("meta1",)


def test_bad_interval_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        scan_failures(RegistryState(), 0.0, 0.0)


def test_events_round_trip_on_the_bus_with_stable_ids() -> None:
    st, ev1 = apply_heartbeat(RegistryState(), storage_hb("s1", t1=L.UPTODATE), 100.0)
    _, ev2 = apply_heartbeat(RegistryState(), storage_hb("s1", t1=L.UPTODATE), 100.0)
    assert [e.event_id for e in ev1] == [e.event_id for e in ev2]  # same decision, same id
    res = scan_failures(st, 200.0, FAIL)
    for e in [*ev1, *res.events]:
        assert decode(encode(e), RegistryEvent) == e
    hb = storage_hb("s1", t1=L.ONLINE)
    assert decode(encode(hb), Heartbeat) == hb
    assert b'"type":"mgmt.heartbeat.v1"' in encode(hb)


def test_registry_state_round_trips_as_msgpack() -> None:
    st, _ = apply_heartbeat(RegistryState(), storage_hb("s1", t1=L.UPTODATE), 100.0)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(st), type=RegistryState) == st


def test_storage_node_death_flows_into_the_chain_update() -> None:
    """Heartbeats -> registry -> local states -> chain update, with time passed in."""
    clock = ManualClock()
    st = RegistryState()
    for node, tid in (("s1", "t1"), ("s2", "t2"), ("s3", "t3")):
        st, _ = apply_heartbeat(st, storage_hb(node, **{tid: L.UPTODATE}), clock.time())
    chain = Chain(
        chain_id=1,
        version=1,
        targets=tuple(ChainTarget(target_id=t, public_state=PublicState.SERVING) for t in (1, 2, 3)),
    )
    assert update_chains([chain], local_states(st)) == []
    for _ in range(6):  # s1 (the head's node) dies; the others keep heartbeating
        clock.advance(10)
        st, _ = apply_heartbeat(st, storage_hb("s2", t2=L.UPTODATE), clock.time())
        st, _ = apply_heartbeat(st, storage_hb("s3", t3=L.UPTODATE), clock.time())
        res = scan_failures(st, clock.time(), FAIL)
        st = res.state
    assert res.failed == ("s1",)
    (new,) = update_chains([chain], local_states(st))
    assert [(t.target_id, t.public_state) for t in new.targets] == [
        (2, PublicState.SERVING),
        (3, PublicState.SERVING),
        (1, PublicState.OFFLINE),
    ]
    assert new.version == 2


def test_a_node_belongs_to_the_service_user_that_registered_it() -> None:
    """Issue 48 point 2: a node records its registering service user; another one cannot
    heartbeat as it or claim its targets; the owner itself can (a restart); a node stored
    before owners existed is claimed by its next heartbeat."""
    from fireflyer.core.errors import PermissionDenied

    hb = msgspec.structs.replace(storage_hb("s1", t1=L.UPTODATE), sender="svc-storage")
    reg, _ = apply_heartbeat(RegistryState(), hb, now=100.0)
    assert reg.nodes["s1"].owner == "svc-storage"
    with pytest.raises(PermissionDenied, match="registered by service user 'svc-storage'"):
        apply_heartbeat(reg, msgspec.structs.replace(hb, sender="svc-meta"), now=101.0)
    thief = msgspec.structs.replace(storage_hb("s9", t1=L.UPTODATE), sender="svc-meta")
    with pytest.raises(PermissionDenied, match="may not claim it"):
        apply_heartbeat(reg, thief, now=101.0)
    again, _ = apply_heartbeat(reg, hb, now=102.0)
    assert again.nodes["s1"].owner == "svc-storage" and again.nodes["s1"].last_heartbeat == 102.0
    # the same owner may move a target to another of its nodes (a disk moved between hosts)
    moved, _ = apply_heartbeat(again, msgspec.structs.replace(storage_hb("s2", t1=L.UPTODATE), sender="svc-storage"),
                               now=103.0)
    assert moved.targets[1].node_id == "s2"
    legacy = RegistryState(nodes={"s1": msgspec.structs.replace(reg.nodes["s1"], owner="")})
    claimed, _ = apply_heartbeat(legacy, msgspec.structs.replace(hb, sender="svc-x"), now=104.0)
    assert claimed.nodes["s1"].owner == "svc-x"
