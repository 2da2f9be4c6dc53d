"""gRPC edge of the checkpoint service: protobuf in, :class:`~fireflyer.ckpt.catalog.Catalog` calls, protobuf out.

The Catalog and the file-system client are synchronous, so every call runs in a worker
thread (``asyncio.to_thread``) and the event loop keeps serving other ranks meanwhile; the
catalog's errors (NotFound, FailedPrecondition, CheckpointCorrupted ...) travel back to the
client as their status codes through the rpc layer's error mapping.

Auth: every call needs a valid token (the server interceptor refuses calls without one), and
every call about a job is made as its caller (:func:`caller`): a job belongs to the user who
first saved to it, and only that user or an admin may save into it, read, list, pin, retain or
delete its checkpoints (the catalog raises ``PermissionDenied`` naming the owner).  ListJobs
answers the caller's own jobs, every job to an admin.  The service removes checkpoint files with
its own file-system rights (its service credential is root to meta), only after that check.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fireflyer.api.checkpoint.v1 import checkpoint_pb2 as pb
from fireflyer.api.checkpoint.v1 import checkpoint_pb2_grpc as pb_grpc
from fireflyer.ckpt.catalog import Catalog
from fireflyer.ckpt.convert import record_to_pb, retention_from_pb, retention_to_pb, shard_to_pb
from fireflyer.ckpt.model import CkptCaller
from fireflyer.rpc import current_principal

__all__ = ["SERVICE_NAME", "CheckpointServicer", "caller"]

SERVICE_NAME = "ff.checkpoint.v1.CheckpointService"


def caller() -> CkptCaller:
    """The RPC's caller as the catalog checks it: its user name, and whether it is an admin."""
    who = current_principal()
    return CkptCaller(who.user, who.has_role("admin"))


class CheckpointServicer(pb_grpc.CheckpointServiceServicer):
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def Begin(self, request: pb.BeginRequest, context: Any) -> pb.BeginReply:
        retention = retention_from_pb(request.retention) if request.HasField("retention") else None
        rec = await asyncio.to_thread(self.catalog.begin, request.job, request.step, request.world_size,
                                      dict(request.meta), retention=retention, caller=caller())
        return pb.BeginReply(checkpoint=record_to_pb(rec))

    async def CommitShard(self, request: pb.CommitShardRequest, context: Any) -> pb.CommitShardReply:
        rec = await asyncio.to_thread(self.catalog.commit_shard, request.id, request.rank, request.index_digest,
                                      request.nbytes, caller=caller())
        return pb.CommitShardReply(checkpoint=record_to_pb(rec))

    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortReply:
        reason = request.reason or "aborted by the client"
        rec = await asyncio.to_thread(self.catalog.abort, request.id, reason, caller=caller())
        return pb.AbortReply(checkpoint=record_to_pb(rec))

    async def Get(self, request: pb.GetRequest, context: Any) -> pb.GetReply:
        return pb.GetReply(checkpoint=record_to_pb(await asyncio.to_thread(self.catalog.get, request.id, caller=caller())))

    async def List(self, request: pb.ListRequest, context: Any) -> pb.ListReply:
        recs = await asyncio.to_thread(self.catalog.list, request.job, include_all=request.include_all,
                                      caller=caller())
        return pb.ListReply(checkpoints=[record_to_pb(r) for r in recs])

    async def Latest(self, request: pb.LatestRequest, context: Any) -> pb.LatestReply:
        return pb.LatestReply(checkpoint=record_to_pb(await asyncio.to_thread(self.catalog.latest, request.job, caller=caller())))

    async def Delete(self, request: pb.DeleteRequest, context: Any) -> pb.DeleteReply:
        rec = await asyncio.to_thread(self.catalog.delete, request.id, force=request.force, caller=caller())
        return pb.DeleteReply(checkpoint=record_to_pb(rec))

    async def Pin(self, request: pb.PinRequest, context: Any) -> pb.PinReply:
        rec = await asyncio.to_thread(self.catalog.pin, request.id, request.pinned, caller=caller())
        return pb.PinReply(checkpoint=record_to_pb(rec))

    async def SetRetention(self, request: pb.SetRetentionRequest, context: Any) -> pb.SetRetentionReply:
        policy = retention_from_pb(pb.Retention(keep_last=request.keep_last, keep_every=request.keep_every))
        policy = await asyncio.to_thread(self.catalog.set_retention, request.job, policy,
                                        caller=caller())
        return pb.SetRetentionReply(retention=retention_to_pb(policy))

    async def GetRetention(self, request: pb.GetRetentionRequest, context: Any) -> pb.GetRetentionReply:
        policy = await asyncio.to_thread(self.catalog.retention, request.job, caller=caller())
        return pb.GetRetentionReply(retention=retention_to_pb(policy))

    async def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsReply:
        return pb.ListJobsReply(jobs=await asyncio.to_thread(self.catalog.jobs, caller=caller()))

    async def ListShards(self, request: pb.ListShardsRequest, context: Any) -> pb.ListShardsReply:
        shards = await asyncio.to_thread(self.catalog.shards, request.id, caller=caller())
        return pb.ListShardsReply(shards=[shard_to_pb(s) for s in shards])
