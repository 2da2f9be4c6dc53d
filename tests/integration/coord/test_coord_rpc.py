"""coord over gRPC, in process: the status codes of bad joins (the channel raises them as typed errors
carrying the code) and the cross-zone property on real joins."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fireflyer.api.coord.v1 import coord_pb2 as pb
from fireflyer.api.coord.v1 import coord_pb2_grpc as pb_grpc
from fireflyer.core.config import AuthSettings, NatsSettings, RpcSettings
from fireflyer.core.errors import FireFlyerError
from fireflyer.rpc import connect
from fireflyer.testing.services import running_service
from services.coord.app import CoordSection, CoordService, CoordSettings


def settings(tmp_path: Path, nats_url: str) -> CoordSettings:
    return CoordSettings(state_dir=str(tmp_path), auth=AuthSettings(enabled=False), nats=NatsSettings(url=nats_url),
                         rpc=RpcSettings(port=0),
                         coord=CoordSection(kv_url=f"sqlite:///{tmp_path}/coord.db", heartbeat_interval_s=0.3))


def req(node: str, **kw: object) -> pb.JoinRequest:
    base = dict(job="j", name="default", node=node, local_world_size=2, address=f"{node}:1", nnodes=2,
                timeout_s=5.0)
    base.update(kw)
    return pb.JoinRequest(**base)  # type: ignore[arg-type]


async def test_cross_zone_pair_and_bad_inputs(tmp_path: Path, nats_server) -> None:  # type: ignore[no-untyped-def]
    async with running_service(CoordService(settings(tmp_path, nats_server.url))) as ctx:
        async with connect(ctx.server.address, token="") as ch:
            stub = pb_grpc.CoordServiceStub(ch)
            zones = {"n0": "A", "n1": "B", "n2": "A", "n3": "B"}
            replies = await asyncio.gather(*[stub.Join(req(n, zone=z, nnodes=4, job="xz")) for n, z in zones.items()])
            assert sorted(r.node_rank for r in replies) == [0, 1, 2, 3]
            zone_of = {r.node_rank: zones[r.nodes[r.node_rank].node] for r in replies}
            pairs = {frozenset((r.node_rank, t.parent)) for r in replies for t in r.trees if t.parent >= 0
                     and zone_of[t.parent] != zone_of[r.node_rank]}
            assert len(pairs) == 1 and all(r.cross_zone_pairs == 1 for r in replies)
            assert all(r.world_size == 8 and r.first_rank == 2 * r.node_rank for r in replies)
            assert replies[0].aborted_subject.endswith("xz-default.aborted")

            # world size disagreement, duplicate node, deadline, unknown communicator
            first = asyncio.ensure_future(stub.Join(req("a", world_size=4, expected_nodes=["a", "b"], timeout_s=1.5)))
            await asyncio.sleep(0.2)
            with pytest.raises(FireFlyerError) as e:
                await stub.Join(req("b", world_size=6, expected_nodes=["a", "b"]))
            assert e.value.code == "FAILED_PRECONDITION"
            assert "world_size=6" in str(e.value) and "world_size=4" in str(e.value)
            with pytest.raises(FireFlyerError) as e:
                await stub.Join(req("a", address="elsewhere:2", expected_nodes=["a", "b"]))
            assert e.value.code == "ALREADY_EXISTS"
            with pytest.raises(FireFlyerError) as e:
                await first
            assert e.value.code == "DEADLINE_EXCEEDED"
            assert "missing nodes: b" in str(e.value)
            for call in (stub.Get(pb.GetRequest(comm="j/nope")),
                         stub.Heartbeat(pb.HeartbeatRequest(comm="j/nope", generation=1, node="a")),
                         stub.GetOpStats(pb.GetOpStatsRequest(comm="j/nope"))):
                with pytest.raises(FireFlyerError) as e:
                    await call
                assert e.value.code == "NOT_FOUND"

            # generations: abort, re-join -> generation 2; the old generation's heartbeat is stale
            await stub.Abort(pb.AbortRequest(comm="xz/default", node="n0", reason="test"))
            got = await stub.Get(pb.GetRequest(comm="xz/default"))
            assert got.comm.state == pb.COMM_STATE_ABORTED and "node n0" in got.comm.reason
            again = await asyncio.gather(*[stub.Join(req(n, zone=z, nnodes=4, job="xz")) for n, z in zones.items()])
            assert {r.generation for r in again} == {2}
            with pytest.raises(FireFlyerError) as e:
                await stub.Heartbeat(pb.HeartbeatRequest(comm="xz/default", generation=1, node="n0"))
            assert e.value.code == "FAILED_PRECONDITION" and "stale generation" in str(e.value)
            listed = await stub.List(pb.ListRequest(job="xz"))
            assert [c.comm for c in listed.comms] == ["xz/default"]
