"""gRPC edge of mgmtd: protobuf in, :class:`~services.mgmtd.loops.MgmtdCore` calls, protobuf out.

Only conversion and role checks live here.  Reads (GetRoutingInfo, GetPrimary, List*)
need any valid token (the interceptor refuses calls without one).  Heartbeat -- which
registers a node and with it the address its peers and clients send their tokens to --
needs the ``service`` role, which only the cluster's own credentials carry (not users, not
admins: an operator's token is not a node); the node is then bound to the calling service
user (:func:`fireflyer.mgmt.registry.check_owner`).  Chain mutations need ``admin`` or
``service``: operators run them, and a storage node runs three itself -- CreateChains and
CreateChainTable for ``init_chains`` (a local cluster's first chains) and OfflineTarget to
repair a corrupted chunk.  Bad requests raise InvalidArgument while converting, before the
core is called, so nothing is written.
"""

from __future__ import annotations

from typing import Any

from fireflyer.api.mgmtd.v1 import mgmtd_pb2 as pb
from fireflyer.api.mgmtd.v1 import mgmtd_pb2_grpc as pb_grpc
from fireflyer.mgmt import convert, edits
from fireflyer.rpc import current_principal, requires

from .loops import MgmtdCore

__all__ = ["SERVICE_NAME", "MgmtdServicer"]

SERVICE_NAME = "ff.mgmtd.v1.MgmtdService"


class MgmtdServicer(pb_grpc.MgmtdServiceServicer):
    def __init__(self, core: MgmtdCore) -> None:
        self.core = core

    async def GetRoutingInfo(self, request: pb.GetRoutingInfoRequest, context: Any) -> pb.GetRoutingInfoReply:
        routing = await self.core.routing()
        if request.known_version and request.known_version == routing.version:
            return pb.GetRoutingInfoReply(changed=False, routing=pb.RoutingInfo(version=routing.version))
        return pb.GetRoutingInfoReply(changed=True, routing=convert.routing_to_pb(routing))

    @requires("service")
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatReply:
        hb = convert.heartbeat_from_pb(request, sender=current_principal().user)
        version = await self.core.heartbeat(hb)
        return pb.HeartbeatReply(routing_version=version, primary=self.core.node_id,
                                 fail_interval_s=self.core.cfg.fail_interval_s)

    async def GetPrimary(self, request: pb.GetPrimaryRequest, context: Any) -> pb.GetPrimaryReply:
        rec = await self.core.read_lease()
        live = rec is not None and self.core.clock.time() < rec.expires_at
        return pb.GetPrimaryReply(
            primary=rec.holder if live and rec else "", primary_address=rec.address if live and rec else "",
            term=rec.term if rec else 0, expires_at=rec.expires_at if rec else 0.0,
            node=self.core.node_id, node_address=self.core.address, is_primary=self.core.is_primary())

    async def ListNodes(self, request: pb.ListNodesRequest, context: Any) -> pb.ListNodesReply:
        r = await self.core.routing()
        return pb.ListNodesReply(routing_version=r.version, nodes=[convert.node_to_pb(n) for n in r.nodes])

    async def ListTargets(self, request: pb.ListTargetsRequest, context: Any) -> pb.ListTargetsReply:
        r = await self.core.routing()
        return pb.ListTargetsReply(routing_version=r.version, targets=[convert.target_to_pb(t) for t in r.targets])

    async def ListChains(self, request: pb.ListChainsRequest, context: Any) -> pb.ListChainsReply:
        r = await self.core.routing()
        return pb.ListChainsReply(routing_version=r.version, chains=[convert.chain_to_pb(c) for c in r.chains])

    async def ListChainTables(self, request: pb.ListChainTablesRequest, context: Any) -> pb.ListChainTablesReply:
        r = await self.core.routing()
        return pb.ListChainTablesReply(routing_version=r.version,
                                       chain_tables=[convert.table_to_pb(t) for t in r.chain_tables])

    @requires("admin", "service")
    async def CreateChains(self, request: pb.CreateChainsRequest, context: Any) -> pb.CreateChainsReply:
        specs = [edits.ChainSpec(chain_id=c.chain_id,
                                 targets=tuple(edits.TargetSpec(target_id=t.target_id, node_id=t.node_id,
                                                                disk=t.disk, path=t.path) for t in c.targets))
                 for c in request.chains]
        new = await self.core.mutate(lambda r: edits.create_chains(r, specs))
        wanted = {s.chain_id for s in specs}
        return pb.CreateChainsReply(routing_version=new.version,
                                    chains=[convert.chain_to_pb(c) for c in new.chains if c.chain_id in wanted])

    @requires("admin", "service")
    async def CreateChainTable(self, request: pb.CreateChainTableRequest, context: Any
                               ) -> pb.CreateChainTableReply:
        ids, desc = tuple(request.chain_ids), request.desc
        new = await self.core.mutate(lambda r: edits.create_chain_table(r, request.table_id, ids, desc))
        table = edits.latest_tables(new)[request.table_id]
        return pb.CreateChainTableReply(routing_version=new.version, table=convert.table_to_pb(table))

    @requires("admin", "service")
    async def OfflineTarget(self, request: pb.OfflineTargetRequest, context: Any) -> pb.OfflineTargetReply:
        new = await self.core.offline_target(request.target_id)
        target = next(t for t in new.targets if t.target_id == request.target_id)
        chain = next(c for c in new.chains if c.chain_id == target.chain_id)
        return pb.OfflineTargetReply(routing_version=new.version, chain=convert.chain_to_pb(chain))
