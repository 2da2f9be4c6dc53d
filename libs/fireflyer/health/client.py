"""An asyncio client of the health service (``ff health nodes|validate|incidents|show`` use it).

    async with HealthClient() as c:      # FF_HEALTH_ADDR + FF_TOKEN, or the cluster of FF_STATE_DIR / .ff
        for n in await c.nodes(): ...
        reply = await c.validate("node1", level=1)

Replies are the ``ff.health.v1`` messages.  Validate and the incident calls need an admin (or
service) token: the CLI takes the admin token of the local cluster for them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from fireflyer.api.health.v1 import health_pb2 as pb
from fireflyer.api.health.v1 import health_pb2_grpc as pb_grpc

__all__ = ["HealthClient"]


class HealthClient:
    def __init__(self, address: str | None = None, *, token: str | None = None,
                 state_dir: str | os.PathLike[str] | None = None, role: str = "user", timeout_s: float = 30.0) -> None:
        from fireflyer.cluster.discovery import find_cluster

        cluster = find_cluster(state_dir, health=address, token=token, need=("health",), role=role)
        self.address = cluster.health[0]
        self.token = cluster.token or ""
        self.timeout_s = timeout_s
        self._channel: Any = None

    async def __aenter__(self) -> HealthClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        ch, self._channel = self._channel, None
        if ch is not None:
            await ch.close()

    def _stub(self) -> pb_grpc.HealthServiceStub:
        from fireflyer.rpc import connect

        if self._channel is None:
            self._channel = connect(self.address, token=self.token)
        return pb_grpc.HealthServiceStub(self._channel)

    async def nodes(self) -> list[pb.NodeHealth]:
        return list((await self._stub().ListNodes(pb.ListNodesRequest(), timeout=self.timeout_s)).nodes)

    async def validate(self, node: str, level: int = 1, *, inject: Mapping[str, str] | None = None,
                       timeout_s: float = 7200.0) -> pb.ValidateReply:
        """Validate ``node`` now; answers when the validation has finished (``timeout_s`` at most)."""
        req = pb.ValidateRequest(node=node, level=level, inject=dict(inject or {}))
        return await self._stub().Validate(req, timeout=timeout_s)

    async def incidents(self, node: str = "", limit: int = 0) -> list[pb.Incident]:
        req = pb.ListIncidentsRequest(node=node, limit=limit)
        return list((await self._stub().ListIncidents(req, timeout=self.timeout_s)).incidents)

    async def incident(self, ident: str) -> pb.Incident:
        return (await self._stub().GetIncident(pb.GetIncidentRequest(id=ident), timeout=self.timeout_s)).incident

    async def report(self, incident: pb.Incident) -> pb.Incident:
        req = pb.ReportIncidentRequest(incident=incident)
        return (await self._stub().ReportIncident(req, timeout=self.timeout_s)).incident
