"""A synchronous client of the checkpoint service with the :class:`~fireflyer.ckpt.catalog.Catalog`'s API.

    with CheckpointClient() as cat:            # FF_CKPT_ADDR + FF_TOKEN, or the cluster of FF_STATE_DIR / .ff
        rec = cat.begin("llama", 1000, world_size=8)
        ...                                    # each rank writes its shards and rank<N>.index
        cat.commit_shard(rec.id, rank, digest, nbytes)
        cat.latest("llama")

Every method has the Catalog's name, signature, return type (the ``fireflyer.ckpt.model``
Structs) and errors (``NotFound``, ``FailedPrecondition``, ``InvalidArgument``,
``AlreadyExists``, ``CheckpointCorrupted`` ...: the rpc layer rebuilds the class the service
raised), so the checkpoint manager takes either.  Training code has no event loop of its own
and calls from plain threads, so the grpc.aio channel lives on a private loop thread and each
method waits for its call; the client is thread safe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fireflyer.api.checkpoint.v1 import checkpoint_pb2 as pb
from fireflyer.api.checkpoint.v1 import checkpoint_pb2_grpc as pb_grpc
from fireflyer.core.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument

from .convert import record_from_pb, retention_from_pb, retention_to_pb, shard_from_pb
from .model import CheckpointRecord, RetentionPolicy, ShardCommit

__all__ = ["CheckpointClient"]

T = TypeVar("T")


class CheckpointClient:
    """Calls to one checkpoint service address; close it when done.

    The address is ``address``, else ``FF_CKPT_ADDR``, else the checkpoint service of the local
    cluster (``state_dir``, else ``FF_STATE_DIR``, else ``.ff``); the token ``token`` (``""``: none),
    else ``FF_TOKEN``, else that cluster's user token.  With none, ``NoClusterFound``."""

    def __init__(self, address: str | None = None, *, token: str | None = None, timeout_s: float = 60.0,
                 state_dir: str | os.PathLike[str] | None = None) -> None:
        from fireflyer.cluster.discovery import find_cluster

        # address=, then FF_CKPT_ADDR, then the local cluster (state_dir / FF_STATE_DIR / .ff);
        # token= ("" for none), then FF_TOKEN, then that cluster's user token
        cluster = find_cluster(state_dir, ckpt=address, token=token, need=("ckpt",))
        self.address = cluster.ckpt[0]
        self.token = cluster.token or None
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ff-ckpt-client", daemon=True)
        self._thread.start()
        self._closed = False
        # the channel must be made on the loop that uses it
        self._channel, self._stub = self._run(self._open())

    async def _open(self) -> tuple[Any, pb_grpc.CheckpointServiceStub]:
        from fireflyer.rpc import connect

        channel = connect(self.address, token=self.token or "")
        return channel, pb_grpc.CheckpointServiceStub(channel)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise FailedPrecondition(f"checkpoint client for {self.address} is closed", address=self.address)
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            # the call's own deadline (timeout_s) ends it first; this only guards a stuck loop
            return fut.result(self.timeout_s + 5.0)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise DeadlineExceeded(f"checkpoint service at {self.address} did not answer within "
                                   f"{self.timeout_s:g} s", address=self.address) from None

    def _call(self, method: Callable[..., Any], request: Any) -> Any:
        async def call() -> Any:
            return await method(request, timeout=self.timeout_s)
        return self._run(call())

    # -- the Catalog's API ------------------------------------------------------------------------
    def begin(self, job: str, step: int, world_size: int, meta: dict[str, str] | None = None, *,
              retention: RetentionPolicy | None = None) -> CheckpointRecord:
        req = pb.BeginRequest(job=_str(job, "job"), step=_int(step, "step"), world_size=_int(world_size, "world_size"),
                              meta=_meta(meta))
        if retention is not None:
            req.retention.CopyFrom(retention_to_pb(retention.check()))
        return record_from_pb(self._call(self._stub.Begin, req).checkpoint)

    def commit_shard(self, ckpt_id: str, rank: int, digest: str, nbytes: int) -> CheckpointRecord:
        req = pb.CommitShardRequest(id=_str(ckpt_id, "ckpt_id"), rank=_int(rank, "rank"),
                                    index_digest=_str(digest, "digest"), nbytes=_int(nbytes, "nbytes"))
        return record_from_pb(self._call(self._stub.CommitShard, req).checkpoint)

    def abort(self, ckpt_id: str, reason: str = "aborted by the client") -> CheckpointRecord:
        req = pb.AbortRequest(id=_str(ckpt_id, "ckpt_id"), reason=_str(reason, "reason"))
        return record_from_pb(self._call(self._stub.Abort, req).checkpoint)

    def get(self, ckpt_id: str) -> CheckpointRecord:
        return record_from_pb(self._call(self._stub.Get, pb.GetRequest(id=_str(ckpt_id, "ckpt_id"))).checkpoint)

    def list(self, job: str, *, include_all: bool = False) -> list[CheckpointRecord]:
        reply = self._call(self._stub.List, pb.ListRequest(job=_str(job, "job"), include_all=bool(include_all)))
        return [record_from_pb(c) for c in reply.checkpoints]

    def latest(self, job: str) -> CheckpointRecord:
        return record_from_pb(self._call(self._stub.Latest, pb.LatestRequest(job=_str(job, "job"))).checkpoint)

    def jobs(self) -> list[str]:
        return list(self._call(self._stub.ListJobs, pb.ListJobsRequest()).jobs)

    def shards(self, ckpt_id: str) -> list[ShardCommit]:
        reply = self._call(self._stub.ListShards, pb.ListShardsRequest(id=_str(ckpt_id, "ckpt_id")))
        return [shard_from_pb(s) for s in reply.shards]

    def retention(self, job: str) -> RetentionPolicy:
        reply = self._call(self._stub.GetRetention, pb.GetRetentionRequest(job=_str(job, "job")))
        return retention_from_pb(reply.retention)

    def set_retention(self, job: str, policy: RetentionPolicy) -> RetentionPolicy:
        policy.check()
        req = pb.SetRetentionRequest(job=_str(job, "job"), keep_last=policy.keep_last, keep_every=policy.keep_every)
        return retention_from_pb(self._call(self._stub.SetRetention, req).retention)

    def pin(self, ckpt_id: str, pinned: bool = True) -> CheckpointRecord:
        req = pb.PinRequest(id=_str(ckpt_id, "ckpt_id"), pinned=bool(pinned))
        return record_from_pb(self._call(self._stub.Pin, req).checkpoint)

    def delete(self, ckpt_id: str, *, force: bool = False) -> CheckpointRecord:
        req = pb.DeleteRequest(id=_str(ckpt_id, "ckpt_id"), force=bool(force))
        return record_from_pb(self._call(self._stub.Delete, req).checkpoint)

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self._channel.close())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> CheckpointClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CheckpointClient({self.address!r}, closed={self._closed})"


# Arguments a protobuf field would refuse with a bare TypeError/ValueError are refused here with
# the InvalidArgument the Catalog raises for them; range checks stay on the service (one truth).
def _int(v: Any, name: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not -(1 << 63) <= v < (1 << 63):
        raise InvalidArgument(f"{name} must be an integer, got {v!r}", **{name: str(v)})
    return v


def _str(v: Any, name: str) -> str:
    if not isinstance(v, str):
        raise InvalidArgument(f"{name} must be a str, got {v!r}", **{name: str(v)})
    return v


def _meta(meta: dict[str, str] | None) -> dict[str, str]:
    meta = dict(meta or {})
    if any(not isinstance(k, str) or not isinstance(v, str) for k, v in meta.items()):
        raise InvalidArgument("checkpoint meta must map str to str")
    return meta
