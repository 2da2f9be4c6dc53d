"""Protobuf <-> checkpoint Structs: generated types stay at this edge (DESIGN.md §2)."""

from __future__ import annotations

from fireflyer.api.checkpoint.v1 import checkpoint_pb2 as pb
from fireflyer.core.errors import InvalidArgument

from .model import CheckpointRecord, CkptState, RetentionPolicy, ShardCommit

__all__ = ["STATE_TO_PB", "STATE_FROM_PB", "record_to_pb", "record_from_pb", "shard_to_pb", "shard_from_pb",
           "retention_to_pb", "retention_from_pb"]

STATE_TO_PB = {
    CkptState.PENDING: pb.CKPT_STATE_PENDING,
    CkptState.COMMITTING: pb.CKPT_STATE_COMMITTING,
    CkptState.COMMITTED: pb.CKPT_STATE_COMMITTED,
    CkptState.ABORTED: pb.CKPT_STATE_ABORTED,
    CkptState.DELETING: pb.CKPT_STATE_DELETING,
}
STATE_FROM_PB = {v: k for k, v in STATE_TO_PB.items()}


def record_to_pb(r: CheckpointRecord) -> pb.Checkpoint:
    return pb.Checkpoint(id=r.id, job=r.job, step=r.step, world_size=r.world_size, directory=r.directory,
                         state=STATE_TO_PB[r.state], meta=dict(r.meta), created_at=r.created_at,
                         updated_at=r.updated_at, committed_at=r.committed_at, ranks_committed=r.ranks_committed,
                         nbytes=r.nbytes, pinned=r.pinned, reason=r.reason, owner=r.owner)


def record_from_pb(m: pb.Checkpoint) -> CheckpointRecord:
    state = STATE_FROM_PB.get(m.state)
    if state is None:
        # a newer service with a state this client does not know: refuse rather than guess
        raise InvalidArgument(f"checkpoint {m.id} has an unknown state {m.state}; upgrade fireflyer",
                              checkpoint=m.id, state=m.state)
    return CheckpointRecord(id=m.id, job=m.job, step=m.step, world_size=m.world_size, directory=m.directory,
                            state=state, meta=dict(m.meta), created_at=m.created_at, updated_at=m.updated_at,
                            committed_at=m.committed_at, ranks_committed=m.ranks_committed, nbytes=m.nbytes,
                            pinned=m.pinned, reason=m.reason, owner=m.owner)


def shard_to_pb(s: ShardCommit) -> pb.Shard:
    return pb.Shard(rank=s.rank, index_digest=s.index_digest, nbytes=s.nbytes, committed_at=s.committed_at)


def shard_from_pb(m: pb.Shard) -> ShardCommit:
    return ShardCommit(rank=m.rank, index_digest=m.index_digest, nbytes=m.nbytes, committed_at=m.committed_at)


def retention_to_pb(p: RetentionPolicy) -> pb.Retention:
    return pb.Retention(keep_last=p.keep_last, keep_every=p.keep_every)


def retention_from_pb(m: pb.Retention) -> RetentionPolicy:
    return RetentionPolicy(keep_last=m.keep_last, keep_every=m.keep_every)
