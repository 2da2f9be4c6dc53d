"""gRPC edge of the node agent: protobuf in, :class:`~services.node.tasks.TaskManager` calls, protobuf out.

Starting, stopping and suspending processes, and validating the node (:mod:`services.node.validate`),
need role ``service`` or ``admin`` (the scheduler, the health service, an operator); a user may read
the status and logs of their own tasks only.
"""

from __future__ import annotations

import asyncio
import signal as _signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from fireflyer.api.node.v1 import node_pb2 as pb
from fireflyer.api.node.v1 import node_pb2_grpc as pb_grpc
from fireflyer.core.errors import InvalidArgument, PermissionDenied
from fireflyer.node.model import HFReduceSpec, RankSpec, RankState, TaskRecord, TaskSpec
from fireflyer.rpc import current_principal
from fireflyer.rpc.auth import requires

from .tasks import TaskManager
from .validate import NodeValidator

__all__ = ["SERVICE_NAME", "NodeAgentServicer", "spec_from_pb", "task_to_pb"]

SERVICE_NAME = "ff.node.v1.NodeAgent"
#: bytes of log per TailLog message
CHUNK = 64 << 10
#: how often a followed log is checked for new output
FOLLOW_POLL_S = 0.05


def spec_from_pb(req: pb.StartTaskRequest) -> TaskSpec:
    """Validate a StartTask request; InvalidArgument names the field."""
    from fireflyer.bus.subjects import check_token

    try:
        check_token("task_id", req.task_id)
    except InvalidArgument as e:
        raise InvalidArgument(f"task_id: {e}", field="task_id") from e
    if "/" in req.task_id:
        raise InvalidArgument(f"task_id must not contain '/', got {req.task_id!r}", field="task_id")
    if not req.command or not req.command[0]:
        raise InvalidArgument(f"command of task {req.task_id} is empty: give the program and its arguments",
                              field="command")
    if not req.ranks:
        raise InvalidArgument(f"task {req.task_id} names no ranks for this node", field="ranks")
    seen = [r.rank for r in req.ranks]
    if len(set(seen)) != len(seen):
        raise InvalidArgument(f"task {req.task_id} lists a rank twice: {seen}", field="ranks")
    if req.grace_s < 0:
        raise InvalidArgument(f"grace_s must be >= 0, got {req.grace_s}", field="grace_s")
    if req.nnodes and req.node_rank >= req.nnodes:
        raise InvalidArgument(f"node_rank {req.node_rank} is not below nnodes {req.nnodes}", field="node_rank")
    hf = None
    if req.HasField("hfreduce"):
        h = req.hfreduce
        hf = HFReduceSpec(coord_addr=h.coord_addr, peers=tuple(h.peers), listen=h.listen, chunk_size=h.chunk_size,
                          timeout_s=h.timeout_s)
        if not h.coord_addr and len(h.peers) != max(req.nnodes, 1):
            raise InvalidArgument(f"hfreduce needs coord_addr or one peer per node ({max(req.nnodes, 1)}), got "
                                  f"{len(h.peers)}", field="hfreduce.peers")
    return TaskSpec(task_id=req.task_id, command=tuple(req.command),
                    ranks=tuple(RankSpec(rank=r.rank, local_rank=r.local_rank, env=dict(r.env)) for r in req.ranks),
                    job_id=req.job_id, cwd=req.cwd, user=req.user, grace_s=req.grace_s if req.grace_s > 0 else 10.0,
                    env=dict(req.env), nnodes=req.nnodes or 1, node_rank=req.node_rank, world_size=req.world_size,
                    restart_count=req.restart_count, master_addr=req.master_addr, master_port=req.master_port,
                    hfreduce=hf)


def task_to_pb(rec: TaskRecord) -> pb.TaskInfo:
    return pb.TaskInfo(
        task_id=rec.spec.task_id, user=rec.spec.user, state=rec.state.value, suspend_requested=rec.suspend_requested,
        worker_pid=rec.worker.pid if rec.worker is not None else 0,
        worker_restarts=rec.worker.restarts if rec.worker is not None else 0,
        started_at=rec.started_at, ended_at=rec.ended_at,
        ranks=[pb.RankStatus(rank=r.rank, pid=r.pid, state=r.state.value, has_exit_code=r.exit_code is not None,
                             exit_code=r.exit_code or 0, log=r.log) for r in rec.ranks])


def _read_at(path: str, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(CHUNK)
    except FileNotFoundError:
        return b""


def _check_reader(rec: TaskRecord) -> None:
    who = current_principal()
    if who.has_role("admin") or who.has_role("service") or (rec.spec.user and who.user == rec.spec.user):
        return
    raise PermissionDenied(f"user {who.user} may not read task {rec.spec.task_id} of user {rec.spec.user}",
                           task=rec.spec.task_id, user=who.user)


class NodeAgentServicer(pb_grpc.NodeAgentServicer):
    def __init__(self, manager: TaskManager, *, started_at: float, agent_address: Callable[[], str],
                 validator: NodeValidator | None = None) -> None:
        self.manager = manager
        self.started_at = started_at
        self.agent_address = agent_address
        self.validator = validator or NodeValidator(manager.facts.name)

    async def Describe(self, request: pb.DescribeRequest, context: Any) -> pb.DescribeReply:
        f = self.manager.facts
        return pb.DescribeReply(
            labels=pb.NodeLabels(name=f.name, group=f.group, zone=f.zone, cpus=f.cpus, gpus=f.gpus, address=f.address,
                                 agent_address=self.agent_address()),
            started_at=self.started_at, running_tasks=self.manager.running())

    @requires("admin", "service")
    async def StartTask(self, request: pb.StartTaskRequest, context: Any) -> pb.StartTaskReply:
        spec = spec_from_pb(request)
        rec = self.manager.start(spec)  # (spawning takes milliseconds: on the loop, with the rest of the state)
        return pb.StartTaskReply(task=task_to_pb(rec))

    @requires("admin", "service")
    async def StopTask(self, request: pb.StopTaskRequest, context: Any) -> pb.StopTaskReply:
        rec = self.manager.stop(request.task_id, request.grace_s or None)
        if request.wait:
            grace = request.grace_s or rec.spec.grace_s
            rec = await self.manager.wait_ended(request.task_id, timeout_s=grace + 5.0)
        return pb.StopTaskReply(task=task_to_pb(rec))

    @requires("admin", "service")
    async def Suspend(self, request: pb.SuspendRequest, context: Any) -> pb.SuspendReply:
        if request.signal:
            try:
                _signal.Signals(request.signal)
            except ValueError as e:
                raise InvalidArgument(f"signal {request.signal} is not a signal number", field="signal") from e
        rec = self.manager.suspend(request.task_id, request.signal, request.reason)
        return pb.SuspendReply(task=task_to_pb(rec))

    async def TaskStatus(self, request: pb.TaskStatusRequest, context: Any) -> pb.TaskStatusReply:
        rec = self.manager.get(request.task_id)
        _check_reader(rec)
        return pb.TaskStatusReply(task=task_to_pb(rec))

    async def ListTasks(self, request: pb.ListTasksRequest, context: Any) -> pb.ListTasksReply:
        who = current_principal()
        every = who.has_role("admin") or who.has_role("service")
        recs = [r for _, r in sorted(self.manager.state.tasks.items()) if every or r.spec.user == who.user]
        return pb.ListTasksReply(tasks=[task_to_pb(r) for r in recs])

    async def TailLog(self, request: pb.TailLogRequest, context: Any) -> AsyncIterator[pb.LogChunk]:
        rec = self.manager.get(request.task_id)
        _check_reader(rec)
        rank = self.manager.rank(request.task_id, request.rank)
        offset = request.offset
        while True:
            ended = rank.state is not RankState.RUNNING  # read before the file: no output lost after it
            data = await asyncio.to_thread(_read_at, rank.log, offset)
            if data:
                yield pb.LogChunk(offset=offset, data=data)
                offset += len(data)
                continue
            if not request.follow:
                return
            if ended:
                yield pb.LogChunk(offset=offset, eof=True)
                return
            await asyncio.sleep(FOLLOW_POLL_S)
            # the record may have been replaced by a restarted task of the same id: follow the new one
            rank = self.manager.rank(request.task_id, request.rank)

    @requires("admin", "service")
    async def Validate(self, request: pb.ValidateRequest, context: Any) -> pb.ValidateReply:
        report = await self.validator.validate(int(request.level), baseline=dict(request.baseline),
                                               fraction=request.baseline_fraction, inject=dict(request.inject),
                                               plan_json=request.plan_json, spec_json=request.spec_json)
        return pb.ValidateReply(report_json=msgspec.json.encode(report), node=self.validator.node)
