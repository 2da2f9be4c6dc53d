"""The node registry of the primary mgmtd: heartbeats in, node and target-state changes out.

3FS (research/3fs.md §1 "Heartbeats"): services heartbeat every 10 s; the primary marks a
node ``HEARTBEAT_FAILED`` and its targets' local state ``OFFLINE`` after
``heartbeat_fail_interval`` (60 s), checked every 10 s.  Local states live in mgmtd's
memory (research/3fs.md §3), so :class:`RegistryState` is what the service keeps in memory
(and may snapshot to the KV); the chain updater reads :func:`local_states` from it.

Two pure functions, no clock of their own (the service passes ``clock.time()``):

- :func:`apply_heartbeat` registers or refreshes a node, revives a failed one, and records
  the local states a storage node reports for its targets;
- :func:`scan_failures` fails nodes whose last heartbeat is ``fail_interval_s`` old.

Both return the events the service publishes on NATS (typed :class:`~fireflyer.bus.Event`
structs).  Their ``event_id`` is derived from what happened and when, so a replay of the
same decision (a retried publish after a mgmtd failover) is dropped by JetStream as a
duplicate, and the functions stay deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import msgspec

from fireflyer.bus.events import Event
from fireflyer.core.errors import InvalidArgument, PermissionDenied

from .model import LocalState, NodeId, NodeInfo, NodeStatus, NodeType, TargetId

__all__ = [
    "DEFAULT_HEARTBEAT_INTERVAL_S",
    "DEFAULT_FAIL_INTERVAL_S",
    "TargetReport",
    "Heartbeat",
    "TargetLocal",
    "RegistryState",
    "NodeRegistered",
    "NodeFailed",
    "NodeRecovered",
    "TargetStateChanged",
    "RegistryEvent",
    "ScanResult",
    "apply_heartbeat",
    "check_owner",
    "scan_failures",
    "grace_after_takeover",
    "local_states",
]

#: 3FS defaults (research/3fs.md §1)
DEFAULT_HEARTBEAT_INTERVAL_S = 10.0
DEFAULT_FAIL_INTERVAL_S = 60.0


class TargetReport(msgspec.Struct, frozen=True, kw_only=True):
    """One target's local state as its storage node sees it."""

    target_id: TargetId
    local_state: LocalState
    disk: str = ""
    path: str = ""


class Heartbeat(Event, tag="mgmt.heartbeat.v1"):
    """What a meta, storage or node-agent process sends every ``DEFAULT_HEARTBEAT_INTERVAL_S``
    (over gRPC or NATS ``ff.node.v1.node.<id>.heartbeat``); ``targets`` only from storage nodes,
    listing *every* target the node serves."""

    node_id: NodeId
    node_type: NodeType
    address: str
    hostname: str = ""
    tags: tuple[str, ...] = ()
    targets: tuple[TargetReport, ...] = ()
    #: the service user whose credential sent it: set by mgmtd from the call's token, never by
    #: the sender ("" only where no credential exists: auth disabled, unit tests)
    sender: str = ""


class TargetLocal(msgspec.Struct, frozen=True, kw_only=True):
    """The registry's view of one target: which node reported it, its local state, since when."""

    target_id: TargetId
    node_id: NodeId
    local_state: LocalState
    since: float
    disk: str = ""
    path: str = ""


class RegistryState(msgspec.Struct, frozen=True, kw_only=True):
    """Nodes by id and targets by id.  Treated as immutable: functions return a new state."""

    nodes: dict[NodeId, NodeInfo] = msgspec.field(default_factory=dict)
    targets: dict[TargetId, TargetLocal] = msgspec.field(default_factory=dict)


# -- events (published by the service; tags are the contract, see fireflyer.bus.events) --------


class NodeRegistered(Event, tag="mgmt.node_registered.v1"):
    node_id: NodeId
    node_type: NodeType
    address: str


class NodeFailed(Event, tag="mgmt.node_failed.v1"):
    node_id: NodeId
    node_type: NodeType
    last_heartbeat: float
    #: targets whose local state this failure turned OFFLINE
    targets: tuple[TargetId, ...] = ()


class NodeRecovered(Event, tag="mgmt.node_recovered.v1"):
    node_id: NodeId
    node_type: NodeType
    address: str
    down_since: float  # its last heartbeat before the failure


class TargetStateChanged(Event, tag="mgmt.target_state_changed.v1"):
    target_id: TargetId
    node_id: NodeId
    old: LocalState | None  # None: first report of this target
    new: LocalState


RegistryEvent = NodeRegistered | NodeFailed | NodeRecovered | TargetStateChanged


class ScanResult(NamedTuple):
    state: RegistryState
    failed: tuple[NodeId, ...]  # nodes newly marked HEARTBEAT_FAILED
    offlined: tuple[TargetId, ...]  # targets whose local state became OFFLINE
    events: list[RegistryEvent]


def _eid(what: str, who: object, now: float) -> str:
    return f"{what}:{who}@{now!r}"


def apply_heartbeat(
    state: RegistryState, hb: Heartbeat, now: float
) -> tuple[RegistryState, list[RegistryEvent]]:
    """Record one heartbeat received at ``now`` (mgmtd's clock, not the sender's).

    - unknown node: registered ALIVE (NodeRegistered);
    - HEARTBEAT_FAILED node: ALIVE again (NodeRecovered); DISABLED stays DISABLED (an
      operator's decision), but its heartbeat time and targets are still recorded;
    - each reported target takes the reported local state (TargetStateChanged when it differs);
    - a target this node reported before but omits now becomes OFFLINE -- *our choice*: the
      node no longer serves it (disk pulled, target removed), so it must not stay in a chain
      as alive; if it comes back it is treated like any returning target (resync).
    - a target reported by another node than before moves to the reporter -- *our choice*:
      the latest report wins (a disk moved between hosts).

    - the node belongs to the service user whose credential first registered it (``owner``):
      a heartbeat of another user for that node id, or one claiming a target that a node of
      another owner serves, is refused -- *our choice*: one service credential cannot take
      over another's node (e.g. ``svc-meta`` posing as ``storage-2``) and so receive its
      peers' chain forwarding; a restarted node heartbeats with the same credential, so it
      takes its name back as before.

    Raises:
        InvalidArgument: the node id is registered with another type (two processes
            configured with one name); the heartbeat is refused, nothing changes.
        PermissionDenied: the node id or a reported target belongs to another owner.
    """
    old = state.nodes.get(hb.node_id)
    check_owner(state, hb)
    if old is not None and old.type is not hb.node_type:
        raise InvalidArgument(
            f"node id {hb.node_id!r} is registered as {old.type}, but a {hb.node_type} at {hb.address} "
            "heartbeats with it; give each process a unique node id",
            node=hb.node_id,
            expected=str(old.type),
            got=str(hb.node_type),
        )
    events: list[RegistryEvent] = []
    if old is None:
        status, registered_at = NodeStatus.ALIVE, now
        events.append(
            NodeRegistered(
                node_id=hb.node_id,
                node_type=hb.node_type,
                address=hb.address,
                event_id=_eid("registered", hb.node_id, now),
                sent_at=now,
            )
        )
    elif old.status is NodeStatus.HEARTBEAT_FAILED:
        status, registered_at = NodeStatus.ALIVE, now
        events.append(
            NodeRecovered(
                node_id=hb.node_id,
                node_type=hb.node_type,
                address=hb.address,
                down_since=old.last_heartbeat,
                event_id=_eid("recovered", hb.node_id, now),
                sent_at=now,
            )
        )
    else:
        status, registered_at = old.status, old.registered_at
    node = NodeInfo(
        node_id=hb.node_id,
        type=hb.node_type,
        address=hb.address,
        hostname=hb.hostname,
        status=status,
        last_heartbeat=max(now, old.last_heartbeat) if old is not None else now,
        registered_at=registered_at,
        tags=hb.tags,
        # a node stored before owners existed is claimed by its next heartbeat's sender
        owner=old.owner if old is not None and old.owner else hb.sender,
    )
    nodes = {**state.nodes, hb.node_id: node}

    targets = dict(state.targets)
    reported = set()
    for rep in hb.targets:
        reported.add(rep.target_id)
        prev = targets.get(rep.target_id)
        changed = prev is None or prev.local_state is not rep.local_state
        if changed or prev.node_id != hb.node_id or prev.disk != rep.disk or prev.path != rep.path:  # type: ignore[union-attr]
            targets[rep.target_id] = TargetLocal(
                target_id=rep.target_id,
                node_id=hb.node_id,
                local_state=rep.local_state,
                since=now if changed else prev.since,  # type: ignore[union-attr]
                disk=rep.disk,
                path=rep.path,
            )
        if changed:
            events.append(_target_event(rep.target_id, hb.node_id, prev, rep.local_state, now))
    for tid, t in state.targets.items():
        if t.node_id == hb.node_id and tid not in reported and t.local_state is not LocalState.OFFLINE:
            targets[tid] = msgspec.structs.replace(t, local_state=LocalState.OFFLINE, since=now)
            events.append(_target_event(tid, hb.node_id, t, LocalState.OFFLINE, now))
    return RegistryState(nodes=nodes, targets=targets), events


def check_owner(state: RegistryState, hb: Heartbeat) -> None:
    """Refuse (PermissionDenied) a heartbeat for a node, or claiming a target of a node, that
    another service user registered.  Nodes without an owner (stored before owners existed,
    or registered with auth disabled) bind to nobody."""
    old = state.nodes.get(hb.node_id)
    if old is not None and old.owner and old.owner != hb.sender:
        raise PermissionDenied(
            f"node {hb.node_id!r} was registered by service user {old.owner!r}; user {hb.sender!r} may not "
            "heartbeat as it: give each service its own node id, or run it with the credential that registered it",
            node=hb.node_id, owner=old.owner, user=hb.sender)
    for rep in hb.targets:
        prev = state.targets.get(rep.target_id)
        holder = state.nodes.get(prev.node_id) if prev is not None and prev.node_id != hb.node_id else None
        if holder is not None and holder.owner and holder.owner != hb.sender:
            raise PermissionDenied(
                f"target {rep.target_id} is served by node {holder.node_id!r} of service user {holder.owner!r}; "
                f"node {hb.node_id!r} of user {hb.sender!r} may not claim it",
                node=hb.node_id, target=rep.target_id, owner=holder.owner, user=hb.sender)


def _target_event(
    tid: TargetId, node: NodeId, prev: TargetLocal | None, new: LocalState, now: float
) -> TargetStateChanged:
    return TargetStateChanged(
        target_id=tid,
        node_id=node,
        old=None if prev is None else prev.local_state,
        new=new,
        event_id=_eid(f"target-{new}", tid, now),
        sent_at=now,
    )


def scan_failures(
    state: RegistryState, now: float, fail_interval_s: float = DEFAULT_FAIL_INTERVAL_S
) -> ScanResult:
    """Fail every ALIVE node whose last heartbeat is at least ``fail_interval_s`` old.

    Its status becomes HEARTBEAT_FAILED and all its targets' local state OFFLINE, so the
    next chain update moves them out of service (research/3fs.md §1, §3).  DISABLED nodes
    are left alone; already-failed nodes are not failed again (no duplicate events).
    """
    if not fail_interval_s > 0:
        raise InvalidArgument(
            f"fail_interval_s must be positive, got {fail_interval_s}", key="fail_interval_s"
        )
    nodes: dict[NodeId, NodeInfo] | None = None
    targets: dict[TargetId, TargetLocal] | None = None
    failed: list[NodeId] = []
    offlined: list[TargetId] = []
    events: list[RegistryEvent] = []
    for nid, n in state.nodes.items():
        if n.status is not NodeStatus.ALIVE or now - n.last_heartbeat < fail_interval_s:
            continue
        nodes = dict(state.nodes) if nodes is None else nodes
        targets = dict(state.targets) if targets is None else targets
        nodes[nid] = msgspec.structs.replace(n, status=NodeStatus.HEARTBEAT_FAILED)
        failed.append(nid)
        mine: list[TargetId] = []
        target_events: list[RegistryEvent] = []
        for tid, t in state.targets.items():
            if t.node_id == nid and t.local_state is not LocalState.OFFLINE:
                targets[tid] = msgspec.structs.replace(t, local_state=LocalState.OFFLINE, since=now)
                mine.append(tid)
                target_events.append(_target_event(tid, nid, t, LocalState.OFFLINE, now))
        offlined.extend(mine)
        events.append(
            NodeFailed(
                node_id=nid,
                node_type=n.type,
                last_heartbeat=n.last_heartbeat,
                targets=tuple(mine),
                event_id=_eid("failed", nid, now),
                sent_at=now,
            )
        )
        events.extend(target_events)
    if nodes is None:
        return ScanResult(state, (), (), [])
    return ScanResult(
        RegistryState(nodes=nodes, targets=targets or {}), tuple(failed), tuple(offlined), events
    )


def grace_after_takeover(state: RegistryState, now: float) -> RegistryState:
    """Restart every ALIVE node's heartbeat clock at ``now``.

    A replica that just took the lease (or loaded the registry from the KV) has not heard
    from anyone yet; failing nodes for silence it did not witness would offline healthy
    targets.  Each node gets a full fail interval to reach the new primary (3FS keeps a
    2-minute bootstrapping window for the same reason, research/3fs.md §1).
    """
    nodes = {
        nid: (
            msgspec.structs.replace(n, last_heartbeat=now)
            if n.status is NodeStatus.ALIVE and n.last_heartbeat < now
            else n
        )
        for nid, n in state.nodes.items()
    }
    return RegistryState(nodes=nodes, targets=state.targets)


def local_states(state: RegistryState) -> Mapping[TargetId, LocalState]:
    """Target id -> local state, the input of :func:`fireflyer.mgmt.chains.next_chain`."""
    return {tid: t.local_state for tid, t in state.targets.items()}
