"""The rendezvous state machine: joins, generations and liveness, with no I/O.

Events and the time go in, decisions come out (DESIGN.md §2); the service
(``services/coord``) turns them into RPC replies, KV writes and NATS events, and
tests drive every rule with a fake clock.

**Joining.**  The first join of ``job/name`` (or one after the last generation
ended or was aborted) opens generation ``g+1`` in state *forming*; it fixes
``nnodes``, ``world_size`` (0: not checked) and the restart count.  Each join adds
a member with a deadline; when ``nnodes`` members are in, the generation becomes
*active*: ranks are assigned (:mod:`.layout`) and every waiting join is answered.
Rules, checked in this order:

- a join with a *lower* restart count than the generation's: FAILED_PRECONDITION;
- a *higher* restart count supersedes the generation (a forming one drops its
  waiters with ABORTED, an active one is aborted) and opens ``g+1``;
- forming, ``nnodes``/``world_size`` disagreeing: FAILED_PRECONDITION naming both;
- forming, the node's name already joined: the same address is a retry of the
  same node (it replaces the waiter); another address is ALREADY_EXISTS;
- active: a member's name again is ALREADY_EXISTS, a new name FAILED_PRECONDITION
  (the generation is full; abort it or restart the job with a higher count);
- a waiter whose deadline passes (:meth:`Rendezvous.expire`) is removed and gets
  DEADLINE_EXCEEDED listing the nodes still missing.

**Generations.**  Heartbeat/Leave/Abort name a generation; an older one than the
current is refused with FAILED_PRECONDITION "stale generation".  Leave marks the
member left (liveness stops watching it); when all members left the generation
*ended*.  A leave does not abort the others: at the end of a job workers stop one
by one, and their collectives have finished.

**Liveness.**  Members of an active generation must heartbeat; one silent for
``interval_s * misses`` gets the generation aborted by :meth:`Rendezvous.scan`,
the reason naming it.  After a restart of the service (:meth:`load`) every member
counts as seen at load time plus ``restart_grace_s``, so a coord outage aborts
nothing as long as the members come back within that grace and the limit.  Forming generations are kept in memory only: their joins are RPCs in
flight, which a restart ends anyway (clients retry).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from fireflyer.core.errors import (
    Aborted,
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    FireFlyerError,
    NotFound,
    PermissionDenied,
)

from .layout import assign_ranks, build_trees, cross_zone_pairs
from .model import ABORTED, ACTIVE, ENDED, FORMING, CommRecord, JoinSpec, Member

__all__ = ["LivenessConfig", "Outcome", "Rendezvous", "Waiter"]


class LivenessConfig(msgspec.Struct, frozen=True, kw_only=True):
    interval_s: float = 1.0
    misses: int = 3
    #: after a restart, members get this long on top of the limit to reach the new process
    #: (a gRPC channel backs off for seconds after its server vanished)
    restart_grace_s: float = 10.0

    @property
    def limit_s(self) -> float:
        return self.interval_s * self.misses


class Waiter(msgspec.Struct, frozen=True):
    """A pending join: (communicator, generation, node)."""

    comm: str
    generation: int
    node: str


class Outcome(msgspec.Struct, kw_only=True):
    """What one step decided.

    ``formed``: the generation that became active (answer all its waiters);
    ``aborted``: generations aborted by this step (publish, persist);
    ``failed``: waiters to answer with an error; ``dirty``: records to persist.
    """

    record: CommRecord | None = None
    formed: CommRecord | None = None
    aborted: list[CommRecord] = msgspec.field(default_factory=list)
    failed: list[tuple[Waiter, FireFlyerError]] = msgspec.field(default_factory=list)
    dirty: list[CommRecord] = msgspec.field(default_factory=list)


class Rendezvous:
    """All communicators' current generations; see the module docs."""

    def __init__(self, liveness: LivenessConfig | None = None) -> None:
        self.liveness = liveness or LivenessConfig()
        self.comms: dict[str, CommRecord] = {}
        self._deadline: dict[tuple[str, str], float] = {}  # (comm, node) -> deadline of a forming member
        self._seen: dict[tuple[str, str], float] = {}  # (comm, node) -> last heartbeat of an active member
        self.trees: dict[str, Any] = {}  # comm -> DoubleTree of the active generation

    # -- state ------------------------------------------------------------------------------------

    def load(self, records: Iterable[CommRecord], now: float) -> None:
        """Adopt persisted records (after a restart); active members count as seen now (plus the grace)."""
        for rec in records:
            if rec.state == FORMING:
                continue
            self.comms[rec.comm] = rec
            if rec.state == ACTIVE:
                self.trees[rec.comm] = build_trees(rec.members)
                for m in rec.members:
                    if not m.left:
                        self._seen[(rec.comm, m.node)] = now + self.liveness.restart_grace_s

    def get(self, comm: str) -> CommRecord:
        rec = self.comms.get(comm)
        if rec is None:
            raise NotFound(f"no communicator {comm!r} (known: {sorted(self.comms)[:10]})", comm=comm)
        return rec

    def last_seen(self, comm: str, node: str) -> float | None:
        return self._seen.get((comm, node))

    # -- joining ----------------------------------------------------------------------------------

    def join(self, spec: JoinSpec, now: float, deadline: float) -> Outcome:
        """Add a node; raises the caller's own error, else an :class:`Outcome` (``formed`` when complete)."""
        spec.check()
        cid = spec.comm
        rec = self.comms.get(cid)
        out = Outcome()
        if rec is not None and rec.live and rec.owner and spec.owner and spec.owner != rec.owner:
            # its events go to the owner's NATS namespace: another user may neither join nor supersede it
            raise PermissionDenied(
                f"communicator {cid} generation {rec.generation} belongs to user {rec.owner!r}; user "
                f"{spec.owner!r} cannot join it (use another --job name)", comm=cid, node=spec.node,
                owner=rec.owner)
        if rec is not None and spec.restart_count < rec.restart_count:
            raise FailedPrecondition(
                f"node {spec.node} joins {cid} with restart count {spec.restart_count}, but generation "
                f"{rec.generation} has restart count {rec.restart_count}: this process belongs to an older run "
                f"of the job", comm=cid, node=spec.node, restart_count=spec.restart_count,
                current=rec.restart_count)
        if rec is not None and rec.live and spec.restart_count > rec.restart_count:
            self._finish(rec, ABORTED, now, out, reason=f"superseded: node {spec.node} joined with restart count "
                         f"{spec.restart_count} (generation {rec.generation} has {rec.restart_count})")
        if rec is None or not rec.live:
            rec = CommRecord(job=spec.job, name=spec.name, generation=(rec.generation + 1) if rec else 1,
                             nnodes=spec.nnodes, world_size=spec.world_size, restart_count=spec.restart_count,
                             expected_nodes=spec.expected_nodes, created_at=now, owner=spec.owner)
            self.comms[cid] = rec
        elif rec.state == FORMING and not rec.members:
            # every earlier joiner gave up (deadline): the next join sets the shape afresh
            rec.nnodes, rec.world_size, rec.expected_nodes = spec.nnodes, spec.world_size, spec.expected_nodes
        elif rec.state == ACTIVE:
            if rec.member(spec.node) is not None:
                raise AlreadyExists(
                    f"node {spec.node} is already a member of {cid} generation {rec.generation}, which is active; "
                    f"a restarted job must join with a higher restart count (FF_RESTART_COUNT) or after the "
                    f"communicator is aborted", comm=cid, node=spec.node, generation=rec.generation)
            raise FailedPrecondition(
                f"{cid} generation {rec.generation} is already formed with {rec.nnodes} nodes "
                f"({', '.join(m.node for m in rec.members)}); node {spec.node} cannot join it", comm=cid,
                node=spec.node, generation=rec.generation)
        self._check_shape(rec, spec)
        old = rec.member(spec.node)
        if old is not None:
            if old.address != spec.address:
                raise AlreadyExists(
                    f"node name {spec.node} already joined {cid} generation {rec.generation} from "
                    f"{old.address or '(no address)'}; this join comes from {spec.address or '(no address)'}: "
                    f"two nodes with one name?", comm=cid, node=spec.node, address=old.address)
            rec.members.remove(old)  # the same node retrying: the new call replaces the old waiter
        rec.members.append(Member(node=spec.node, zone=spec.zone, address=spec.address,
                                  local_world_size=spec.local_world_size))
        self._deadline[(cid, spec.node)] = deadline
        out.record = rec
        if len(rec.members) == rec.nnodes:
            self._form(rec, now, out)
        return out

    def _check_shape(self, rec: CommRecord, spec: JoinSpec) -> None:
        first = rec.members[0].node if rec.members else "its first node"
        if spec.nnodes != rec.nnodes:
            raise FailedPrecondition(
                f"node {spec.node} joins {rec.comm} with nnodes={spec.nnodes}, but generation {rec.generation} "
                f"(opened by {first}) has nnodes={rec.nnodes}", comm=rec.comm, node=spec.node, got=spec.nnodes,
                expected=rec.nnodes, field="nnodes")
        if spec.world_size and rec.world_size and spec.world_size != rec.world_size:
            raise FailedPrecondition(
                f"node {spec.node} joins {rec.comm} with world_size={spec.world_size}, but generation "
                f"{rec.generation} (opened by {first}) has world_size={rec.world_size}", comm=rec.comm,
                node=spec.node, got=spec.world_size, expected=rec.world_size, field="world_size")
        if spec.world_size and not rec.world_size:
            rec.world_size = spec.world_size

    def _form(self, rec: CommRecord, now: float, out: Outcome) -> None:
        members = assign_ranks(rec.members)
        total = sum(m.local_world_size for m in members)
        for m in members:
            self._deadline.pop((rec.comm, m.node), None)
        if rec.world_size and total != rec.world_size:
            rec.members = members
            self._finish(rec, ABORTED, now, out, reason=f"the nodes' local world sizes add up to {total}, "
                         f"but the join asked for world_size={rec.world_size}")
            return
        dt = build_trees(members)
        rec.members, rec.state, rec.formed_at, rec.world_size = members, ACTIVE, now, total
        rec.depth, rec.cross_zone_pairs = dt.depth(), cross_zone_pairs(dt, members)
        self.trees[rec.comm] = dt
        for m in members:
            self._seen[(rec.comm, m.node)] = now
        out.formed = rec
        out.dirty.append(rec)

    def expire(self, now: float) -> Outcome:
        """Drop forming members whose join deadline passed; each gets DEADLINE_EXCEEDED."""
        out = Outcome()
        for (cid, node), dl in list(self._deadline.items()):
            if dl > now:
                continue
            del self._deadline[(cid, node)]
            rec = self.comms.get(cid)
            if rec is None or rec.state != FORMING:
                continue
            joined = [m.node for m in rec.members]
            missing = [n for n in rec.expected_nodes if n not in joined]
            what = (f"missing nodes: {', '.join(missing)}" if missing
                    else f"missing {rec.nnodes - len(joined)} of {rec.nnodes} nodes")
            err = DeadlineExceeded(
                f"node {node}: {cid} generation {rec.generation} did not form in time: {len(joined)} of "
                f"{rec.nnodes} nodes joined ({', '.join(joined)}); {what}", comm=cid, node=node,
                missing=",".join(missing), joined=",".join(joined))
            rec.members = [m for m in rec.members if m.node != node]
            out.failed.append((Waiter(cid, rec.generation, node), err))
        return out

    # -- members of an active generation ----------------------------------------------------------

    def _current(self, comm: str, generation: int, node: str, what: str) -> CommRecord:
        rec = self.get(comm)
        if generation and generation != rec.generation:
            raise FailedPrecondition(
                f"{what} from node {node or '(operator)'} for {comm}: stale generation {generation} (current "
                f"generation is {rec.generation}, {rec.state})", comm=comm, generation=generation,
                current=rec.generation)
        if node and what != "abort" and rec.member(node) is None:
            raise FailedPrecondition(f"{what}: node {node} is not a member of {comm} generation {rec.generation}",
                                     comm=comm, node=node)
        return rec

    def heartbeat(self, comm: str, generation: int, node: str, now: float) -> CommRecord:
        rec = self._current(comm, generation, node, "heartbeat")
        if rec.state == ACTIVE:
            self._seen[(comm, node)] = now
        return rec

    def leave(self, comm: str, generation: int, node: str, now: float) -> Outcome:
        rec = self._current(comm, generation, node, "leave")
        out = Outcome(record=rec)
        m = rec.member(node)
        assert m is not None
        if rec.state == FORMING:
            rec.members.remove(m)
            self._deadline.pop((comm, node), None)
            out.failed.append((Waiter(comm, rec.generation, node),
                               Aborted(f"node {node} left {comm} before it formed", comm=comm, node=node)))
            return out
        if not m.left:
            m.left = True
            self._seen.pop((comm, node), None)
            if rec.state == ACTIVE and all(x.left for x in rec.members):
                self._finish(rec, ENDED, now, out, reason="every node left")
            else:
                out.dirty.append(rec)
        return out

    def abort(self, comm: str, generation: int, node: str, reason: str, now: float) -> Outcome:
        """Abort the generation (idempotent: an ended or aborted one is returned as is)."""
        rec = self._current(comm, generation, node, "abort")
        out = Outcome(record=rec)
        if rec.live:
            who = f"node {node}" if node else "an operator"
            self._finish(rec, ABORTED, now, out, reason=f"aborted by {who}: {reason or 'no reason given'}",
                         culprit=node)
        return out

    def scan(self, now: float) -> Outcome:
        """Abort every active generation with a member silent for longer than the liveness limit."""
        out = Outcome()
        limit = self.liveness.limit_s
        for rec in list(self.comms.values()):
            if rec.state != ACTIVE:
                continue
            silent = [(m, now - self._seen.get((rec.comm, m.node), now)) for m in rec.members if not m.left]
            silent = [(m, age) for m, age in silent if age > limit]
            if not silent:
                continue
            m, age = max(silent, key=lambda x: x[1])
            names = ", ".join(f"node {x.node} (node rank {x.node_rank}, {x.address})" for x, _ in silent)
            self._finish(rec, ABORTED, now, out, culprit=m.node,
                         reason=f"{names} missed heartbeats for {age:.1f} s (limit {limit:g} s: "
                                f"{self.liveness.misses} x {self.liveness.interval_s:g} s); the process or its "
                                f"host is gone or stuck")
        return out

    def _finish(self, rec: CommRecord, state: str, now: float, out: Outcome, *, reason: str,
                culprit: str = "") -> None:
        was_forming = rec.state == FORMING
        rec.state, rec.reason, rec.culprit, rec.ended_at = state, reason, culprit, now
        for m in rec.members:
            self._seen.pop((rec.comm, m.node), None)
            if was_forming and self._deadline.pop((rec.comm, m.node), None) is not None:
                out.failed.append((Waiter(rec.comm, rec.generation, m.node),
                                   Aborted(f"{rec.comm} generation {rec.generation} was {state} before it formed: "
                                           f"{reason}", comm=rec.comm, generation=rec.generation)))
        self.trees.pop(rec.comm, None)
        if state == ABORTED and not was_forming:
            out.aborted.append(rec)
        if not was_forming:
            out.dirty.append(rec)
