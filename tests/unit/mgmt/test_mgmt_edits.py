"""Pure routing edits (fireflyer.mgmt.edits) and the proto conversions (fireflyer.mgmt.convert)."""

from __future__ import annotations

import pytest

from fireflyer.api.mgmtd.v1 import mgmtd_pb2 as pb
from fireflyer.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from fireflyer.mgmt import convert, edits
from fireflyer.mgmt.edits import ChainSpec, TargetSpec
from fireflyer.mgmt.model import LocalState, NodeStatus, NodeType, PublicState, RoutingInfo
from fireflyer.mgmt.registry import Heartbeat, RegistryState, TargetReport, apply_heartbeat, scan_failures

P, L = PublicState, LocalState
EMPTY = RoutingInfo(version=0)


def _chain(cid: int, *tids: int, node: str = "n") -> ChainSpec:
    return ChainSpec(chain_id=cid, targets=tuple(TargetSpec(target_id=t, node_id=f"{node}{t}") for t in tids))


def _hb(node: str, *reports: tuple[int, LocalState]) -> Heartbeat:
    return Heartbeat(node_id=node, node_type=NodeType.STORAGE, address=f"{node}:1",
                     targets=tuple(TargetReport(target_id=t, local_state=s) for t, s in reports))


def test_create_chains_all_or_nothing_and_idempotent() -> None:
    r1 = edits.create_chains(EMPTY, [_chain(1, 1, 2, 3)])
    assert r1.version == 1 and r1.chains[0].states == (P.SERVING,) * 3
    assert [t.chain_id for t in r1.targets] == [1, 1, 1]
    assert edits.create_chains(r1, [_chain(1, 1, 2, 3)]) is r1  # a repeat changes nothing
    with pytest.raises(AlreadyExists):
        edits.create_chains(r1, [_chain(2, 4), _chain(3, 3)])  # target 3 is in chain 1: none is created
    with pytest.raises(AlreadyExists):
        edits.create_chains(r1, [_chain(1, 1, 2)])
    for bad in ([], [_chain(0, 5)], [_chain(2)], [_chain(2, 5, 5)], [_chain(2, 5), _chain(2, 6)],
                [ChainSpec(chain_id=2, targets=(TargetSpec(target_id=9),))]):
        with pytest.raises(InvalidArgument):
            edits.create_chains(r1, bad)


def test_chain_tables_keep_every_version() -> None:
    r = edits.create_chains(EMPTY, [_chain(1, 1), _chain(2, 2)])
    r = edits.create_chain_table(r, 7, [1, 2])
    assert edits.create_chain_table(r, 7, [1, 2]) is r
    r2 = edits.create_chain_table(r, 7, [2, 1], "swap")
    assert [(t.version, t.chain_ids) for t in r2.chain_tables] == [(1, (1, 2)), (2, (2, 1))]
    assert edits.latest_tables(r2)[7].version == 2 and r2.version == r.version + 1
    with pytest.raises(NotFound):
        edits.create_chain_table(r, 8, [3])
    with pytest.raises(InvalidArgument):
        edits.create_chain_table(r, 8, [])


def test_sync_registry_registers_reported_targets_then_fails_them() -> None:
    reg, _ = apply_heartbeat(RegistryState(), _hb("a", (1, L.UPTODATE)), now=100.0)
    reg, _ = apply_heartbeat(reg, _hb("b", (2, L.UPTODATE)), now=100.0)
    r = edits.sync_registry(EMPTY, reg)
    assert r.version == 1 and [(t.target_id, t.chain_id, t.node_id) for t in r.targets] == [(1, 0, "a"), (2, 0, "b")]
    assert edits.sync_registry(r, reg) is r  # nothing new: no version bump
    r = edits.create_chains(r, [ChainSpec(chain_id=1, targets=(TargetSpec(target_id=1), TargetSpec(target_id=2)))])
    reg, _ = apply_heartbeat(reg, _hb("b", (2, L.UPTODATE)), now=105.0)  # b keeps heartbeating, a does not
    scan = scan_failures(reg, now=161.0, fail_interval_s=60.0)
    assert scan.failed == ("a",)
    r2 = edits.sync_registry(r, scan.state)
    assert r2.version == r.version + 1  # one bump for node status, chain and target together
    assert r2.chains[0].target_ids == (2, 1) and r2.chains[0].states == (P.SERVING, P.OFFLINE)
    assert {n.node_id: n.status for n in r2.nodes}["a"] is NodeStatus.HEARTBEAT_FAILED


def test_offline_target_uses_the_chain_rules() -> None:
    r = edits.create_chains(EMPTY, [_chain(1, 1, 2)])
    r2 = edits.offline_target(r, 1, {})
    assert r2.chains[0].target_ids == (2, 1) and r2.chains[0].states == (P.SERVING, P.OFFLINE)
    r3 = edits.offline_target(r2, 2, {})  # the last serving copy is kept as lastsrv
    assert r3.chains[0].states == (P.LASTSRV, P.OFFLINE)
    assert edits.offline_target(r3, 1, {}) is r3
    with pytest.raises(NotFound):
        edits.offline_target(r, 9, {})
    r4 = edits.sync_registry(r, apply_heartbeat(RegistryState(), _hb("z", (5, L.ONLINE)), 1.0)[0])
    with pytest.raises(FailedPrecondition):
        edits.offline_target(r4, 5, {})


def test_routing_round_trips_through_proto_and_rejects_unknown_names() -> None:
    reg, _ = apply_heartbeat(RegistryState(), _hb("a", (1, L.ONLINE)), now=1.0)
    r = edits.create_chain_table(edits.create_chains(edits.sync_registry(EMPTY, reg), [_chain(3, 1, 4)]), 1, [3])
    assert convert.routing_from_pb(convert.routing_to_pb(r)) == r
    hb = _hb("a", (1, L.ONLINE))
    assert convert.heartbeat_from_pb(convert.heartbeat_to_pb(hb), event_id=hb.event_id, sent_at=hb.sent_at) == hb
    with pytest.raises(InvalidArgument, match="node_type"):
        convert.heartbeat_from_pb(pb.HeartbeatRequest(node_id="a", node_type="x", address="a:1"))
    with pytest.raises(InvalidArgument):
        convert.heartbeat_from_pb(pb.HeartbeatRequest(node_id="", node_type="meta", address="a:1"))
    with pytest.raises(InvalidArgument, match="twice"):
        convert.heartbeat_from_pb(pb.HeartbeatRequest(node_id="a", node_type="storage", address="a:1", targets=[
            pb.TargetReport(target_id=1, local_state="online"), pb.TargetReport(target_id=1, local_state="online")]))
