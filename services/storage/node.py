"""What one storage node knows: its targets, its routing view, whether it may serve.

The data-plane threads and the asyncio loops share a :class:`StorageNode`.  Routing info
is swapped in whole (one reference assignment, so threads read a consistent snapshot
without a lock); per-target flags are plain attributes written by one side only.

**Fencing** (research/3fs.md §1, §3: "a service that cannot reach mgmtd for T/2 exits";
"a service whose target is lastsrv/offline in the public table exits").  We fence rather
than exit, with the same effect on clients: the node refuses every target I/O
(:class:`NotServing`) while

- it has not yet *joined* (after a restart it stays silent until mgmtd shows all its
  chained targets out of service, so they come back through a resync, never as if
  nothing happened);
- its last successful heartbeat is older than half mgmtd's fail interval (it may be
  partitioned, or was stopped: mgmtd may already have moved its targets out);
- its routing view is older than the version the last heartbeat ack named (a frozen
  process that wakes up must learn what changed before it answers anything).

A target that mgmtd took out of service (offline, lastsrv) while this process lived is
treated as a returning target: it reports ``online``, becomes syncing, and is resynced
by its predecessor; a returning lastsrv first drops its uncommitted versions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from fireflyer.core.log import get_logger
from fireflyer.mgmt.model import Chain, LocalState, NodeType, PublicState, RoutingInfo, TargetId
from fireflyer.mgmt.registry import Heartbeat, TargetReport
from fireflyer.storage import ChunkId, ChunkStore, NotServing, Replica
from fireflyer.storage.localread import local_tag
from fireflyer.storage.protocol import split_address, trusted_peer, wire_address, wire_tag

__all__ = ["TargetRuntime", "StorageNode"]

log = get_logger(__name__)


class TargetRuntime:
    """One local target: its store, its CRAQ replica and the flags the loops keep."""

    def __init__(self, target_id: TargetId, path: Path, store: ChunkStore,
                 make_replica: Callable[[ChunkStore], Replica]) -> None:
        self.target_id = target_id
        self.path = path
        self.store = store
        self._make_replica = make_replica
        self.replica = make_replica(store)
        #: chunks whose copy here failed its CRC; dropped when the target is out of service
        self.corrupted: set[ChunkId] = set()
        self.corrupt_reports = 0
        #: the predecessor said sync-done for our current syncing period
        self.sync_done = False
        self.lastsrv_reset = False
        self.public: PublicState | None = None

    def renew_replica(self) -> None:
        """A fresh replica (empty dedupe and in-doubt tables) for a target returning to service."""
        self.replica = self._make_replica(self.store)


class StorageNode:
    def __init__(self, node_id: str, targets: list[TargetRuntime], *, wire_address: str,
                 grpc_address: Callable[[], str], fence_after_s: float) -> None:
        self.node_id = node_id
        self.targets = {t.target_id: t for t in targets}
        self.wire_address = wire_address
        #: the Unix socket of short-circuit local reads ("" = none), advertised with this host's identity
        self.local_socket = ""
        self._grpc_address = grpc_address
        self.fence_after_s = fence_after_s
        self.routing: RoutingInfo | None = None
        self._chains: dict[int, Chain] = {}
        self._target_chain: dict[TargetId, int] = {}
        self._addresses: dict[TargetId, str] = {}
        self.joined = False
        self.last_heartbeat_ok = 0.0  # monotonic
        self.routing_floor = 0
        self._lock = threading.Lock()

    # -- routing view ---------------------------------------------------------------------

    def set_routing(self, routing: RoutingInfo) -> None:
        with self._lock:
            if self.routing is not None and routing.version <= self.routing.version:
                return
            chains = {c.chain_id: c for c in routing.chains}
            nodes = {n.node_id: n for n in routing.nodes}
            addresses: dict[TargetId, str] = {}
            for t in routing.targets:
                n = nodes.get(t.node_id)
                # our service token goes only to storage nodes a service registered
                addr = wire_address(n.tags) if n is not None and trusted_peer(n) else None
                if addr:
                    addresses[t.target_id] = addr
            self._target_chain = {tid: c.chain_id for c in routing.chains for tid in c.target_ids}
            self._chains, self._addresses, self.routing = chains, addresses, routing
        for rt in self.targets.values():
            chain = self.chain_of_target(rt.target_id)
            new = chain.state_of(rt.target_id) if chain is not None else None
            if new is not PublicState.SYNCING:
                rt.sync_done = False
            if new is not rt.public:
                log.info("storage.target_state", target=rt.target_id, old=str(rt.public), new=str(new),
                         chain_version=chain.version if chain else 0)
                if rt.public is PublicState.SERVING and new is not PublicState.SERVING:
                    rt.renew_replica()
                rt.public = new

    @property
    def routing_version(self) -> int:
        return 0 if self.routing is None else self.routing.version

    def chain(self, chain_id: int) -> Chain:
        """The injected ``chains`` of :class:`~fireflyer.storage.craq.Replica`."""
        c = self._chains.get(chain_id)
        if c is None:
            raise NotServing(f"chain {chain_id} is unknown to storage node {self.node_id} "
                             f"(routing v{self.routing_version}); check the chain id or retry later",
                             chain=chain_id, node=self.node_id)
        return c

    def chain_of_target(self, target_id: TargetId) -> Chain | None:
        cid = self._target_chain.get(target_id)
        return None if cid is None else self._chains.get(cid)

    def address_of(self, target_id: TargetId) -> tuple[str, int]:
        addr = self._addresses.get(target_id)
        if addr is None:
            raise NotServing(f"no data-plane address known for target {target_id} "
                             f"(routing v{self.routing_version})", target=target_id)
        return split_address(addr)

    # -- serving permission -------------------------------------------------------------

    def fenced(self) -> str | None:
        """Why this node may not serve now, or None."""
        if not self.joined:
            return "joining: waiting for mgmtd to take its targets out of service before it rejoins"
        age = time.monotonic() - self.last_heartbeat_ok
        if age > self.fence_after_s:
            return f"no heartbeat ack from mgmtd for {age:.1f}s (limit {self.fence_after_s:.1f}s)"
        if self.routing_version < self.routing_floor:
            return f"routing v{self.routing_version} is behind mgmtd's v{self.routing_floor}"
        return None

    def target(self, target_id: int) -> TargetRuntime:
        """A local target that may do I/O now (NotServing otherwise)."""
        rt = self.targets.get(target_id)
        if rt is None:
            raise NotServing(f"target {target_id} is not on storage node {self.node_id} "
                             f"(it has {sorted(self.targets)}); refresh routing",
                             target=target_id, node=self.node_id)
        why = self.fenced()
        if why is not None:
            raise NotServing(f"storage node {self.node_id} is fenced: {why}", target=target_id,
                             node=self.node_id, state="fenced")
        return rt

    # -- heartbeat ------------------------------------------------------------------------

    def local_state(self, rt: TargetRuntime) -> LocalState:
        """What we report for ``rt`` (drives mgmtd's chain rules, fireflyer.mgmt.chains)."""
        chain = self.chain_of_target(rt.target_id)
        if chain is None:
            return LocalState.UPTODATE  # fresh, in no chain: an admin may put it in one as serving
        public = chain.state_of(rt.target_id)
        if public is PublicState.SERVING:
            return LocalState.UPTODATE
        if public is PublicState.SYNCING:
            return LocalState.UPTODATE if rt.sync_done else LocalState.ONLINE
        if rt.corrupted:
            # out of service: forget the bad copies so resync sends them (local-only -> send)
            for cid in sorted(rt.corrupted):
                rt.store.remove(cid)
            log.warning("storage.corrupt_chunks_dropped", target=rt.target_id, chunks=len(rt.corrupted))
            rt.corrupted.clear()
        if public is PublicState.LASTSRV and not rt.lastsrv_reset:
            n = rt.store.reset_uncommitted()  # 3FS: a returning lastsrv resets uncommitted chunks
            log.info("storage.lastsrv_reset", target=rt.target_id, aborted=n)
            rt.lastsrv_reset = True
        return LocalState.ONLINE

    def heartbeat(self) -> Heartbeat:
        reports = tuple(
            TargetReport(target_id=rt.target_id, local_state=self.local_state(rt), path=str(rt.path))
            for rt in self.targets.values()
        )
        tags = (wire_tag(self.wire_address),)
        if self.local_socket:
            tags += (local_tag(self.local_socket),)
        return Heartbeat(node_id=self.node_id, node_type=NodeType.STORAGE, address=self._grpc_address(),
                         tags=tags, targets=reports)

    def leaving_heartbeat(self) -> Heartbeat:
        """Every target OFFLINE: what a node that stops cleanly reports last.  mgmtd takes the
        targets out of service at once (the next chain update), instead of after its heartbeat
        fail interval, during which clients' writes to them would fail and a restarted node
        would wait to join (:meth:`must_wait_before_join`) for targets it no longer serves."""
        hb = self.heartbeat()
        return msgspec.structs.replace(hb, targets=tuple(
            msgspec.structs.replace(t, local_state=LocalState.OFFLINE) for t in hb.targets))

    def must_wait_before_join(self) -> list[TargetId]:
        """Our targets that mgmtd still shows in service (serving/syncing): wait before heartbeating."""
        out = []
        for tid in self.targets:
            chain = self.chain_of_target(tid)
            if chain is not None and chain.state_of(tid) in (PublicState.SERVING, PublicState.SYNCING):
                out.append(tid)
        return out
