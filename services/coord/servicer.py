"""gRPC edge of coord: protobuf in, :class:`~services.coord.core.CoordCore` calls, protobuf out.

Every call needs a valid token (the interceptor refuses calls without one);
members and operators alike may Abort.  Join waits for the other nodes: its wait
ends at the request's ``timeout_s`` (else the service default) or the caller's own
gRPC deadline, whichever is sooner.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fireflyer.api.coord.v1 import coord_pb2 as pb
from fireflyer.api.coord.v1 import coord_pb2_grpc as pb_grpc
from fireflyer.coord import convert
from fireflyer.coord.convert import STATE_TO_PB
from fireflyer.core.errors import InvalidArgument
from fireflyer.rpc.auth import current_principal

from .core import CoordCore

__all__ = ["SERVICE_NAME", "CoordServicer"]

SERVICE_NAME = "ff.coord.v1.CoordService"


def _caller() -> str:
    """The joining user, whose NATS namespace the communicator's events go to ("" for a name
    that cannot be a subject token: those events then use the cluster-wide subjects)."""
    from fireflyer.bus.subjects import user_token

    user = current_principal().user
    try:
        user_token(user)
    except InvalidArgument:
        return ""
    return user


class CoordServicer(pb_grpc.CoordServiceServicer):
    def __init__(self, core: CoordCore) -> None:
        self.core = core

    async def Join(self, request: pb.JoinRequest, context: Any) -> pb.JoinReply:
        timeout = request.timeout_s
        remaining = context.time_remaining() if context is not None else None
        if remaining is not None and remaining > 0:
            # answer DEADLINE_EXCEEDED with the missing nodes before the caller's deadline cuts us off
            timeout = min(timeout, remaining * 0.95) if timeout > 0 else remaining * 0.95
        spec = msgspec.structs.replace(convert.join_spec_from_pb(request), owner=_caller())
        return await self.core.join(spec, timeout)

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatReply:
        rec = self.core.heartbeat(request.comm, request.generation, request.node)
        return pb.HeartbeatReply(state=STATE_TO_PB[rec.state], reason=rec.reason)

    async def Leave(self, request: pb.LeaveRequest, context: Any) -> pb.LeaveReply:
        rec = await self.core.leave(request.comm, request.generation, request.node)
        return pb.LeaveReply(state=STATE_TO_PB[rec.state])

    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortReply:
        rec = await self.core.abort(request.comm, request.generation, request.node, request.reason)
        return pb.AbortReply(state=STATE_TO_PB[rec.state], reason=rec.reason)

    async def Get(self, request: pb.GetRequest, context: Any) -> pb.GetReply:
        return pb.GetReply(comm=self.core.describe(self.core.rv.get(request.comm)))

    async def List(self, request: pb.ListRequest, context: Any) -> pb.ListReply:
        recs = sorted(self.core.rv.comms.values(), key=lambda r: r.comm)
        return pb.ListReply(comms=[self.core.describe(r) for r in recs if not request.job or r.job == request.job])

    async def GetOpStats(self, request: pb.GetOpStatsRequest, context: Any) -> pb.GetOpStatsReply:
        rep, names = self.core.op_stats(request.comm, request.last)
        return convert.opstats_to_pb(rep, names)
