"""Meta and mgmtd: chain tables from routing info, and heartbeats so clients find meta.

3FS services pull routing info every 10 s and compare versions;
:class:`~fireflyer.mgmt.client.RoutingCache` does that and also refreshes on
mgmtd's ``RoutingUpdated`` NATS events.  Each refresh that brings a newer
version copies its chain tables into :class:`RoutedChainTables`, which the
store reads synchronously.  A create that names a table the cache lacks asks
for one immediate refresh (:meth:`RoutingFollower.refresh_now`).

The follower also heartbeats this replica to mgmtd as a ``meta`` node with its
gRPC address, which is how ``MetaClient.connect(mgmtd=...)`` finds replicas.
mgmtd being down never stops meta from serving: lookups, stats and creates
under known tables go on with the last tables seen.
"""

from __future__ import annotations

import asyncio
import socket

from fireflyer.core.errors import DeadlineExceeded, Unavailable
from fireflyer.core.runtime import ServiceContext
from fireflyer.mgmt.client import HeartbeatSender, MgmtdClient, RoutingCache
from fireflyer.mgmt.model import NodeType, RoutingInfo
from fireflyer.mgmt.registry import Heartbeat

from .chains import RoutedChainTables

__all__ = ["REFRESH_WAIT_S", "RoutingFollower"]

#: how long a create naming an unknown chain table keeps asking an unreachable mgmtd
#: (a little over the channel's longest reconnect backoff, rpc.reconnect_backoff_max_s)
REFRESH_WAIT_S = 3.0


class RoutingFollower:
    def __init__(self, ctx: ServiceContext, address: str, *, token: str | None, refresh_s: float,
                 cluster_id: str, heartbeat_s: float) -> None:
        self.ctx = ctx
        self.tables = RoutedChainTables()
        self.client = MgmtdClient(address, token=token)
        self.cache = RoutingCache(self.client, bus=ctx.bus, cluster_id=cluster_id, pull_interval_s=refresh_s)
        self.cache.on_update.append(self._adopt)
        self.heartbeat_s = heartbeat_s
        self.sender: HeartbeatSender | None = None

    def _adopt(self, routing: RoutingInfo) -> None:
        if self.tables.load(routing.chain_tables, routing.version):
            self.ctx.log.info("meta.routing_updated", version=routing.version,
                              tables=[t.table_id for t in routing.chain_tables])

    async def start(self) -> None:
        await self.cache.start()  # best effort: mgmtd may come up after meta
        self.ctx.spawn(self._heartbeat_when_serving(), name="meta.heartbeat")

    async def refresh_now(self, wait_s: float = REFRESH_WAIT_S) -> bool:
        """Pull routing info now; True once mgmtd answered.  Also True when the pull brought
        nothing newer: a periodic pull or a version event may have adopted the table
        while the failed call ran, so the caller retries once either way.

        An unreachable mgmtd is asked again for up to ``wait_s``: a gRPC channel whose
        last connect failed (meta came up before mgmtd) fails calls at once until its
        next reconnect attempt, and a create right after start-up met exactly that in CI.
        False when mgmtd never answered."""
        deadline = asyncio.get_running_loop().time() + wait_s
        delay = 0.05
        while True:
            try:
                await self.cache.refresh()
                return True
            except (Unavailable, DeadlineExceeded) as e:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    self.ctx.log.warning("meta.routing_refresh_failed", error=str(e), wait_s=wait_s)
                    return False
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, 0.5)

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(node_id=self.ctx.instance, node_type=NodeType.META, address=self.ctx.server.address,
                         hostname=socket.gethostname())

    async def _heartbeat_when_serving(self) -> None:
        # the runtime binds the port after start(): report an address only once there is one
        while not self.ctx.server.port:
            await asyncio.sleep(0.05)
        self.sender = HeartbeatSender(self.client, self._heartbeat, interval_s=self.heartbeat_s).start()

    async def stop(self) -> None:
        if self.sender is not None:
            await self.sender.stop()
        await self.cache.stop()
        await self.client.close()
