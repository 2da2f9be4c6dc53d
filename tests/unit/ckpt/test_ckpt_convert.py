"""Protobuf <-> checkpoint Structs: every field and state survives the round trip; unknown states are refused."""

from __future__ import annotations

import pytest

from fireflyer.api.checkpoint.v1 import checkpoint_pb2 as pb
from fireflyer.ckpt.convert import (
    STATE_FROM_PB,
    STATE_TO_PB,
    record_from_pb,
    record_to_pb,
    retention_from_pb,
    retention_to_pb,
    shard_from_pb,
    shard_to_pb,
)
from fireflyer.ckpt.model import CheckpointRecord, CkptState, RetentionPolicy, ShardCommit
from fireflyer.core.errors import InvalidArgument


@pytest.mark.parametrize("state", list(CkptState))
def test_record_round_trip_every_state(state: CkptState) -> None:
    rec = CheckpointRecord(id="ckpt-01ABC", job="llama-7b.v2", step=(1 << 40) + 3, world_size=2048,
                           directory="/ckpt/llama-7b.v2/step0000000003-abc", state=state,
                           meta={"lr": "3e-4", "git": "deadbeef"}, created_at=1.5, updated_at=2.25,
                           committed_at=3.125, ranks_committed=17, nbytes=(5 << 40) + 1, pinned=True,
                           reason="superseded by step 9")
    wire = record_to_pb(rec).SerializeToString()
    assert record_from_pb(pb.Checkpoint.FromString(wire)) == rec


def test_record_defaults_and_unknown_state() -> None:
    rec = CheckpointRecord(id="c", job="j", step=0, world_size=1, directory="/d", state=CkptState.PENDING)
    assert record_from_pb(record_to_pb(rec)) == rec
    assert set(STATE_TO_PB) == set(CkptState) and len(STATE_FROM_PB) == len(CkptState)
    with pytest.raises(InvalidArgument, match="unknown state"):
        record_from_pb(pb.Checkpoint(id="c", state=pb.CKPT_STATE_UNSPECIFIED))


def test_shard_and_retention_round_trip() -> None:
    s = ShardCommit(rank=4095, index_digest="ab" * 16, nbytes=1 << 36, committed_at=12.5)
    assert shard_from_pb(pb.Shard.FromString(shard_to_pb(s).SerializeToString())) == s
    for policy in (RetentionPolicy(), RetentionPolicy(keep_last=0, keep_every=0), RetentionPolicy(keep_last=2,
                                                                                                   keep_every=1000)):
        assert retention_from_pb(pb.Retention.FromString(retention_to_pb(policy).SerializeToString())) == policy
