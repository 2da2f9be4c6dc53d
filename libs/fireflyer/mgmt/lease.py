"""Primary election among mgmtd replicas: one lease record in the KV, decided by pure rules.

3FS (research/3fs.md §1 "Primary election"): every mgmtd replica periodically runs a KV
transaction that reads the lease key and either *extends its own lease*, *takes over an
expired one*, or *backs off*; defaults lease 60 s, extend every 10 s; every mutating
operation re-checks the lease inside its own transaction (``validate_lease_on_write``);
a new primary has a bootstrapping window (2 min) before acting on missing heartbeats.

The service's loop, every ``renew_s``::

    with kv.transaction() as tx:                       # serializable: racing takers conflict
        d = decide_lease(read(tx), me, my_address, clock.time(), cfg.lease_s,
                         takeover_grace_s=cfg.takeover_grace_s)
        if d.action is not LeaseAction.FOLLOW:
            write(tx, d.record)
    mine = d.record if committed and d.action is not LeaseAction.FOLLOW else None
    # between passes, and before every write it makes:
    primary = not should_step_down(mine, me, clock.time(), cfg.step_down_margin_s)

Why two margins.  ``expires_at`` is the holder's wall clock; the others compare it with
theirs.  The holder stops acting at ``expires_at - step_down_margin_s`` (its clock); a
follower takes over at ``expires_at + takeover_grace_s`` (its clock).  So two primaries
never overlap while the clocks differ by less than ``step_down_margin_s + takeover_grace_s``
(the tests show both the safe and the unsafe side).  ``now`` is read *before* the
transaction commits, so a lease written late expires early, never late.

The KV transaction gives mutual exclusion of *records* (two replicas that read the same
expired record both decide TAKE_OVER; one commit wins, the other conflicts and re-reads);
these rules give mutual exclusion of *acting* in time.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar

import msgspec

from fireflyer.core.errors import FailedPrecondition, InvalidArgument

from .model import LeaseRecord, NodeId

__all__ = [
    "DEFAULT_LEASE_S",
    "DEFAULT_RENEW_S",
    "LeaseConfig",
    "LeaseAction",
    "LeaseDecision",
    "NotPrimary",
    "decide_lease",
    "next_renewal_at",
    "renew_due",
    "should_step_down",
    "is_primary",
    "ensure_primary",
    "in_bootstrap",
]

#: 3FS ``MgmtdConfig`` defaults (research/3fs.md §1)
DEFAULT_LEASE_S = 60.0
DEFAULT_RENEW_S = 10.0
DEFAULT_BOOTSTRAP_S = 120.0
#: ours: NTP keeps hosts within milliseconds; 5 s of a 60 s lease leaves ample room
DEFAULT_STEP_DOWN_MARGIN_S = 5.0


class LeaseConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Lease timing; small values in tests (e.g. lease 0.6 s, renew 0.1 s)."""

    lease_s: float = DEFAULT_LEASE_S
    renew_s: float = DEFAULT_RENEW_S
    #: the holder stops acting this long before its lease expires (its clock)
    step_down_margin_s: float = DEFAULT_STEP_DOWN_MARGIN_S
    #: a follower waits this long past ``expires_at`` (its clock) before taking over
    takeover_grace_s: float = 0.0
    #: after taking over, do not fail nodes for missing heartbeats for this long
    bootstrap_s: float = DEFAULT_BOOTSTRAP_S

    def __post_init__(self) -> None:
        if not self.lease_s > 0 or not self.renew_s > 0:
            raise InvalidArgument(
                f"lease_s ({self.lease_s}) and renew_s ({self.renew_s}) must be positive",
                key="lease_s",
            )
        if self.step_down_margin_s < 0 or self.takeover_grace_s < 0 or self.bootstrap_s < 0:
            raise InvalidArgument(
                "step_down_margin_s, takeover_grace_s and bootstrap_s must not be negative", key="lease"
            )
        if self.renew_s + self.step_down_margin_s >= self.lease_s:
            raise InvalidArgument(
                f"renew_s ({self.renew_s}) + step_down_margin_s ({self.step_down_margin_s}) must be "
                f"below lease_s ({self.lease_s}), or the primary steps down before its next renewal",
                key="renew_s",
            )


class LeaseAction(enum.StrEnum):
    EXTEND = "extend"  # I hold a live lease: push expires_at forward, same term
    TAKE_OVER = "take-over"  # no lease, or an expired one: write mine with term + 1
    FOLLOW = "follow"  # someone else holds a live lease: redirect writes to it


class LeaseDecision(msgspec.Struct, frozen=True, kw_only=True):
    """What one replica should do; ``record`` is the record to write (EXTEND/TAKE_OVER) or the
    record that was read (FOLLOW, None if there was none)."""

    action: LeaseAction
    record: LeaseRecord | None
    primary: NodeId
    primary_address: str
    term: int


class NotPrimary(FailedPrecondition):
    """A write reached a mgmtd replica that is not the primary; retry at ``primary_address``.

    Fields: ``node`` (this replica), ``primary`` and ``primary_address`` (empty when no one
    holds a live lease, e.g. during a takeover), ``term``.  Routine: clients follow it, so a
    server logs the call at DEBUG.
    """

    routine: ClassVar[bool] = True

    def __init__(
        self,
        message: str = "",
        *,
        node: str = "",
        primary: str = "",
        primary_address: str = "",
        **fields: Any,
    ) -> None:
        if not message:
            if primary:
                message = f"mgmtd {node} is not the primary; the primary is {primary} at {primary_address}"
            else:
                message = (
                    f"mgmtd {node} is not the primary and no replica holds a live lease; "
                    "retry in a few seconds, a replica takes over when the lease expires"
                )
        super().__init__(message, node=node, primary=primary, primary_address=primary_address, **fields)


def decide_lease(
    record: LeaseRecord | None,
    me: NodeId,
    my_address: str,
    now: float,
    lease_s: float = DEFAULT_LEASE_S,
    *,
    takeover_grace_s: float = 0.0,
) -> LeaseDecision:
    """Extend my lease, take over a missing or expired one, or follow the live holder.

    - no record: TAKE_OVER with term 1;
    - mine and ``now < expires_at``: EXTEND (same term, ``acquired_at`` kept, address updated);
    - mine but expired: TAKE_OVER with term + 1 -- *our choice*: I stepped down meanwhile, so
      coming back is a new term (fencing, a fresh bootstrap window), as for any other taker;
    - someone else's and ``now < expires_at + takeover_grace_s``: FOLLOW, naming the holder;
    - someone else's and later: TAKE_OVER with term + 1.
    """
    if not lease_s > 0:
        raise InvalidArgument(f"lease_s must be positive, got {lease_s}", key="lease_s")
    if record is None:
        return _take(None, me, my_address, now, lease_s)
    if record.holder == me:
        if now < record.expires_at:
            new = LeaseRecord(
                holder=me,
                address=my_address,
                term=record.term,
                acquired_at=record.acquired_at,
                renewed_at=now,
                expires_at=max(record.expires_at, now + lease_s),
            )
            return LeaseDecision(
                action=LeaseAction.EXTEND, record=new, primary=me, primary_address=my_address, term=new.term
            )
        return _take(record, me, my_address, now, lease_s)
    if now < record.expires_at + takeover_grace_s:
        return LeaseDecision(
            action=LeaseAction.FOLLOW,
            record=record,
            primary=record.holder,
            primary_address=record.address,
            term=record.term,
        )
    return _take(record, me, my_address, now, lease_s)


def _take(old: LeaseRecord | None, me: NodeId, addr: str, now: float, lease_s: float) -> LeaseDecision:
    term = 1 if old is None else old.term + 1
    new = LeaseRecord(
        holder=me, address=addr, term=term, acquired_at=now, renewed_at=now, expires_at=now + lease_s
    )
    return LeaseDecision(
        action=LeaseAction.TAKE_OVER, record=new, primary=me, primary_address=addr, term=term
    )


def next_renewal_at(record: LeaseRecord, renew_s: float = DEFAULT_RENEW_S) -> float:
    """When the holder should next run the lease transaction (3FS: every 10 s)."""
    return record.renewed_at + renew_s


def renew_due(record: LeaseRecord | None, now: float, renew_s: float = DEFAULT_RENEW_S) -> bool:
    return record is None or now >= next_renewal_at(record, renew_s)


def should_step_down(
    record: LeaseRecord | None, me: NodeId, now: float, margin_s: float = DEFAULT_STEP_DOWN_MARGIN_S
) -> bool:
    """True unless ``record`` is my lease and ``now`` is before ``expires_at - margin_s``.

    ``record`` is the last lease *this replica committed*; a primary whose renewals keep
    failing (KV down, partition) reaches the margin and must stop acting as primary.
    """
    return record is None or record.holder != me or now >= record.expires_at - margin_s


def is_primary(
    record: LeaseRecord | None, me: NodeId, now: float, margin_s: float = DEFAULT_STEP_DOWN_MARGIN_S
) -> bool:
    return not should_step_down(record, me, now, margin_s)


def ensure_primary(
    record: LeaseRecord | None, me: NodeId, now: float, margin_s: float = DEFAULT_STEP_DOWN_MARGIN_S
) -> None:
    """Raise :class:`NotPrimary` naming the live holder unless I may act as primary.

    The service calls it with the record read *inside* each mutating transaction (3FS's
    ``validate_lease_on_write``), so a write commits only under a lease that was live.
    """
    if is_primary(record, me, now, margin_s):
        return
    if record is not None and record.holder != me and now < record.expires_at:
        raise NotPrimary(node=me, primary=record.holder, primary_address=record.address, term=record.term)
    raise NotPrimary(node=me)


def in_bootstrap(record: LeaseRecord, now: float, bootstrap_s: float = DEFAULT_BOOTSTRAP_S) -> bool:
    """True during the window after a takeover (3FS: 2 min) when nodes that have not yet
    heartbeated to the new primary must not be failed (see ``registry.grace_after_takeover``)."""
    return now < record.acquired_at + bootstrap_s
