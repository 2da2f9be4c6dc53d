"""A node's health as a pure state machine: events in, the new state and the actions it implies out.

    healthy ──Incident──► suspect ──Drain──► draining ──Drained──► drained ──ValidationStarted──► validating
       ▲  └────────────────Drain (periodic, incident)──┘                 ▲                           │
       └───────────────────────────── ValidationPassed (enable) ─────────┼───────────────────────────┤
                                                                         └── ValidationFailed ───────┘

- **healthy**: in service at the scheduler.
- **suspect**: an incident blamed the node (an Xid, C4's hang or slow verdict, a link flap); it is
  still in service until the health service decides to drain it (it does at once for a node-blaming
  incident; a milder one leaves it suspect until the next validation).
- **draining**: drained at the scheduler (no new task); its running task is being stopped and
  requeued elsewhere (``evict``), or, for a periodic validation, allowed to finish.
- **drained**: no task on it; out of service.  ``pending_level`` says which validation to run next
  (none after a failed validation: it stays drained until an operator validates it again).
- **validating**: the node agent runs the checks at some level.  Pass: healthy, enabled at the
  scheduler if it was drained.  Fail: drained (drained at the scheduler if it was not).

A healthy or suspect node may also be validated on demand without a drain (``ff health validate``):
healthy/suspect → validating → healthy, or → drained (and drained at the scheduler) on a failure.

:func:`transition` is the only way a state changes; it raises :class:`IllegalTransition` for an
event the state does not accept and returns a :class:`Transition` naming the actions the service
performs (:class:`Action`): drain at the scheduler (with or without evicting the running task),
enable at the scheduler, request a validation.  No I/O, no clock: ``now`` comes in.
"""

from __future__ import annotations

import enum

import msgspec

from fireflyer.core.errors import FailedPrecondition

__all__ = ["NodeState", "NodeHealth", "ActionKind", "Action", "Incident", "Drain", "Drained", "ValidationStarted",
           "ValidationPassed", "ValidationFailed", "HealthEvent", "Transition", "IllegalTransition", "transition",
           "ACCEPTS", "INCIDENT_LEVEL", "PERIODIC_LEVEL", "REJOIN_LEVEL"]

#: the validation a node gets after an incident drained it (DCGM's "after a failed job" level)
INCIDENT_LEVEL = 2
#: before a drained node rejoins (when nothing asked for another level)
REJOIN_LEVEL = 2
#: the long periodic run (weekly by default)
PERIODIC_LEVEL = 3


class NodeState(enum.StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    DRAINING = "draining"
    DRAINED = "drained"
    VALIDATING = "validating"


class NodeHealth(msgspec.Struct, frozen=True, kw_only=True):
    """What the health service knows about one node (kept in its KV)."""

    name: str
    state: NodeState = NodeState.HEALTHY
    #: one line: why it is in this state
    reason: str = ""
    #: when it entered this state (wall clock, s)
    since: float = 0.0
    #: whether the health service has drained it at the scheduler (and must enable it again)
    drained: bool = False
    #: the drain stops and requeues the node's running task (an incident), else lets it finish
    evict: bool = False
    #: the validation to run once it is drained (None: none asked; a failed node waits for an operator)
    pending_level: int | None = None
    #: the incident that made it suspect / drained it ("" if none)
    incident: str = ""
    #: the validation running now, or the last one
    validation: str = ""
    #: the last passing validation of each level: level -> time (periodic validation counts from it)
    last_passed: dict[int, float] = {}
    #: when the node was first seen (periodic validation of a node never validated counts from it)
    first_seen: float = 0.0


class ActionKind(enum.StrEnum):
    #: SetState drained at the scheduler (``evict``: stop and requeue the task running there)
    DRAIN = "drain"
    #: SetState enabled at the scheduler
    ENABLE = "enable"
    #: run a validation at ``level`` on the node
    VALIDATE = "validate"


class Action(msgspec.Struct, frozen=True, kw_only=True):
    kind: ActionKind
    reason: str = ""
    evict: bool = False
    level: int = 0


# -- events ------------------------------------------------------------------------------------------
class Incident(msgspec.Struct, frozen=True, kw_only=True, tag="incident"):
    """An incident blamed the node."""

    incident: str
    reason: str


class Drain(msgspec.Struct, frozen=True, kw_only=True, tag="drain"):
    """Take the node out of service, then validate it at ``level``.  ``evict``: stop and requeue its
    running task now (an incident); without it the task may finish first (periodic validation)."""

    reason: str
    level: int = REJOIN_LEVEL
    evict: bool = True


class Drained(msgspec.Struct, frozen=True, kw_only=True, tag="drained"):
    """The scheduler has the node drained and no task holds it."""


class ValidationStarted(msgspec.Struct, frozen=True, kw_only=True, tag="validation_started"):
    validation: str
    level: int


class ValidationPassed(msgspec.Struct, frozen=True, kw_only=True, tag="validation_passed"):
    validation: str
    level: int


class ValidationFailed(msgspec.Struct, frozen=True, kw_only=True, tag="validation_failed"):
    validation: str
    level: int
    #: the failed checks, one line
    reason: str


HealthEvent = Incident | Drain | Drained | ValidationStarted | ValidationPassed | ValidationFailed

#: state -> the events it accepts
ACCEPTS: dict[NodeState, tuple[type, ...]] = {
    NodeState.HEALTHY: (Incident, Drain, ValidationStarted),
    NodeState.SUSPECT: (Incident, Drain, ValidationStarted),
    NodeState.DRAINING: (Drained,),
    NodeState.DRAINED: (ValidationStarted,),
    NodeState.VALIDATING: (ValidationPassed, ValidationFailed),
}


class IllegalTransition(FailedPrecondition):
    """The node's state does not accept the event (e.g. validating a node whose task still runs)."""


class Transition(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    before: NodeState
    after: NodeState
    event: str
    reason: str
    actions: tuple[Action, ...] = ()
    #: the node's record after the transition
    health: NodeHealth


def transition(h: NodeHealth, event: HealthEvent, now: float) -> Transition:
    """The node's next state for ``event``; :class:`IllegalTransition` if its state does not accept it."""
    if not isinstance(event, ACCEPTS[h.state]):
        accepted = ", ".join(_tag(c) for c in ACCEPTS[h.state])
        raise IllegalTransition(f"node {h.name} is {h.state.value}: it does not accept {_tag(type(event))} "
                                f"(it accepts {accepted})", node=h.name, state=h.state.value, event=_tag(type(event)))
    actions: tuple[Action, ...] = ()
    new = h
    match event:
        case Incident(incident=inc, reason=why):
            new = _replace(h, NodeState.SUSPECT, why, now, incident=inc)
        case Drain(reason=why, level=level, evict=evict):
            new = _replace(h, NodeState.DRAINING, why, now, drained=True, pending_level=level, evict=evict)
            actions = (Action(kind=ActionKind.DRAIN, reason=why, evict=evict),)
        case Drained():
            why = f"drained; level-{h.pending_level} validation next" if h.pending_level else h.reason
            new = _replace(h, NodeState.DRAINED, why, now)
            if h.pending_level:
                actions = (Action(kind=ActionKind.VALIDATE, level=h.pending_level, reason=h.reason),)
        case ValidationStarted(validation=vid, level=level):
            new = _replace(h, NodeState.VALIDATING, f"level-{level} validation {vid} running", now, validation=vid,
                           pending_level=None)
        case ValidationPassed(validation=vid, level=level):
            passed = {**h.last_passed, level: now}
            new = _replace(h, NodeState.HEALTHY, f"level-{level} validation {vid} passed", now, drained=False,
                           last_passed=passed, incident="")
            if h.drained:
                actions = (Action(kind=ActionKind.ENABLE, reason=new.reason),)
        case ValidationFailed(validation=vid, level=level, reason=why):
            reason = f"level-{level} validation {vid} failed: {why}"
            new = _replace(h, NodeState.DRAINED, reason, now, drained=True, evict=True)
            if not h.drained:  # (a node validated in service is taken out now; its task requeued)
                actions = (Action(kind=ActionKind.DRAIN, reason=reason, evict=True),)
    return Transition(node=h.name, before=h.state, after=new.state, event=_tag(type(event)), reason=new.reason,
                      actions=actions, health=new)


def _replace(h: NodeHealth, state: NodeState, reason: str, now: float, **changes: object) -> NodeHealth:
    return msgspec.structs.replace(h, state=state, reason=reason, since=now, **changes)


def _tag(cls: type) -> str:
    return str(cls.__struct_config__.tag)  # type: ignore[attr-defined]
