"""gRPC edge of the scheduler: protobuf in, :class:`~services.scheduler.core.SchedCore` calls, protobuf out.

Only conversion and role checks live here; owners are checked by the core inside its transactions.
Every call needs a valid token.  Quota changes need ``admin``; node state changes ``admin`` or
``service`` (the health service drains faulty nodes and enables them after a validation, with its
own service credential); Register and Report, which only node agents make, need ``service``.  Bad requests raise InvalidArgument while
converting, before the core is called, so nothing is written.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.api.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from fireflyer.core.errors import InvalidArgument
from fireflyer.rpc import current_principal, requires
from fireflyer.sched import convert
from fireflyer.sched.model import RankState, StopCode, SuspendCode, parse_priority

from .core import Caller, SchedCore

__all__ = ["TASK_SERVICE", "NODE_SERVICE", "QUOTA_SERVICE", "TaskServicer", "NodeServicer", "QuotaServicer"]

TASK_SERVICE = "ff.scheduler.v1.TaskService"
NODE_SERVICE = "ff.scheduler.v1.NodeService"
QUOTA_SERVICE = "ff.scheduler.v1.QuotaService"


def caller() -> Caller:
    who = current_principal()
    return Caller(who.user, who.has_role("admin"))


def _id(value: int) -> int:
    if value <= 0:
        raise InvalidArgument(f"task id must be a positive integer, got {value}", field="id")
    return int(value)


def _bearer(context: Any) -> str:
    """The bearer token this call authenticated with ("" without one: auth disabled)."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str) and value.lower().startswith("bearer "):
            return value[7:].strip()
    return ""


def _chain(runs: list[Any]) -> pb.TaskReply:
    return pb.TaskReply(chain=convert.chain_to_pb(runs))


class TaskServicer(pb_grpc.TaskServiceServicer):
    def __init__(self, core: SchedCore) -> None:
        self.core = core

    async def Create(self, request: pb.CreateRequest, context: Any) -> pb.TaskReply:
        who = caller()
        spec = convert.spec_from_pb(request.spec, user=request.spec.user if who.admin and request.spec.user
                                    else who.user)
        # the caller's own token goes to the task's ranks (their FF_TOKEN), only when the task runs as
        # the caller: an admin submitting for someone else has no token of theirs to give
        credential = _bearer(context) if spec.user == who.user else ""
        return _chain(await self.core.create(spec, who, request.request_id, credential=credential))

    async def Get(self, request: pb.GetRequest, context: Any) -> pb.TaskReply:
        return _chain(await self.core.chain(_id(request.id), caller()))

    async def List(self, request: pb.ListRequest, context: Any) -> pb.ListReply:
        if request.limit < 0:
            raise InvalidArgument(f"limit must be >= 0, got {request.limit}", field="limit")
        chains = await self.core.list(caller(), user=request.user, include_finished=request.include_finished,
                                      limit=int(request.limit))
        return pb.ListReply(chains=[convert.chain_to_pb(c) for c in chains])

    async def Stop(self, request: pb.TaskIdRequest, context: Any) -> pb.TaskReply:
        return _chain(await self.core.stop(_id(request.id), caller()))

    async def Suspend(self, request: pb.TaskIdRequest, context: Any) -> pb.TaskReply:
        return _chain(await self.core.suspend(_id(request.id), caller()))

    async def Resume(self, request: pb.TaskIdRequest, context: Any) -> pb.TaskReply:
        return _chain(await self.core.resume(_id(request.id), caller()))

    async def UpdatePriority(self, request: pb.UpdatePriorityRequest, context: Any) -> pb.TaskReply:
        priority = parse_priority(request.priority)
        return _chain(await self.core.update_priority(_id(request.id), priority, caller()))

    async def StreamLogs(self, request: pb.LogsRequest, context: Any) -> AsyncIterator[pb.LogChunk]:
        if request.rank < 0:
            raise InvalidArgument(f"rank must be >= 0, got {request.rank}", field="rank")
        restart = int(request.restart) if request.HasField("restart") else None
        if restart is not None and restart < 0:
            raise InvalidArgument(f"restart must be >= 0, got {restart}", field="restart")
        run_id, chunks = await self.core.logs(_id(request.id), int(request.rank), request.follow, caller(),
                                              restart=restart)
        async for data in chunks:
            yield pb.LogChunk(run_id=run_id, rank=request.rank, data=data)


class NodeServicer(pb_grpc.NodeServiceServicer):
    def __init__(self, core: SchedCore) -> None:
        self.core = core

    async def List(self, request: pb.NodeListRequest, context: Any) -> pb.NodeListReply:
        nodes = await self.core.nodes()
        lost = self.core.lost_nodes(nodes, self.core.clock.time())
        out = []
        for n in nodes:
            m = convert.node_to_pb(n)
            m.lost = n.name in lost
            out.append(m)
        return pb.NodeListReply(nodes=out)

    @requires("admin", "service")
    async def SetState(self, request: pb.SetNodeStateRequest, context: Any) -> pb.NodeReply:
        node = await self.core.set_node_state(request.name, request.state, request.reason, caller(),
                                              evict=request.evict)
        return pb.NodeReply(node=convert.node_to_pb(node))

    @requires("service")
    async def Register(self, request: pb.RegisterNodeRequest, context: Any) -> pb.RegisterNodeReply:
        node = await self.core.register_node(convert.node_from_pb(request), current_principal().user)
        return pb.RegisterNodeReply(node=convert.node_to_pb(node),
                                    heartbeat_interval_s=self.core.cfg.heartbeat_interval_s)

    @requires("service")
    async def Report(self, request: pb.ReportRequest, context: Any) -> pb.ReportReply:
        try:
            state = RankState(request.state) if request.state else None
        except ValueError:
            raise InvalidArgument(f"unknown rank state {request.state!r}", field="state") from None
        if request.suspend_code not in (0, SuspendCode.RECEIVED, SuspendCode.CAN_SUSPEND):
            raise InvalidArgument(f"suspend_code must be 0, 2 (received) or 3 (can suspend), got "
                                  f"{request.suspend_code}", field="suspend_code")
        if request.stop_code not in (0, StopCode.TIMEOUT):
            raise InvalidArgument(f"an agent may only stop a run with TIMEOUT ({int(StopCode.TIMEOUT)}), got "
                                  f"{request.stop_code}", field="stop_code")
        await self.core.report(_id(request.task_id), int(request.rank), request.node, state,
                               int(request.exit_code) if state is not None else None,
                               SuspendCode(request.suspend_code) if request.suspend_code else None,
                               int(request.whole_life_state) if request.whole_life_state >= 0 else None,
                               sender=current_principal().user, timeout=bool(request.stop_code))
        return pb.ReportReply()


class QuotaServicer(pb_grpc.QuotaServiceServicer):
    def __init__(self, core: SchedCore) -> None:
        self.core = core

    async def Get(self, request: pb.QuotaGetRequest, context: Any) -> pb.QuotaListReply:
        who = caller()
        _own(request.owner, who)
        return pb.QuotaListReply(quotas=[convert.quota_to_pb(q) for q in await self.core.quotas(request.owner, who)])

    @requires("admin")
    async def Set(self, request: pb.QuotaSetRequest, context: Any) -> pb.QuotaListReply:
        qs = await self.core.set_quota(convert.quota_from_pb(request.quota), request.remove)
        return pb.QuotaListReply(quotas=[convert.quota_to_pb(q) for q in qs])

    async def Used(self, request: pb.QuotaGetRequest, context: Any) -> pb.QuotaUsedReply:
        who = caller()
        _own(request.owner, who)
        used = await self.core.used(request.owner, who)
        return pb.QuotaUsedReply(used=[pb.QuotaUse(owner=u.owner, group=u.group, priority=u.priority.name,
                                                   used=u.used, limit=-1 if u.limit is None else u.limit)
                                       for u in used])


def _own(owner: str, who: Caller) -> None:
    from fireflyer.core.errors import PermissionDenied

    if owner and not who.admin and owner != who.user:
        raise PermissionDenied(f"{who.user} may not read the quotas of {owner}", owner=owner)
