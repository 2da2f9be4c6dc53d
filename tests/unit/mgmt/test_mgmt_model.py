"""mgmtd records: msgpack/JSON round trips (they live in the KV), readable enum values, immutability."""

from __future__ import annotations

import msgspec
import pytest

from fireflyer.mgmt.model import (
    Chain,
    ChainTable,
    ChainTarget,
    LeaseRecord,
    LocalState,
    NodeInfo,
    NodeStatus,
    NodeType,
    PublicState,
    RoutingInfo,
    TargetInfo,
)


def sample() -> RoutingInfo:
    return RoutingInfo(
        version=3,
        nodes=(NodeInfo(node_id="s1", type=NodeType.STORAGE, address="127.0.0.1:9000", last_heartbeat=1.5),),
        targets=(
            TargetInfo(
                target_id=11,
                node_id="s1",
                chain_id=1,
                local_state=LocalState.UPTODATE,
                public_state=PublicState.SERVING,
                disk="nvme0",
                path="/data/t11",
            ),
        ),  # fmt: skip
        chains=(
            Chain(
                chain_id=1, version=2, targets=(ChainTarget(target_id=11, public_state=PublicState.SERVING),)
            ),
        ),
        chain_tables=(ChainTable(table_id=1, version=1, chain_ids=(1,)),),
    )


@pytest.mark.parametrize("codec", [msgspec.msgpack, msgspec.json])
def test_routing_info_round_trips(codec) -> None:  # type: ignore[no-untyped-def]
    r = sample()
    assert codec.decode(codec.encode(r), type=RoutingInfo) == r


def test_lease_record_round_trips() -> None:
    lr = LeaseRecord(holder="m1", address="a:1", term=2, acquired_at=1.0, renewed_at=2.0, expires_at=62.0)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(lr), type=LeaseRecord) == lr


def test_enum_values_are_3fs_names() -> None:
    assert [s.value for s in LocalState] == ["up-to-date", "online", "offline"]
    assert [s.value for s in PublicState] == ["serving", "syncing", "waiting", "lastsrv", "offline"]
    assert NodeStatus.HEARTBEAT_FAILED.value == "heartbeat-failed"
    assert b'"heartbeat-failed"' in msgspec.json.encode(NodeStatus.HEARTBEAT_FAILED)


def test_records_are_frozen_and_keyword_only() -> None:
    r = sample()
    with pytest.raises(AttributeError):
        r.version = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        ChainTarget(11, PublicState.SERVING)  # type: ignore[misc]
    c = r.chains[0]
    assert c.head == 11 and c.serving() == (11,) and c.target_ids == (11,)
    with pytest.raises(KeyError):
        c.state_of(99)
