"""The health service's real ports: the scheduler (``SchedClient``) and the node agents (gRPC
``NodeAgent.Validate``), both called with the health service's own service credential (never a
caller's: DESIGN.md §3)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from fireflyer.api.node.v1 import node_pb2 as npb
from fireflyer.api.node.v1 import node_pb2_grpc as npb_grpc
from fireflyer.health.checks import Baseline, LevelPlan, NodeReport
from fireflyer.sched.client import SchedClient

from .core import SchedNode

__all__ = ["GrpcSched", "GrpcAgents"]


class GrpcSched:
    """The scheduler's NodeService: List, and SetState (role service may drain and enable)."""

    def __init__(self, addresses: str, *, token: str) -> None:
        self.client = SchedClient(addresses, token=token, timeout_s=10.0, leader_wait_s=15.0)

    async def nodes(self) -> list[SchedNode]:
        return [SchedNode(name=n.name, state=n.state, task=int(n.task), address=n.address)
                for n in await self.client.nodes()]

    async def set_state(self, name: str, state: str, reason: str, *, evict: bool) -> None:
        await self.client.set_node_state(name, state, reason, evict=evict)

    async def close(self) -> None:
        await self.client.close()


class GrpcAgents:
    """``NodeAgent.Validate`` on the agent at the address the scheduler lists for the node."""

    def __init__(self, *, token: str) -> None:
        self.token = token
        self._channels: dict[str, Any] = {}

    async def validate(self, address: str, node: str, level: int, *, baseline: Baseline, inject: Mapping[str, str],
                       plan: LevelPlan | None, timeout_s: float) -> NodeReport:
        from fireflyer.rpc import connect

        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = connect(address, token=self.token)
        req = npb.ValidateRequest(level=level, baseline=baseline.values, baseline_fraction=baseline.fraction,
                                  inject=dict(inject), plan_json=msgspec.json.encode(plan) if plan else b"")
        reply = await npb_grpc.NodeAgentStub(ch).Validate(req, timeout=timeout_s)
        return msgspec.json.decode(reply.report_json, type=NodeReport)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for ch in channels.values():
            await ch.close()
