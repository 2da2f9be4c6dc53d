"""A real storage cluster for tests: one mgmtd, three storage processes, the minimal client.

Timing (mgmtd heartbeat fail interval 1.5 s, chain updater 0.2 s; storage heartbeats every
0.3 s and fences itself after 0.75 s without an ack) makes failure detection take about
two seconds.  Each storage node has two targets; storage node 0 creates two 3-replica
chains (``FF_STORAGE_INIT_CHAINS``) and chain table 1::

    chain 1: 101@storage-0, 201@storage-1, 301@storage-2
    chain 2: 202@storage-1, 302@storage-2, 102@storage-0
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fireflyer.mgmt.client import MgmtdClient
from fireflyer.mgmt.model import PublicState, RoutingInfo
from fireflyer.rpc import TokenEntry, generate_token, write_tokens_file
from fireflyer.storage import ChainVersionMismatch, ChunkId, ChunkNotFound, NotServing, ReadReply, ReadReq
from fireflyer.storage.capability import READ, WRITE, CapabilityCache, Grantor, read_key_file
from fireflyer.storage.client_min import ConnectionPool, MgmtdRouting, SendLimiter, StorageClient
from fireflyer.storage.protocol import OP_READ, ReadMsg, split_address, to_meta, wire_address
from fireflyer.testing.poll import wait_for
from fireflyer.testing.services import ServiceProcess

MGMTD_TIMING = {
    "FF_MGMTD_LEASE_S": "2",
    "FF_MGMTD_RENEW_S": "0.5",
    "FF_MGMTD_STEP_DOWN_MARGIN_S": "0.5",
    "FF_MGMTD_HEARTBEAT_FAIL_INTERVAL_S": "1.5",
    "FF_MGMTD_SCAN_INTERVAL_S": "0.2",
    "FF_MGMTD_CHAIN_UPDATE_INTERVAL_S": "0.2",
    "FF_GRACE_S": "1",
}
STORAGE_ENV = {
    "FF_STORAGE_TARGET_COUNT": "2",
    "FF_STORAGE_FSYNC": "false",
    "FF_STORAGE_HEARTBEAT_INTERVAL_S": "0.3",
    "FF_STORAGE_ROUTING_PULL_S": "0.3",
    "FF_STORAGE_RESYNC_INTERVAL_S": "0.2",
    "FF_STORAGE_CONNECT_TIMEOUT_S": "0.5",
    "FF_STORAGE_FORWARD_TIMEOUT_S": "1.0",
    "FF_STORAGE_FORWARD_MAX_ATTEMPTS": "40",
    "FF_STORAGE_FORWARD_DEADLINE_S": "15",
    "FF_STORAGE_INIT_CHAINS": "nodes=3,replicas=3,table=1",
    "FF_GRACE_S": "1",
}
CHUNK = 64 * 1024
#: the chunk wait_all_serving reads from every replica to see that it is current
_PROBE = ChunkId(999_999, 0, 0)


class StorageCluster:
    def __init__(self, tmp: Path, nats_url: str, tokens_file: Path, admin: str, user: str, service: str) -> None:
        self.tmp, self.nats_url, self.tokens_file, self.admin, self.user = tmp, nats_url, tokens_file, admin, user
        #: the storage nodes' credential (user svc-storage, role service), as ff up gives them
        self.service = service
        self.bob = ""
        self.mgmtd: ServiceProcess | None = None
        self.storage: list[ServiceProcess] = []
        self.client: MgmtdClient | None = None
        self.routing_src: MgmtdRouting | None = None
        self.clients: list[StorageClient] = []
        self.pool = ConnectionPool(token=service, name="test", connect_timeout_s=1.0, request_timeout_s=2.0,
                                   io_timeout_s=2.0)

    def storage_proc(self, i: int, **env: str) -> ServiceProcess:
        assert self.mgmtd is not None
        return ServiceProcess("services.storage", state_dir=self.tmp, nats_url=self.nats_url,
                              tokens_file=self.tokens_file, instance=f"storage-{i}",
                              env={**STORAGE_ENV, "FF_TOKEN": self.service, "FF_MGMTD_ADDR": self.mgmtd.address,
                                   **env})

    async def start(self, mgmtd_env: dict[str, str] | None = None, **storage_env: str) -> StorageCluster:
        self.mgmtd = ServiceProcess("services.mgmtd", state_dir=self.tmp, nats_url=self.nats_url,
                                    tokens_file=self.tokens_file, instance="mgmtd-0",
                                    env={**MGMTD_TIMING, "FF_MGMTD_KV_URL": f"sqlite:///{self.tmp}/mgmtd.db",
                                         **(mgmtd_env or {})}).start()
        await self.mgmtd.wait_healthy(30.0)
        self.client = MgmtdClient([self.mgmtd.address], token=self.admin, call_timeout_s=2.0)
        self.storage = [self.storage_proc(i, **storage_env).start() for i in range(3)]
        await asyncio.gather(*(p.wait_healthy(30.0) for p in self.storage))
        await self.wait_all_serving(chains=2, timeout_s=30.0)
        self.routing_src = MgmtdRouting([self.mgmtd.address], token=self.user)
        return self

    async def routing(self) -> RoutingInfo:
        assert self.client is not None
        r = await self.client.get_routing()
        assert r is not None
        return r

    async def wait_all_serving(self, chains: int = 2, timeout_s: float = 20.0) -> RoutingInfo:
        """Every target serving in mgmtd's routing *and* on its own node.  mgmtd publishes a
        routing before the storage nodes pull it (every 0.3 s here), and until a node has it
        a request sent with it is refused (the chain unknown, or at another version), which
        a client retries but a test's raw request does not: so probe every replica."""
        async def ok() -> RoutingInfo | None:
            r = await self.routing()
            good = len(r.chains) == chains and all(
                s is PublicState.SERVING for c in r.chains for s in c.states)
            return r if good and await asyncio.to_thread(self._all_current, r) else None

        return await wait_for(ok, timeout_s=timeout_s, interval_s=0.1, what="every target serving")

    def _all_current(self, routing: RoutingInfo) -> bool:
        """Does every replica serve a read at ``routing``'s chain versions?  (A chunk no test writes.)"""
        for c in routing.chains:
            for t in c.target_ids:
                try:
                    self.read_target(routing, c.chain_id, t, _PROBE)
                except ChunkNotFound:
                    pass
                except (NotServing, ChainVersionMismatch):
                    return False
        return True

    async def wait_state(self, target: int, state: PublicState, timeout_s: float = 15.0) -> RoutingInfo:
        async def ok() -> RoutingInfo | None:
            r = await self.routing()
            return r if any(c.state_of(target) is state for c in r.chains if target in c.target_ids) else None

        return await wait_for(ok, timeout_s=timeout_s, interval_s=0.05, what=f"target {target} {state}")

    def grants(self, user: str = "alice", *, lifetime_s: float = 600.0) -> CapabilityCache:
        """Capabilities signed with the nodes' key (``<tmp>/capability.key``), as meta grants them
        on open: read-write on any inode, for ``user`` (the user token's is alice)."""
        grantor = Grantor(read_key_file(self.tmp / "capability.key"), lifetime_s=lifetime_s)
        return CapabilityCache(lambda inode, mode, old: grantor.grant(inode=inode, mode=READ | WRITE, user=user))

    def data_client(self, **kw: Any) -> StorageClient:
        assert self.routing_src is not None
        kw.setdefault("capabilities", self.grants())
        kw.setdefault("request_timeout_s", 1.0)
        kw.setdefault("connect_timeout_s", 0.5)
        c = StorageClient(self.routing_src.get, token=self.user, limiter=kw.pop("limiter", SendLimiter()), **kw)
        self.clients.append(c)
        return c

    def read_target(self, routing: RoutingInfo, chain_id: int, target: int, cid: ChunkId) -> tuple[ReadReply, bytes]:
        """Read a whole chunk from one given replica (bypassing load balancing)."""
        chain = next(c for c in routing.chains if c.chain_id == chain_id)
        t = next(t for t in routing.targets if t.target_id == target)
        node = next(n for n in routing.nodes if n.node_id == t.node_id)
        addr = wire_address(node.tags)
        assert addr is not None
        msg = ReadMsg(target=target, req=ReadReq(chain_id=chain_id, chain_ver=chain.version, chunk_id=cid))
        reply = self.pool.call(split_address(addr), OP_READ, meta=to_meta(msg))
        import msgspec

        return msgspec.convert(reply.meta, ReadReply), bytes(reply.payload)

    def node_address(self, routing: RoutingInfo, node_id: str) -> tuple[str, int]:
        node = next(n for n in routing.nodes if n.node_id == node_id)
        addr = wire_address(node.tags)
        assert addr is not None
        return split_address(addr)

    async def close(self) -> None:
        for c in self.clients:
            c.close()
        self.pool.close()
        if self.routing_src is not None:
            self.routing_src.close()
        if self.client is not None:
            await self.client.close()
        for p in self.storage:
            if p.returncode is None:
                import signal

                p.signal(signal.SIGCONT)
            p.stop(timeout_s=5.0)
        if self.mgmtd is not None:
            self.mgmtd.stop(timeout_s=5.0)


def new_cluster(tmp_path: Path, nats_url: str) -> StorageCluster:
    """A cluster not yet started, with an admin, a user and the storage service's token (tests that
    start it their way)."""
    admin, user, service, bob = generate_token(), generate_token(), generate_token(), generate_token()
    tokens = write_tokens_file(tmp_path / "tokens.json", [
        TokenEntry(token=admin, user="root-admin", roles=["admin"]),
        TokenEntry(token=user, user="alice", roles=["user"]),
        TokenEntry(token=bob, user="bob", roles=["user"]),
        TokenEntry(token=service, user="svc-storage", roles=["service"]),
    ])
    c = StorageCluster(tmp_path, nats_url, tokens, admin, user, service)
    c.bob = bob  # a second user (capabilities are per user)
    return c
