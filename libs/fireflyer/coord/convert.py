"""Protobuf <-> coord Structs: generated types stay at this edge (DESIGN.md §2)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from fireflyer.api.coord.v1 import coord_pb2 as pb

from .layout import TreeView
from .model import ABORTED, ACTIVE, ENDED, FORMING, CommRecord, JoinSpec, Member
from .opstats import OpStatsReport

__all__ = ["STATE_TO_PB", "STATE_FROM_PB", "JoinResult", "NodeView", "join_spec_from_pb", "join_spec_to_pb",
           "join_reply", "join_result_from_pb", "comm_to_pb", "CommView", "comm_from_pb", "opstats_to_pb",
           "opstats_from_pb"]

STATE_TO_PB = {FORMING: pb.COMM_STATE_FORMING, ACTIVE: pb.COMM_STATE_ACTIVE, ABORTED: pb.COMM_STATE_ABORTED,
               ENDED: pb.COMM_STATE_ENDED}
STATE_FROM_PB = {v: k for k, v in STATE_TO_PB.items()}


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    zone: str
    node_rank: int
    local_world_size: int
    first_rank: int
    address: str
    left: bool = False
    last_seen_age_s: float = -1.0


class JoinResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a node learns from Join: its place in the job and in both trees."""

    comm: str
    generation: int
    node_rank: int
    first_rank: int
    world_size: int
    nodes: tuple[NodeView, ...]
    trees: tuple[TreeView, TreeView]
    heartbeat_interval_s: float
    heartbeat_misses: int
    cross_zone_pairs: int
    aborted_subject: str

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes]

    @property
    def zones(self) -> list[str] | None:
        zones = [n.zone for n in self.nodes]
        return zones if any(zones) else None


class CommView(msgspec.Struct, frozen=True, kw_only=True):
    comm: str
    job: str
    name: str
    generation: int
    state: str
    reason: str
    culprit: str
    nnodes: int
    world_size: int
    restart_count: int
    nodes: tuple[NodeView, ...]
    created_at: float
    formed_at: float
    ended_at: float
    depth: int
    cross_zone_pairs: int


def join_spec_from_pb(r: pb.JoinRequest) -> JoinSpec:
    return JoinSpec(job=r.job, name=r.name, node=r.node, zone=r.zone, local_world_size=r.local_world_size,
                    address=r.address, nnodes=r.nnodes, world_size=r.world_size, restart_count=r.restart_count,
                    expected_nodes=tuple(r.expected_nodes))


def join_spec_to_pb(s: JoinSpec, timeout_s: float) -> pb.JoinRequest:
    return pb.JoinRequest(job=s.job, name=s.name, node=s.node, zone=s.zone, local_world_size=s.local_world_size,
                          address=s.address, nnodes=s.nnodes, world_size=s.world_size,
                          restart_count=s.restart_count, timeout_s=timeout_s, expected_nodes=list(s.expected_nodes))


def _node_pb(m: Member, age: float = -1.0) -> pb.NodeInfo:
    return pb.NodeInfo(node=m.node, zone=m.zone, node_rank=max(m.node_rank, 0), local_world_size=m.local_world_size,
                       first_rank=m.first_rank, address=m.address, left=m.left, last_seen_age_s=age)


def _tree_pb(t: TreeView) -> pb.TreeLinks:
    return pb.TreeLinks(parent=t.parent, parent_address=t.parent_address, children=list(t.children),
                        child_addresses=list(t.child_addresses), root=t.root, depth=t.depth)


def join_reply(rec: CommRecord, node_rank: int, trees: tuple[TreeView, TreeView], *, interval_s: float,
               misses: int, aborted_subject: str) -> pb.JoinReply:
    me = rec.members[node_rank]
    return pb.JoinReply(comm=rec.comm, generation=rec.generation, node_rank=node_rank, first_rank=me.first_rank,
                        world_size=rec.world_size, nodes=[_node_pb(m) for m in rec.members],
                        trees=[_tree_pb(t) for t in trees], heartbeat_interval_s=interval_s,
                        heartbeat_misses=misses, cross_zone_pairs=rec.cross_zone_pairs,
                        aborted_subject=aborted_subject)


def _node_view(n: pb.NodeInfo) -> NodeView:
    return NodeView(node=n.node, zone=n.zone, node_rank=n.node_rank, local_world_size=n.local_world_size,
                    first_rank=n.first_rank, address=n.address, left=n.left, last_seen_age_s=n.last_seen_age_s)


def _tree_view(t: pb.TreeLinks) -> TreeView:
    return TreeView(parent=t.parent, parent_address=t.parent_address, children=tuple(t.children),
                    child_addresses=tuple(t.child_addresses), root=t.root, depth=t.depth)


def join_result_from_pb(r: pb.JoinReply) -> JoinResult:
    return JoinResult(comm=r.comm, generation=r.generation, node_rank=r.node_rank, first_rank=r.first_rank,
                      world_size=r.world_size, nodes=tuple(_node_view(n) for n in r.nodes),
                      trees=(_tree_view(r.trees[0]), _tree_view(r.trees[1])),
                      heartbeat_interval_s=r.heartbeat_interval_s, heartbeat_misses=r.heartbeat_misses,
                      cross_zone_pairs=r.cross_zone_pairs, aborted_subject=r.aborted_subject)


def comm_to_pb(rec: CommRecord, age: Callable[[str], float] | None = None) -> pb.Communicator:
    return pb.Communicator(
        comm=rec.comm, job=rec.job, name=rec.name, generation=rec.generation, state=STATE_TO_PB[rec.state],
        reason=rec.reason, culprit=rec.culprit, nnodes=rec.nnodes, world_size=rec.world_size,
        restart_count=rec.restart_count, nodes=[_node_pb(m, age(m.node) if age else -1.0) for m in rec.members],
        created_at=rec.created_at, formed_at=rec.formed_at, ended_at=rec.ended_at, depth=rec.depth,
        cross_zone_pairs=rec.cross_zone_pairs)


def comm_from_pb(c: pb.Communicator) -> CommView:
    return CommView(comm=c.comm, job=c.job, name=c.name, generation=c.generation,
                    state=STATE_FROM_PB.get(c.state, "unknown"), reason=c.reason, culprit=c.culprit,
                    nnodes=c.nnodes, world_size=c.world_size, restart_count=c.restart_count,
                    nodes=tuple(_node_view(n) for n in c.nodes), created_at=c.created_at, formed_at=c.formed_at,
                    ended_at=c.ended_at, depth=c.depth, cross_zone_pairs=c.cross_zone_pairs)


def opstats_to_pb(rep: OpStatsReport, names: dict[int, str]) -> pb.GetOpStatsReply:
    return pb.GetOpStatsReply(
        comm=rep.comm, ops=rep.ops, dropped=rep.dropped,
        nodes=[pb.NodeOpStats(node_rank=n.node_rank, node=names.get(n.node_rank, ""), ops=n.ops,
                              arrival_lag_mean_s=n.arrival_lag_mean_s, arrival_lag_max_s=n.arrival_lag_max_s,
                              local_reduce_mean_s=n.local_reduce_mean_s, tree_mean_s=n.tree_mean_s,
                              writeback_mean_s=n.writeback_mean_s, last_arrivals=n.last_arrivals)
               for n in rep.nodes],
        edges=[pb.EdgeStats(src=e.src, dst=e.dst, ops=e.ops, transfer_mean_s=e.transfer_mean_s,
                            transfer_max_s=e.transfer_max_s, bytes_sent=e.bytes_sent) for e in rep.edges],
        recent=[pb.OpSummary(generation=s.generation, seq=s.seq, kind=s.kind, nbytes=s.nbytes,
                             nodes_reported=s.nodes_reported, span_s=s.span_s, last_node=s.last_node,
                             max_lag_s=s.max_lag_s, error=s.error) for s in rep.recent])


def opstats_from_pb(r: pb.GetOpStatsReply) -> tuple[OpStatsReport, dict[int, str]]:
    from .opstats import EdgeStat, NodeStats, OpSummary

    rep = OpStatsReport(
        comm=r.comm, ops=r.ops, dropped=r.dropped,
        nodes=[NodeStats(node_rank=n.node_rank, ops=n.ops, arrival_lag_mean_s=n.arrival_lag_mean_s,
                         arrival_lag_max_s=n.arrival_lag_max_s, local_reduce_mean_s=n.local_reduce_mean_s,
                         tree_mean_s=n.tree_mean_s, writeback_mean_s=n.writeback_mean_s,
                         last_arrivals=n.last_arrivals) for n in r.nodes],
        edges=[EdgeStat(src=e.src, dst=e.dst, ops=e.ops, transfer_mean_s=e.transfer_mean_s,
                        transfer_max_s=e.transfer_max_s, bytes_sent=e.bytes_sent) for e in r.edges],
        recent=[OpSummary(generation=s.generation, seq=s.seq, kind=s.kind, nbytes=s.nbytes,
                          nodes_reported=s.nodes_reported, span_s=s.span_s, last_node=s.last_node,
                          max_lag_s=s.max_lag_s, error=s.error) for s in r.recent])
    return rep, {n.node_rank: n.node for n in r.nodes}
