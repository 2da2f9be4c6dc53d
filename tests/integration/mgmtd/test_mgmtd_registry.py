"""Heartbeats, failure detection and the chain updater against a real mgmtd process.

Fake storage nodes heartbeat from the test with :class:`HeartbeatSender`; one stops
(the injected fault) and must be failed after the fail interval, its target moved
to the chain's tail as offline with a version bump that a NATS event announces;
when it comes back it resyncs (syncing), then serves again.
"""

from __future__ import annotations

import time

import pytest
from mgmtd_harness import FAIL_S

from fireflyer.api.mgmtd.v1 import mgmtd_pb2 as pb
from fireflyer.api.mgmtd.v1 import mgmtd_pb2_grpc as pb_grpc
from fireflyer.core.errors import InvalidArgument, NotFound, PermissionDenied, Unauthenticated
from fireflyer.mgmt.client import (
    HeartbeatSender,
    MgmtdClient,
    RoutingCache,
    RoutingUpdated,
    registry_subject,
    routing_subject,
)
from fireflyer.mgmt.edits import ChainSpec, TargetSpec
from fireflyer.mgmt.model import LocalState, NodeStatus, NodeType, PublicState
from fireflyer.mgmt.registry import Heartbeat, NodeFailed, TargetReport
from fireflyer.rpc import connect
from fireflyer.testing.poll import wait_for

S, OFF, Y = PublicState.SERVING, PublicState.OFFLINE, PublicState.SYNCING


def _storage(n: int, states: dict[int, LocalState]):
    tid = 100 + n
    return lambda: Heartbeat(node_id=f"storage-{n}", node_type=NodeType.STORAGE, address=f"127.0.0.1:{9000 + n}",
                             targets=(TargetReport(target_id=tid, local_state=states[tid]),))


async def test_failed_node_goes_offline_and_comes_back_syncing(start_replicas, sqlite_kv_url, bus, tokens):
    reps = await start_replicas(1, sqlite_kv_url)
    await reps.wait_primary()
    client = reps.client
    states = {101: LocalState.UPTODATE, 102: LocalState.UPTODATE, 103: LocalState.UPTODATE}
    # the fake nodes heartbeat with a service credential (only services register nodes)
    senders = {n: HeartbeatSender(reps.service_client, _storage(n, states), interval_s=0.2).start()
               for n in (1, 2, 3)}
    events: list[RoutingUpdated] = []
    failed: list[NodeFailed] = []

    async def on_routing(ev: RoutingUpdated, msg: object) -> None:
        events.append(ev)

    async def on_failed(ev: NodeFailed, msg: object) -> None:
        failed.append(ev)

    await bus.subscribe(routing_subject("local"), on_routing, types=RoutingUpdated)
    await bus.subscribe(registry_subject("node", "storage-2", "failed"), on_failed, types=NodeFailed)
    cache = RoutingCache(MgmtdClient(reps.procs[0].address, token=tokens.user), bus=bus, pull_interval_s=30.0)
    try:
        # heartbeats register the nodes and their targets (in no chain yet)
        async def registered():
            r = await client.get_routing()
            ok = (len(r.nodes) == 3 and all(n.status is NodeStatus.ALIVE for n in r.nodes)
                  and [(t.target_id, t.chain_id, t.local_state) for t in r.targets]
                  == [(101, 0, LocalState.UPTODATE), (102, 0, LocalState.UPTODATE), (103, 0, LocalState.UPTODATE)])
            return ok and r

        await wait_for(registered, timeout_s=5, what="3 storage nodes and their targets registered")
        await cache.start()

        # the admin places the reported targets in a chain without naming their nodes
        version, [chain] = await client.create_chains(
            [ChainSpec(chain_id=1, targets=tuple(TargetSpec(target_id=t) for t in (101, 102, 103)))])
        assert chain.version == 1 and chain.states == (S, S, S)
        await cache.wait_version(version, timeout_s=5)  # event-driven: the 30 s pull is far away

        # fault: storage-2 stops heartbeating
        await senders[2].stop()
        stopped = time.monotonic()

        async def moved():
            [c] = await client.list_chains()
            return c if c.target_ids == (101, 103, 102) else None

        chain = await wait_for(moved, timeout_s=FAIL_S + 3, interval_s=0.05, what="target 102 moved to the tail")
        assert time.monotonic() - stopped >= FAIL_S - 0.3  # not failed before the fail interval
        assert chain.states == (S, S, OFF) and chain.version == 2
        routing = await client.get_routing()
        node2 = next(n for n in routing.nodes if n.node_id == "storage-2")
        t102 = next(t for t in routing.targets if t.target_id == 102)
        assert node2.status is NodeStatus.HEARTBEAT_FAILED
        assert (t102.local_state, t102.public_state) == (LocalState.OFFLINE, OFF)
        await wait_for(lambda: any(e.version >= routing.version for e in events), timeout_s=5,
                       what="routing event with the new version")
        await wait_for(lambda: failed, timeout_s=5, what="NodeFailed event")
        assert failed[0].targets == (102,)
        cached = await cache.wait_version(routing.version, timeout_s=5)
        assert cached.chains[0].target_ids == (101, 103, 102)

        # it comes back with its data not known current: resync first
        states[102] = LocalState.ONLINE
        senders[2] = HeartbeatSender(reps.service_client, _storage(2, states), interval_s=0.2).start()

        async def state_of_102(want: PublicState):
            [c] = await client.list_chains()
            return c if c.state_of(102) is want else None

        chain = await wait_for(lambda: state_of_102(Y), timeout_s=5, what="target 102 syncing")
        assert chain.target_ids == (101, 103, 102) and chain.version == 3
        nodes = {n.node_id: n.status for n in await client.list_nodes()}
        assert nodes["storage-2"] is NodeStatus.ALIVE

        # resync done: it serves again
        states[102] = LocalState.UPTODATE
        chain = await wait_for(lambda: state_of_102(S), timeout_s=5, what="target 102 serving")
        assert chain.states == (S, S, S) and chain.version == 4
    finally:
        await cache.stop()
        await cache.client.close()
        for s in senders.values():
            await s.stop()


async def test_admin_rules_bad_input_and_roles(start_replicas, sqlite_kv_url, tokens):
    reps = await start_replicas(1, sqlite_kv_url)
    await reps.wait_primary()
    admin = reps.client
    version, _ = await admin.create_chains([ChainSpec(chain_id=1, targets=(
        TargetSpec(target_id=1, node_id="s1"), TargetSpec(target_id=2, node_id="s2")))])
    # a repeat of the same create is a no-op success
    assert (await admin.create_chains([ChainSpec(chain_id=1, targets=(
        TargetSpec(target_id=1, node_id="s1"), TargetSpec(target_id=2, node_id="s2")))]))[0] == version

    # bad input: INVALID_ARGUMENT / NOT_FOUND, and nothing is written
    bad = [
        admin.create_chains([ChainSpec(chain_id=2, targets=(TargetSpec(target_id=3, node_id="s1"),
                                                            TargetSpec(target_id=3, node_id="s2")))]),
        admin.create_chains([ChainSpec(chain_id=2, targets=(TargetSpec(target_id=9),))]),  # unknown node
        admin.create_chains([ChainSpec(chain_id=0, targets=(TargetSpec(target_id=4, node_id="s1"),))]),
        admin.create_chain_table(0, [1]),
        admin.create_chain_table(1, [1, 1]),
    ]
    for call in bad:
        with pytest.raises(InvalidArgument):
            await call
    with pytest.raises(NotFound):
        await admin.create_chain_table(1, [1, 7])
    with pytest.raises(NotFound):
        await admin.offline_target(42)
    async with connect(reps.procs[0].address, token=tokens.service) as ch:
        stub = pb_grpc.MgmtdServiceStub(ch)
        with pytest.raises(InvalidArgument, match="node_type"):
            await stub.Heartbeat(pb.HeartbeatRequest(node_id="x", node_type="toaster", address="h:1"))
        with pytest.raises(InvalidArgument, match="local_state"):
            await stub.Heartbeat(pb.HeartbeatRequest(node_id="x", node_type="storage", address="h:1",
                                                     targets=[pb.TargetReport(target_id=5, local_state="fine")]))
    routing = await admin.get_routing()
    assert routing.version == version and [c.chain_id for c in routing.chains] == [1]
    assert [t.target_id for t in routing.targets] == [1, 2] and routing.nodes == ()

    # roles: a user reads but may not change anything; no token is refused
    async with MgmtdClient(reps.procs[0].address, token=tokens.user) as user:
        assert [c.chain_id for c in await user.list_chains()] == [1]
        with pytest.raises(PermissionDenied):
            await user.create_chain_table(1, [1])
        with pytest.raises(PermissionDenied):
            await user.offline_target(1)
    async with MgmtdClient(reps.procs[0].address, token="") as anonymous:
        with pytest.raises(Unauthenticated):
            await anonymous.get_routing()

    # an admin offline moves the target to the tail and bumps versions
    v2, chain = await admin.offline_target(1)
    assert v2 == version + 1 and chain.target_ids == (2, 1) and chain.states == (S, OFF) and chain.version == 2
    v3, table = await admin.create_chain_table(1, [1], "one chain")
    assert (v3, table.version) == (v2 + 1, 1)
    v4, table = await admin.create_chain_table(1, [1], "one chain")  # same content: no new version
    assert (v4, table.version) == (v3, 1)


async def test_only_services_register_nodes_and_a_node_stays_with_its_service(start_replicas, sqlite_kv_url, tokens):
    """Issue 48 point 2: a user (bob posing as storage-2) or an admin cannot register a node, so
    no client ever sends a token to their listener; a registered node is bound to its service
    user: another service credential cannot heartbeat as it or claim its targets."""
    reps = await start_replicas(1, sqlite_kv_url)
    await reps.wait_primary()
    addr = reps.procs[0].address
    hb = pb.HeartbeatRequest(node_id="storage-2", node_type="storage", address="127.0.0.1:9",
                             tags=["wire=127.0.0.1:9"],
                             targets=[pb.TargetReport(target_id=7, local_state="up-to-date")])
    for token in (tokens.user, tokens.admin):
        async with connect(addr, token=token) as ch:
            with pytest.raises(PermissionDenied, match="lacks role 'service'"):
                await pb_grpc.MgmtdServiceStub(ch).Heartbeat(hb)
    routing = await reps.client.get_routing()
    assert routing.nodes == () and routing.targets == ()

    async with connect(addr, token=tokens.service) as ch:
        await pb_grpc.MgmtdServiceStub(ch).Heartbeat(hb)

    async def registered():
        r = await reps.client.get_routing()
        return r if [(n.node_id, n.owner) for n in r.nodes] == [("storage-2", "svc-storage")] else None

    routing = await wait_for(registered, timeout_s=5, what="storage-2 registered by svc-storage")
    assert [(t.target_id, t.node_id) for t in routing.targets] == [(7, "storage-2")]

    async with connect(addr, token=tokens.other_service) as ch:
        stub = pb_grpc.MgmtdServiceStub(ch)
        with pytest.raises(PermissionDenied, match="registered by service user 'svc-storage'"):
            await stub.Heartbeat(hb)  # svc-meta posing as storage-2
        thief = pb.HeartbeatRequest(node_id="meta-9", node_type="storage", address="127.0.0.1:10",
                                    targets=[pb.TargetReport(target_id=7, local_state="up-to-date")])
        with pytest.raises(PermissionDenied, match="may not claim it"):
            await stub.Heartbeat(thief)  # ... or claiming its target under a new name
    async with connect(addr, token=tokens.service) as ch:  # the owner again (a restart): fine
        await pb_grpc.MgmtdServiceStub(ch).Heartbeat(hb)
    routing = await reps.client.get_routing()
    assert [n.node_id for n in routing.nodes] == ["storage-2"]
    assert [(t.target_id, t.node_id) for t in routing.targets] == [(7, "storage-2")]
