"""The storage node's background work on the event loop: join, heartbeat, resync, repair, init.

- **join** (research/3fs.md §3 "Recovery"): after a start the node stays silent until
  mgmtd shows none of its chained targets serving or syncing, so a restarted target
  always comes back through waiting/syncing and a resync, never with stale data;
- **heartbeat** every ``heartbeat_interval_s``: the targets' local states
  (:meth:`StorageNode.local_state`); each ack refreshes the fence (half mgmtd's fail
  interval) and names the routing version the node must have seen before serving;
- **resync**: for every local serving target whose successor is SYNCING, once per chain
  version: dump the successor's chunk metadata, diff, stream whole-chunk replacements
  under the chunk lock (:func:`fireflyer.storage.resync.resync`, in a thread), then
  ``sync_done``; a fatal diff takes the successor offline through mgmtd;
- **corruption**: a chunk that failed its CRC is reported on NATS and, when another
  replica serves the chain, its target is taken offline so resync replaces the copy;
- **init chains** (local clusters): node 0 cuts the reported targets into chains.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import msgspec

from fireflyer.core.errors import FireFlyerError
from fireflyer.core.log import get_logger
from fireflyer.core.patience import Patience
from fireflyer.mgmt.client import MgmtdClient, RoutingCache
from fireflyer.mgmt.edits import ChainSpec, TargetSpec
from fireflyer.mgmt.model import PublicState
from fireflyer.storage import ChunkCorrupted, ChunkId, ChunkMeta, ResyncFatal, crc32c, resync, successor_of
from fireflyer.storage.protocol import (
    OP_DUMP_META,
    OP_SYNC_DONE,
    OP_SYNC_REMOVE,
    OP_SYNC_REPLACE,
    ChunkCorruptedEvent,
    SyncDoneMsg,
    SyncRemoveMsg,
    SyncReplaceMsg,
    TargetMsg,
    corrupted_subject,
    to_meta,
)

from .forwarder import Forwarder
from .node import StorageNode, TargetRuntime

__all__ = ["NodeLoops", "InitChains", "plan_chains"]

log = get_logger(__name__)


class InitChains(msgspec.Struct, frozen=True, kw_only=True):
    """``FF_STORAGE_INIT_CHAINS="nodes=3,replicas=3,table=1"``: node 0 creates the chains
    once ``nodes`` storage nodes reported targets and none of them is in a chain."""

    nodes: int
    replicas: int
    table: int = 1

    @classmethod
    def parse(cls, text: str) -> InitChains | None:
        if not text.strip():
            return None
        fields = dict(part.split("=", 1) for part in text.split(",") if part.strip())
        return msgspec.convert({k.strip(): int(v) for k, v in fields.items()}, cls)


def plan_chains(by_node: dict[str, list[int]], replicas: int) -> list[ChainSpec]:
    """Round k takes each node's k-th target, node order rotated by k, so heads spread over nodes."""
    nodes = sorted(by_node)
    order: list[TargetSpec] = []
    for k in range(max(len(v) for v in by_node.values())):
        rot = nodes[k % len(nodes):] + nodes[: k % len(nodes)]
        order += [TargetSpec(target_id=sorted(by_node[n])[k], node_id=n) for n in rot if k < len(by_node[n])]
    return [ChainSpec(chain_id=i // replicas + 1, targets=tuple(order[i:i + replicas]))
            for i in range(0, len(order) - len(order) % replicas, replicas)]


class NodeLoops:
    def __init__(self, node: StorageNode, client: MgmtdClient, cache: RoutingCache, forwarder: Forwarder, *,
                 bus: Any, heartbeat_interval_s: float, join_timeout_s: float, resync_interval_s: float,
                 resync_workers: int, repair_corrupt: bool, init_chains: InitChains | None, is_first: bool) -> None:
        self.node = node
        self.client = client
        self.cache = cache
        self.forwarder = forwarder
        self.bus = bus
        self.heartbeat_interval_s = heartbeat_interval_s
        self.join_timeout_s = join_timeout_s
        self.resync_interval_s = resync_interval_s
        self.resync_workers = resync_workers
        self.repair_corrupt = repair_corrupt
        self.init_chains = init_chains
        self.is_first = is_first
        self.loop = asyncio.get_running_loop()
        self._resyncs: dict[tuple[int, int], asyncio.Task[None]] = {}  # (chain, successor) -> task
        self._synced: set[tuple[int, int, int]] = set()  # (chain, successor, chain version) done
        self._refreshing = False
        self.heartbeats = 0

    # -- join and heartbeat ---------------------------------------------------------------

    async def run(self) -> None:
        await self._join()
        tasks = [asyncio.create_task(self._heartbeat_loop(), name="storage-heartbeat"),
                 asyncio.create_task(self._resync_loop(), name="storage-resync")]
        if self.init_chains is not None and self.is_first:
            tasks.append(asyncio.create_task(self._init_chains(self.init_chains), name="storage-init-chains"))
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in [*tasks, *self._resyncs.values()]:
                t.cancel()

    async def _join(self) -> None:
        deadline = self.loop.time() + self.join_timeout_s
        while True:
            try:
                await self.cache.refresh()
                reached = True  # None: mgmtd's routing is still empty (version 0), nothing to wait for
            except FireFlyerError as e:
                reached = False
                log.info("storage.join_mgmtd_unreachable", error=str(e))
            if reached:
                waiting = self.node.must_wait_before_join()
                if not waiting:
                    break
                if self.loop.time() > deadline:
                    log.warning("storage.join_timeout", targets=waiting)  # join anyway; mgmtd's rules decide
                    break
                log.info("storage.join_waiting", targets=waiting)
            await asyncio.sleep(min(0.2, self.heartbeat_interval_s))
        self.node.joined = True
        log.info("storage.joined", node=self.node.node_id, routing_version=self.node.routing_version)

    async def leave(self, timeout_s: float = 2.0) -> bool:
        """Tell mgmtd our targets are offline (a clean stop; the loops must be stopped first, or
        the next heartbeat would report them back).  Best effort: an unreachable mgmtd fails
        the node after its heartbeat fail interval, as for a crash."""
        if not self.node.joined:
            return False  # never reported: nothing of ours is in service
        try:
            async with asyncio.timeout(timeout_s):
                await self.client.heartbeat(self.node.leaving_heartbeat())
        except TimeoutError:
            log.warning("storage.leave_failed", error=f"mgmtd did not answer within {timeout_s} s")
            return False
        except FireFlyerError as e:
            log.warning("storage.leave_failed", error=str(e))
            return False
        log.info("storage.left", node=self.node.node_id, targets=sorted(self.node.targets))
        return True

    async def _heartbeat_loop(self) -> None:
        # before mgmtd has a primary (start-up, a failover) heartbeats fail: INFO, WARNING if it lasts
        patience = Patience(log, "storage.heartbeat_failed")
        while True:
            started_mono = time.monotonic()
            try:
                hb = await asyncio.to_thread(self.node.heartbeat)
                ack = await self.client.heartbeat(hb)
            except FireFlyerError as e:
                patience.failed(e)
            else:
                patience.ok()
                self.heartbeats += 1
                self.node.last_heartbeat_ok = started_mono
                if ack.fail_interval_s > 0:
                    self.node.fence_after_s = ack.fail_interval_s / 2
                self.node.routing_floor = max(self.node.routing_floor, ack.routing_version)
                if self.node.routing_version < ack.routing_version:
                    with contextlib.suppress(FireFlyerError):
                        await self.cache.refresh()
            await asyncio.sleep(max(0.0, self.heartbeat_interval_s - (time.monotonic() - started_mono)))

    def kick_refresh(self) -> None:
        """Thread-safe: pull routing now (a request carried a newer chain version than ours)."""
        def go() -> None:
            if not self._refreshing:
                self._refreshing = True
                self.loop.create_task(self._refresh_once())
        self.loop.call_soon_threadsafe(go)

    async def _refresh_once(self) -> None:
        try:
            await self.cache.refresh()
        except FireFlyerError as e:
            log.debug("storage.refresh_failed", error=str(e))
        finally:
            self._refreshing = False

    # -- resync ---------------------------------------------------------------------------

    async def _resync_loop(self) -> None:
        while True:
            if self.node.fenced() is None:
                for rt in self.node.targets.values():
                    chain = self.node.chain_of_target(rt.target_id)
                    if chain is None or chain.state_of(rt.target_id) is not PublicState.SERVING:
                        continue
                    succ = successor_of(chain, rt.target_id)
                    if succ is None or chain.state_of(succ) is not PublicState.SYNCING:
                        continue
                    key = (chain.chain_id, succ)
                    running = self._resyncs.get(key)
                    if (running is None or running.done()) and (*key, chain.version) not in self._synced:
                        self._resyncs[key] = asyncio.create_task(self._resync(rt, chain.chain_id, chain.version, succ))
            await asyncio.sleep(self.resync_interval_s)

    async def _resync(self, rt: TargetRuntime, chain_id: int, chain_ver: int, succ: int) -> None:
        log.info("storage.resync_start", target=rt.target_id, successor=succ, chain=chain_id, chain_version=chain_ver)
        try:
            sent, removed = await asyncio.to_thread(self._resync_blocking, rt, chain_id, chain_ver, succ)
        except ResyncFatal as e:
            log.error("storage.resync_fatal", successor=succ, error=str(e))
            with contextlib.suppress(FireFlyerError):
                await self.client.offline_target(succ)
        except FireFlyerError as e:
            log.warning("storage.resync_failed", successor=succ, chain=chain_id, error=str(e))  # next tick retries
        else:
            self._synced.add((chain_id, succ, chain_ver))
            log.info("storage.resync_done", target=rt.target_id, successor=succ, sent=sent, removed=removed)

    def _resync_blocking(self, rt: TargetRuntime, chain_id: int, chain_ver: int, succ: int) -> tuple[int, int]:
        fw = self.forwarder
        base = {"target": succ, "chain_id": chain_id, "chain_ver": chain_ver}
        reply = fw.call(succ, OP_DUMP_META, meta=to_meta(TargetMsg(**base)))
        remote = msgspec.msgpack.decode(reply.payload, type=list[ChunkMeta])

        def send_replace(cid: ChunkId, data: bytes, version: int, chunk_chain_ver: int) -> None:
            msg = SyncReplaceMsg(**base, chunk_id=cid, version=version, chunk_chain_ver=chunk_chain_ver,
                                 crc=crc32c(data))
            fw.call(succ, OP_SYNC_REPLACE, data if data else None, meta=to_meta(msg))

        def remove(cid: ChunkId) -> None:
            fw.call(succ, OP_SYNC_REMOVE, meta=to_meta(SyncRemoveMsg(**base, chunk_id=cid)))

        stats = resync(rt.store, remote, send_replace=send_replace, remove=remove, workers=self.resync_workers)
        fw.call(succ, OP_SYNC_DONE, meta=to_meta(SyncDoneMsg(**base, sent=stats.sent, removed=stats.removed)))
        return stats.sent, stats.removed

    # -- corruption -----------------------------------------------------------------------

    def on_corrupt(self, rt: TargetRuntime, cid: ChunkId, err: ChunkCorrupted) -> None:
        """Called from a data-plane thread when a read found a bad copy."""
        first = cid not in rt.corrupted
        rt.corrupted.add(cid)
        rt.corrupt_reports += 1
        log.error("storage.chunk_corrupted", target=rt.target_id, chunk=str(cid), error=str(err))
        if first:
            self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._report(rt, cid, str(err))))

    async def _report(self, rt: TargetRuntime, cid: ChunkId, message: str) -> None:
        chain = self.node.chain_of_target(rt.target_id)
        if self.bus is not None:
            event = ChunkCorruptedEvent(node_id=self.node.node_id, target=rt.target_id,
                                        chain_id=chain.chain_id if chain else 0, chunk=cid.hex, message=message)
            with contextlib.suppress(FireFlyerError):
                await self.bus.publish(corrupted_subject(rt.target_id), event)
        others = [t for t in (chain.serving() if chain else ()) if t != rt.target_id]
        if self.repair_corrupt and others:
            try:
                await self.client.offline_target(rt.target_id)
                log.warning("storage.target_offlined_for_repair", target=rt.target_id, chunk=str(cid))
            except FireFlyerError as e:
                log.warning("storage.offline_for_repair_failed", target=rt.target_id, error=str(e))

    # -- local cluster bootstrap ----------------------------------------------------------

    async def _init_chains(self, spec: InitChains) -> None:
        patience = Patience(log, "storage.init_chains_failed")  # mgmtd may still be electing a primary
        while True:
            routing = self.cache.routing
            if routing is not None:
                if routing.chains:
                    return  # someone (an admin, an earlier run) already made chains
                storage = {n.node_id for n in routing.nodes if n.type == "storage"}
                by_node: dict[str, list[int]] = {}
                for t in routing.targets:
                    if t.node_id in storage:
                        by_node.setdefault(t.node_id, []).append(t.target_id)
                if len(by_node) >= spec.nodes:
                    chains = plan_chains(by_node, spec.replicas)
                    try:
                        await self.client.create_chains(chains)
                        await self.client.create_chain_table(spec.table, [c.chain_id for c in chains],
                                                             desc="storage init-chains")
                        log.info("storage.chains_created", chains=len(chains), replicas=spec.replicas)
                        await self.cache.refresh()
                        return
                    except FireFlyerError as e:
                        patience.failed(e)
            await asyncio.sleep(0.5)
            with contextlib.suppress(FireFlyerError):
                await self.cache.refresh()

