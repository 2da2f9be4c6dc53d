"""What the health service keeps and publishes: incidents, validations, and node verdict events.

- :class:`IncidentRecord` — something a detector blamed on a node, a link or a job (an Xid, C4's
  hang or slow verdict, a link flap, an operator's report), with its evidence and the actions taken;
- :class:`ValidationRecord` — one validation run on a node (level, the checks' results with their
  evidence, why it ran);
- :class:`NodeVerdict` — a node's state change, published on JetStream as
  ``ff.health.v1.node.<node>.verdict`` (stream ``FF_HEALTH``).
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from fireflyer.bus.events import Event
from fireflyer.bus.subjects import pattern, subject
from fireflyer.core.errors import InvalidArgument

from .checks.result import CheckResult, Status

__all__ = ["Blame", "IncidentRecord", "ValidationRecord", "ValidationTrigger", "NodeVerdict", "STREAM",
           "STREAM_SUBJECTS", "verdict_subject", "check_incident"]

STREAM = "FF_HEALTH"
STREAM_SUBJECTS = [pattern("health", entity=">")]  # ff.health.v1.>


class Blame(enum.StrEnum):
    """Who an incident blames: a node is drained and validated; a link or a job is recorded."""

    NODE = "node"
    LINK = "link"
    JOB = "job"


class IncidentRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One incident.  ``id`` and ``at`` are given by the service when empty/zero."""

    id: str = ""
    at: float = 0.0
    #: the syndrome: ``xid.79``, ``c4.hang``, ``c4.slow``, ``link.flap``, ``manual`` ...
    kind: str
    blame: Blame = Blame.NODE
    #: the blamed node ("" for a link or a job)
    node: str = ""
    #: the blamed link, ``nodeA-nodeB`` ("" otherwise)
    link: str = ""
    #: one line a person reads
    summary: str = ""
    #: the numbers and lines behind it (the Xid line, C4's wait times ...)
    evidence: dict[str, Any] = {}
    #: the scheduler run and the job it happened in, when known (0 / "": unknown)
    task: int = 0
    job: str = ""
    #: who reported it (the caller's user: a detector's service user, an operator)
    reporter: str = ""
    #: what the health service did about it, in order ("drained node1 at the scheduler (task 7 requeued)" ...)
    actions: tuple[str, ...] = ()


def check_incident(inc: IncidentRecord) -> IncidentRecord:
    """InvalidArgument naming the field for an incident that cannot be acted on."""
    if not inc.kind.strip():
        raise InvalidArgument("an incident needs a kind (its syndrome, e.g. xid.79 or c4.hang)", field="kind")
    if inc.blame is Blame.NODE and not inc.node:
        raise InvalidArgument("an incident that blames a node must name it", field="node")
    if inc.blame is Blame.LINK and not inc.link:
        raise InvalidArgument("an incident that blames a link must name it (nodeA-nodeB)", field="link")
    if inc.task < 0:
        raise InvalidArgument(f"task must be >= 0, got {inc.task}", field="task")
    return inc


class ValidationTrigger(enum.StrEnum):
    ON_DEMAND = "on_demand"
    #: before a drained node rejoins (after an incident or a periodic drain)
    REJOIN = "rejoin"
    PERIODIC = "periodic"


class ValidationRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    node: str
    level: int
    trigger: ValidationTrigger
    started_at: float
    #: 0 while it runs
    finished_at: float = 0.0
    #: None while it runs
    status: Status | None = None
    results: tuple[CheckResult, ...] = ()
    #: check -> why it did not run
    not_run: dict[str, str] = {}
    #: faults injected (check -> fault), for drills and tests
    inject: dict[str, str] = {}
    #: why the run could not be done at all (the agent unreachable ...): status ERROR
    error: str = ""
    #: who asked (on demand) or what triggered it
    requested_by: str = ""

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status is not Status.PASS]

    def summary(self) -> str:
        """One line: the checks that did not pass, or that all passed."""
        if self.error:
            return self.error
        bad = self.failed
        if not bad:
            return f"{len(self.results)} checks passed"
        return "; ".join(f"{r.check} {r.status.value}: {r.summary}" for r in bad)


class NodeVerdict(Event, frozen=True, kw_only=True, tag="health.verdict.v1"):
    """A node's health changed state (published on ``ff.health.v1.node.<node>.verdict``)."""

    node: str
    before: str
    after: str
    #: the event that moved it (incident, drain, drained, validation_started, ...)
    cause: str
    reason: str
    #: what the transition asked the service to do (drain, enable, validate)
    actions: tuple[str, ...] = ()
    incident: str = ""
    validation: str = ""
    at: float = 0.0


def verdict_subject(node: str) -> str:
    """``ff.health.v1.node.<node>.verdict`` (node names have no '.': the subject builder checks)."""
    return subject("health", "node", node, "verdict")
