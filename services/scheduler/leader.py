"""Which replica leads: the scheduler's lease in the KV, by mgmtd's rules (:mod:`fireflyer.mgmt.lease`).

Every ``renew_s`` each replica runs one KV transaction that extends its lease, takes over an
expired one, or follows the live holder.  :class:`Leadership` keeps the outcome and calls back:
``on_lead(term)`` when this replica becomes leader (a takeover, or a lapse it came back from),
``on_lose(reason)`` when it stops leading (lease lost, not renewed in time, or stopping).  A leader
stops acting ``step_down_margin_s`` before its lease ends (its clock), so two never overlap while
the clocks agree within that margin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec

from fireflyer.core.clock import Clock
from fireflyer.core.errors import FireFlyerError
from fireflyer.core.log import EventLogger
from fireflyer.core.patience import Patience
from fireflyer.kv import KV, Txn
from fireflyer.mgmt.lease import LeaseAction, LeaseConfig, LeaseDecision, NotPrimary, decide_lease, is_primary
from fireflyer.mgmt.model import LeaseRecord

from . import store

__all__ = ["Leadership"]


class Leadership:
    def __init__(self, node_id: str, cfg: LeaseConfig, *, kv: KV, clock: Clock, log: EventLogger,
                 address: Callable[[], str], on_lead: Callable[[int], Awaitable[None]],
                 on_lose: Callable[[str], None]) -> None:
        self.node_id = node_id
        self.cfg = cfg
        self.kv = kv
        self.clock = clock
        self.log = log
        self._address = address
        self._on_lead = on_lead
        self._on_lose = on_lose
        #: the last lease this replica committed (None: not the holder)
        self.lease: LeaseRecord | None = None
        #: the last lease record read, whoever holds it (for redirects)
        self.seen: LeaseRecord | None = None
        self.leading = False
        self.stopping = False
        self._patience = Patience(log, "scheduler.lease_failed", clock=clock.monotonic)

    def is_leader(self) -> bool:
        return self.leading and is_primary(self.lease, self.node_id, self.clock.time(), self.cfg.step_down_margin_s)

    def holds(self, record: LeaseRecord | None, now: float) -> bool:
        """Whether ``record`` (read inside a write's transaction) is this replica's live lease."""
        return is_primary(record, self.node_id, now, self.cfg.step_down_margin_s)

    def not_leader(self) -> NotPrimary:
        s = self.seen
        if s is not None and s.holder != self.node_id and self.clock.time() < s.expires_at:
            return NotPrimary(f"scheduler {self.node_id} is not the leader; the leader is {s.holder} at {s.address}: "
                              "send writes there", node=self.node_id, primary=s.holder, primary_address=s.address,
                              term=s.term)
        return NotPrimary(f"scheduler {self.node_id} is not the leader and no replica holds a live lease; retry "
                          "in a few seconds, a replica takes over when the lease expires", node=self.node_id)

    async def loop(self) -> None:
        while not self.stopping:
            try:
                await self.lease_pass()
            except Exception as e:  # a KV failure while taking over: try again next pass
                self.log.exception("scheduler.lease_pass_crashed", error=repr(e))
                self.step_down("lease pass failed")
            await asyncio.sleep(self.cfg.renew_s)

    async def lease_pass(self) -> LeaseDecision | None:
        if self.stopping:
            return None
        me, addr, now, lc = self.node_id, self._address(), self.clock.time(), self.cfg

        def txn(t: Txn) -> LeaseDecision | None:
            if self.stopping:
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
            self._patience.failed(e, kind=e.kind)  # (two replicas contend at start-up: INFO at first)
        else:
            self._patience.ok()
        if d is not None:
            self.seen = d.record
            if d.action is LeaseAction.FOLLOW:
                self.lease = None
            else:
                self.lease = d.record
                if d.action is LeaseAction.TAKE_OVER or not self.leading:
                    self.step_down("new term")
                    if not self.stopping:
                        self.leading = True
                        await self._on_lead(d.term)
        if self.leading and not self.is_leader():
            self.step_down("lease lost" if d is not None else "lease not renewed in time")
        return d

    def step_down(self, reason: str) -> None:
        if self.leading:
            self.leading = False
            (self.log.info if reason in ("stopping", "new term") else self.log.warning)(
                "scheduler.stepped_down", node=self.node_id, reason=reason)
        self._on_lose(reason)

    async def release(self) -> None:
        """On a clean stop: end my lease now so another replica takes over at its next pass."""
        self.stopping = True
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
                self.log.info("scheduler.lease_released", node=me)
        except FireFlyerError as e:
            self.log.warning("scheduler.lease_release_failed", error=str(e))
        self.lease = None

    def crash(self) -> None:
        """Stop acting at once and keep the lease record as it is (a test's stand-in for SIGKILL)."""
        self.stopping = True
        self.lease = None  # (so that the shutdown that follows does not hand it on either)
        self.step_down("crashed")
