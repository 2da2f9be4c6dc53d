"""The mgmtd replica: lease, primary loops, and the state the servicer reads and writes.

Every replica runs :meth:`MgmtdCore.lease_loop`: every ``renew_s`` one KV transaction
reads the lease record and extends it, takes over an expired one, or follows the live
holder (:func:`fireflyer.mgmt.lease.decide_lease`).  A replica that wins the lease
becomes primary: it loads the node registry from the KV (giving every node a full fail
interval to find it, :func:`~fireflyer.mgmt.registry.grace_after_takeover`) and starts

- the failure scan, every ``scan_interval_s``: nodes silent for
  ``heartbeat_fail_interval_s`` are failed and their targets' local state goes OFFLINE;
- the chain updater, every ``chain_update_interval_s`` and at once after a heartbeat or
  scan changed something: :func:`fireflyer.mgmt.edits.sync_registry` inside a transaction.

A replica whose renewals fail until ``step_down_margin_s`` before its lease ends, or
that finds another holder, steps down: it stops those loops and drops the registry.

Every write (chain updater, admin RPCs) runs in :meth:`MgmtdCore.mutate`: one KV
transaction that re-reads the lease and calls :func:`~fireflyer.mgmt.lease.ensure_primary`
(3FS's ``validate_lease_on_write``), so a deposed primary's write fails, or conflicts
with the takeover and then fails, instead of landing.  After each commit that bumped the
routing version, :class:`~fireflyer.mgmt.client.RoutingUpdated` is published (plain NATS;
clients also pull, see :mod:`fireflyer.mgmt.client`).

Heartbeats are only kept in the primary's memory (3FS does the same): the registry is
persisted by the chain updater when something routing shows changed (a node joined,
failed or came back, a target's local state), not on every heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from typing import Any

import msgspec

from fireflyer.bus import Bus
from fireflyer.bus.events import Event
from fireflyer.core.clock import Clock
from fireflyer.core.errors import FireFlyerError, InvalidArgument
from fireflyer.core.log import EventLogger
from fireflyer.core.patience import Patience
from fireflyer.kv import KV, Txn
from fireflyer.mgmt import edits
from fireflyer.mgmt.client import RoutingUpdated, registry_subject, routing_subject
from fireflyer.mgmt.lease import (
    LeaseAction,
    LeaseConfig,
    LeaseDecision,
    NotPrimary,
    decide_lease,
    ensure_primary,
    is_primary,
)
from fireflyer.mgmt.model import LeaseRecord, LocalState, RoutingInfo
from fireflyer.mgmt.registry import (
    Heartbeat,
    NodeFailed,
    NodeRecovered,
    NodeRegistered,
    RegistryEvent,
    RegistryState,
    TargetLocal,
    TargetStateChanged,
    apply_heartbeat,
    grace_after_takeover,
    scan_failures,
)

from . import store

__all__ = ["MgmtdCore", "CoreConfig", "registry_from_routing"]


class CoreConfig(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    cluster_id: str
    lease: LeaseConfig
    fail_interval_s: float
    scan_interval_s: float
    chain_update_interval_s: float


def registry_from_routing(routing: RoutingInfo, now: float) -> RegistryState:
    """The registry a new primary starts from: stored nodes, and the targets of known nodes.

    Targets whose node never heartbeated (created by an admin ahead of their storage
    node) are left out, so their local state stays unknown and the chain updater leaves
    them as they are, rather than reading the stored default OFFLINE as a failure.
    """
    nodes = {n.node_id: n for n in routing.nodes}
    targets = {t.target_id: TargetLocal(target_id=t.target_id, node_id=t.node_id, local_state=t.local_state,
                                        since=now, disk=t.disk, path=t.path)
               for t in routing.targets if t.node_id in nodes}
    return grace_after_takeover(RegistryState(nodes=nodes, targets=targets), now)


def _event_subject(ev: RegistryEvent) -> str:
    if isinstance(ev, TargetStateChanged):
        return registry_subject("target", ev.target_id, "state")
    name = {NodeRegistered: "registered", NodeFailed: "failed", NodeRecovered: "recovered"}[type(ev)]
    return registry_subject("node", ev.node_id, name)


class MgmtdCore:
    """One replica's lease, registry (while primary) and write path."""

    def __init__(self, cfg: CoreConfig, *, kv: KV, bus: Bus | None, clock: Clock, log: EventLogger,
                 address: Callable[[], str]) -> None:
        self.cfg = cfg
        self.kv = kv
        self.bus = bus
        self.clock = clock
        self.log = log
        self._address = address
        self.reader = store.RoutingReader()
        #: the last lease this replica committed (None: not the holder)
        self.lease: LeaseRecord | None = None
        #: the last lease record read, whoever holds it (for redirects)
        self.seen: LeaseRecord | None = None
        #: the node registry; not None exactly while this replica acts as primary
        self.registry: RegistryState | None = None
        self.routing_version = 0
        self._primary_tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        #: set by release(): no lease pass may re-take the lease while the process stops
        self._stopping = False
        self._lease_patience = Patience(log, "mgmtd.lease_failed", clock=clock.monotonic)

    @property
    def node_id(self) -> str:
        return self.cfg.node_id

    @property
    def address(self) -> str:
        return self._address()

    # -- primary status -----------------------------------------------------------------
    def is_primary(self) -> bool:
        return self.registry is not None and is_primary(self.lease, self.node_id, self.clock.time(),
                                                        self.cfg.lease.step_down_margin_s)

    def not_primary(self) -> NotPrimary:
        s = self.seen
        if s is not None and s.holder != self.node_id and self.clock.time() < s.expires_at:
            return NotPrimary(node=self.node_id, primary=s.holder, primary_address=s.address, term=s.term)
        return NotPrimary(node=self.node_id)

    # -- lease ----------------------------------------------------------------------------
    async def lease_loop(self) -> None:
        while not self._stopping:
            try:
                await self.lease_pass()
            except Exception as e:  # e.g. the KV failed while loading the registry: try again next pass
                self.log.exception("mgmtd.lease_pass_crashed", error=repr(e))
                self.step_down("lease pass failed")
            await asyncio.sleep(self.cfg.lease.renew_s)

    async def lease_pass(self) -> LeaseDecision | None:
        if self._stopping:
            return None
        me, addr, now, lc = self.node_id, self.address, self.clock.time(), self.cfg.lease

        def txn(t: Txn) -> LeaseDecision | None:
            if self._stopping:  # release() ran meanwhile (this may be a retry after its commit)
                return None
            d = decide_lease(store.load_lease(t), me, addr, now, lc.lease_s, takeover_grace_s=lc.takeover_grace_s)
            if d.action is not LeaseAction.FOLLOW:
                assert d.record is not None
                store.save_lease(t, d.record)
            return d

        try:
            d: LeaseDecision | None = await self.kv.arun(txn, timeout_s=max(lc.renew_s, 1.0))
        except FireFlyerError as e:
            d = None
            self._lease_patience.failed(e, kind=e.kind)  # (two replicas contend at start-up: INFO at first)
        else:
            self._lease_patience.ok()
        if d is not None:
            self.seen = d.record
            if d.action is LeaseAction.FOLLOW:
                self.lease = None
            else:
                self.lease = d.record
                if d.action is LeaseAction.TAKE_OVER or self.registry is None:
                    await self._become_primary(d)
        if self.registry is not None and not self.is_primary():
            self.step_down("lease lost" if d is not None else "lease not renewed in time")
        return d

    async def _become_primary(self, d: LeaseDecision) -> None:
        self.step_down("new term")  # a re-take after a lapse starts from a fresh registry
        if self._stopping:
            return
        routing = await self.kv.arun(lambda t: store.load_routing(t, snapshot=True))
        if not is_primary(self.lease, self.node_id, self.clock.time(), self.cfg.lease.step_down_margin_s):
            return
        self.registry = registry_from_routing(routing, self.clock.time())
        self.routing_version = routing.version
        self._primary_tasks = [asyncio.create_task(self._scan_loop(), name="mgmtd-scan"),
                               asyncio.create_task(self._update_loop(), name="mgmtd-chain-updater")]
        self.log.info("mgmtd.primary", node=self.node_id, term=d.term, address=self.address,
                      nodes=len(self.registry.nodes), routing_version=routing.version)

    def step_down(self, reason: str) -> None:
        tasks, self._primary_tasks = self._primary_tasks, []
        me = asyncio.current_task()
        for t in tasks:
            if t is not me:
                t.cancel()
        if self.registry is not None:
            self.registry = None
            # a clean stop hands the lease on (routine); losing it is worth a look
            (self.log.info if reason == "stopping" else self.log.warning)(
                "mgmtd.stepped_down", node=self.node_id, reason=reason)

    async def release(self) -> None:
        """On a clean stop: end my lease now so another replica takes over at its next pass."""
        self._stopping = True
        self.step_down("stopping")
        if self.lease is None:
            return
        me, now = self.node_id, self.clock.time()

        def txn(t: Txn) -> bool:
            rec = store.load_lease(t)
            if rec is None or rec.holder != me:
                return False
            store.save_lease(t, msgspec.structs.replace(rec, renewed_at=now, expires_at=now))
            return True

        try:
            if await self.kv.arun(txn, timeout_s=2.0):
                self.log.info("mgmtd.lease_released", node=me)
        except FireFlyerError as e:
            self.log.warning("mgmtd.lease_release_failed", error=str(e))
        self.lease = None

    # -- primary loops ----------------------------------------------------------------------
    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.scan_interval_s)
            if not self.is_primary() or self.registry is None:
                self.step_down("lease expired before a failure scan")
                return
            res = scan_failures(self.registry, self.clock.time(), self.cfg.fail_interval_s)
            if res.failed:
                self.registry = res.state
                self.log.warning("mgmtd.nodes_failed", nodes=list(res.failed), targets=list(res.offlined))
                self._wake.set()
                await self._publish_events(res.events)

    async def _update_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # (not wait_for: see RoutingCache._loop)
                async with asyncio.timeout(self.cfg.chain_update_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            reg = self.registry
            if reg is None:
                return
            try:
                await self.mutate(functools.partial(edits.sync_registry, reg=reg))
            except NotPrimary:
                self.step_down("a write found another lease holder")
                return
            except FireFlyerError as e:
                self.log.warning("mgmtd.chain_update_failed", error=str(e), kind=e.kind)

    # -- writes -------------------------------------------------------------------------------
    async def mutate(self, edit: Callable[[RoutingInfo], RoutingInfo]) -> RoutingInfo:
        """Apply ``edit`` to the stored routing info in one transaction, as the primary only."""
        me, margin, clock = self.node_id, self.cfg.lease.step_down_margin_s, self.clock

        def txn(t: Txn) -> tuple[int, RoutingInfo]:
            ensure_primary(store.load_lease(t), me, clock.time(), margin)
            old = store.load_routing(t)
            new = edit(old)
            if new is not old:
                store.write_routing(t, old, new)
            return old.version, new

        # idempotent: a retry re-reads and re-decides, and every edit is a no-op when already applied
        old_version, new = await self.kv.arun(txn, idempotent=True)
        self.routing_version = max(self.routing_version, new.version)
        if new.version != old_version:
            self.log.info("mgmtd.routing_updated", version=new.version)
            await self._publish(routing_subject(self.cfg.cluster_id),
                                RoutingUpdated(cluster=self.cfg.cluster_id, version=new.version, primary=me))
        return new

    async def heartbeat(self, hb: Heartbeat) -> int:
        """Record a heartbeat (primary only); returns the routing version known here."""
        if not self.is_primary() or self.registry is None:
            raise self.not_primary()
        state, events = apply_heartbeat(self.registry, hb, self.clock.time())
        self.registry = state
        if events:
            self._wake.set()
            await self._publish_events(events)
        return self.routing_version

    async def offline_target(self, target_id: int) -> RoutingInfo:
        local = {} if self.registry is None else {tid: t.local_state for tid, t in self.registry.targets.items()}
        new = await self.mutate(lambda r: edits.offline_target(r, target_id, local))
        reg = self.registry
        if reg is not None and target_id in reg.targets:
            # until its node reports again; a live node's next heartbeat starts the way back (waiting)
            t = msgspec.structs.replace(reg.targets[target_id], local_state=LocalState.OFFLINE,
                                        since=self.clock.time())
            self.registry = RegistryState(nodes=reg.nodes, targets={**reg.targets, target_id: t})
        return new

    # -- reads -----------------------------------------------------------------------------------
    async def routing(self) -> RoutingInfo:
        routing = await self.kv.arun(self.reader.read)
        self.routing_version = max(self.routing_version, routing.version)
        return routing

    async def read_lease(self) -> LeaseRecord | None:
        return await self.kv.arun(lambda t: store.load_lease(t, snapshot=True))

    # -- events ------------------------------------------------------------------------------------
    async def _publish_events(self, events: list[RegistryEvent]) -> None:
        for ev in events:
            try:
                subject = _event_subject(ev)
            except InvalidArgument as e:  # a node id that is no valid subject token
                self.log.warning("mgmtd.event_subject_invalid", error=str(e))
                continue
            await self._publish(subject, ev)

    async def _publish(self, subject: str, event: Event) -> None:
        if self.bus is None:
            return
        try:
            await self.bus.publish(subject, event)
        except FireFlyerError as e:  # best effort: clients also pull routing info
            self.log.warning("mgmtd.publish_failed", subject=subject, error=str(e))

    def describe(self) -> dict[str, Any]:
        return {"node": self.node_id, "primary": self.is_primary(), "routing_version": self.routing_version}
