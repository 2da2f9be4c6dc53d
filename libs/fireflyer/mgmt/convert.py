"""mgmtd's protobuf messages <-> :mod:`fireflyer.mgmt.model` Structs, both ways.

Used only at the gRPC edge: by ``services/mgmtd``'s servicer and by
:class:`fireflyer.mgmt.client.MgmtdClient`.  Enumerations travel as their lower-case
names (``"up-to-date"``); a name this process does not know is an
:class:`~fireflyer.core.errors.InvalidArgument` naming the field, so a bad request
is refused before anything is written.
"""

from __future__ import annotations

import enum
from typing import Any, TypeVar

from fireflyer.api.mgmtd.v1 import mgmtd_pb2 as pb
from fireflyer.core.errors import InvalidArgument

from .model import (
    Chain,
    ChainTable,
    ChainTarget,
    LocalState,
    NodeInfo,
    NodeStatus,
    NodeType,
    PublicState,
    RoutingInfo,
    TargetInfo,
)
from .registry import Heartbeat, TargetReport

__all__ = [
    "parse_enum",
    "node_to_pb",
    "node_from_pb",
    "target_to_pb",
    "target_from_pb",
    "chain_to_pb",
    "chain_from_pb",
    "table_to_pb",
    "table_from_pb",
    "routing_to_pb",
    "routing_from_pb",
    "heartbeat_to_pb",
    "heartbeat_from_pb",
]

E = TypeVar("E", bound=enum.Enum)


def parse_enum(cls: type[E], value: str, field: str) -> E:
    """``cls(value)``, or InvalidArgument listing the accepted names."""
    try:
        return cls(value)
    except ValueError:
        known = ", ".join(str(m.value) for m in cls)  # type: ignore[attr-defined]
        raise InvalidArgument(f"{field} must be one of {known}; got {value!r}", field=field, value=value) from None


def node_to_pb(n: NodeInfo) -> pb.NodeInfo:
    return pb.NodeInfo(node_id=n.node_id, type=str(n.type), address=n.address, hostname=n.hostname,
                       status=str(n.status), last_heartbeat=n.last_heartbeat, registered_at=n.registered_at,
                       tags=list(n.tags), owner=n.owner)


def node_from_pb(m: pb.NodeInfo) -> NodeInfo:
    return NodeInfo(node_id=m.node_id, type=parse_enum(NodeType, m.type, "node.type"), address=m.address,
                    hostname=m.hostname, status=parse_enum(NodeStatus, m.status, "node.status"),
                    last_heartbeat=m.last_heartbeat, registered_at=m.registered_at, tags=tuple(m.tags),
                    owner=m.owner)


def target_to_pb(t: TargetInfo) -> pb.TargetInfo:
    return pb.TargetInfo(target_id=t.target_id, node_id=t.node_id, chain_id=t.chain_id,
                         local_state=str(t.local_state), public_state=str(t.public_state), disk=t.disk,
                         path=t.path)


def target_from_pb(m: pb.TargetInfo) -> TargetInfo:
    return TargetInfo(target_id=m.target_id, node_id=m.node_id, chain_id=m.chain_id,
                      local_state=parse_enum(LocalState, m.local_state, "target.local_state"),
                      public_state=parse_enum(PublicState, m.public_state, "target.public_state"),
                      disk=m.disk, path=m.path)


def chain_to_pb(c: Chain) -> pb.Chain:
    return pb.Chain(chain_id=c.chain_id, version=c.version,
                    targets=[pb.ChainTarget(target_id=t.target_id, public_state=str(t.public_state))
                             for t in c.targets])


def chain_from_pb(m: pb.Chain) -> Chain:
    return Chain(chain_id=m.chain_id, version=m.version,
                 targets=tuple(ChainTarget(target_id=t.target_id,
                                           public_state=parse_enum(PublicState, t.public_state,
                                                                   "chain.targets.public_state"))
                               for t in m.targets))


def table_to_pb(t: ChainTable) -> pb.ChainTable:
    return pb.ChainTable(table_id=t.table_id, version=t.version, chain_ids=list(t.chain_ids), desc=t.desc)


def table_from_pb(m: pb.ChainTable) -> ChainTable:
    return ChainTable(table_id=m.table_id, version=m.version, chain_ids=tuple(m.chain_ids), desc=m.desc)


def routing_to_pb(r: RoutingInfo) -> pb.RoutingInfo:
    return pb.RoutingInfo(version=r.version, nodes=[node_to_pb(n) for n in r.nodes],
                          targets=[target_to_pb(t) for t in r.targets], chains=[chain_to_pb(c) for c in r.chains],
                          chain_tables=[table_to_pb(t) for t in r.chain_tables])


def routing_from_pb(m: pb.RoutingInfo) -> RoutingInfo:
    return RoutingInfo(version=m.version, nodes=tuple(node_from_pb(n) for n in m.nodes),
                       targets=tuple(target_from_pb(t) for t in m.targets),
                       chains=tuple(chain_from_pb(c) for c in m.chains),
                       chain_tables=tuple(table_from_pb(t) for t in m.chain_tables))


def heartbeat_to_pb(hb: Heartbeat) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(node_id=hb.node_id, node_type=str(hb.node_type), address=hb.address,
                               hostname=hb.hostname, tags=list(hb.tags),
                               targets=[pb.TargetReport(target_id=t.target_id, local_state=str(t.local_state),
                                                        disk=t.disk, path=t.path) for t in hb.targets])


def heartbeat_from_pb(m: pb.HeartbeatRequest, **event: Any) -> Heartbeat:
    """The registry's Heartbeat from a request; InvalidArgument on an empty id or unknown names."""
    if not m.node_id:
        raise InvalidArgument("heartbeat needs a node_id", field="node_id")
    if not m.address:
        raise InvalidArgument(f"heartbeat of {m.node_id!r} needs its address (host:port)", field="address",
                              node=m.node_id)
    seen: set[int] = set()
    reports = []
    for t in m.targets:
        if t.target_id == 0 or t.target_id in seen:
            raise InvalidArgument(f"heartbeat of {m.node_id!r} reports target {t.target_id} "
                                  f"{'twice' if t.target_id else '(ids start at 1)'}",
                                  field="targets", node=m.node_id, target=t.target_id)
        seen.add(t.target_id)
        reports.append(TargetReport(target_id=t.target_id,
                                    local_state=parse_enum(LocalState, t.local_state, "targets.local_state"),
                                    disk=t.disk, path=t.path))
    return Heartbeat(node_id=m.node_id, node_type=parse_enum(NodeType, m.node_type, "node_type"),
                     address=m.address, hostname=m.hostname, tags=tuple(m.tags), targets=tuple(reports),
                     **event)
