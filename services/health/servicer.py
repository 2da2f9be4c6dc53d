"""gRPC edge of the health service: protobuf in, :class:`~services.health.core.HealthCore` calls, protobuf out.

Roles: ListNodes answers any valid token (users may see which nodes are out and why); Validate,
ListIncidents, GetIncident and ReportIncident need admin or service (incidents name every user's
tasks and jobs; a validation may drain a node).
"""

from __future__ import annotations

import json
from typing import Any

from fireflyer.api.health.v1 import health_pb2 as pb
from fireflyer.api.health.v1 import health_pb2_grpc as pb_grpc
from fireflyer.core.errors import InvalidArgument
from fireflyer.health.records import Blame, IncidentRecord, ValidationRecord
from fireflyer.health.states import NodeHealth
from fireflyer.rpc import current_principal, requires

from .core import HealthCore

__all__ = ["SERVICE_NAME", "HealthServicer", "node_to_pb", "incident_to_pb", "incident_from_pb", "validation_to_pb"]

SERVICE_NAME = "ff.health.v1.HealthService"


def node_to_pb(h: NodeHealth) -> pb.NodeHealth:
    return pb.NodeHealth(name=h.name, state=h.state.value, reason=h.reason, since=h.since, drained=h.drained,
                         pending_level=h.pending_level or 0, incident=h.incident, validation=h.validation,
                         last_passed={int(k): v for k, v in h.last_passed.items()})


def incident_to_pb(i: IncidentRecord) -> pb.Incident:
    return pb.Incident(id=i.id, at=i.at, kind=i.kind, blame=i.blame.value, node=i.node, link=i.link,
                       summary=i.summary, evidence_json=json.dumps(i.evidence, default=str), task=i.task, job=i.job,
                       reporter=i.reporter, actions=list(i.actions))


def incident_from_pb(m: pb.Incident) -> IncidentRecord:
    try:
        blame = Blame(m.blame or "node")
    except ValueError:
        raise InvalidArgument(f"blame must be node, link or job, got {m.blame!r}", field="blame") from None
    try:
        evidence = json.loads(m.evidence_json) if m.evidence_json else {}
    except json.JSONDecodeError as e:
        raise InvalidArgument(f"evidence_json is not JSON: {e}", field="evidence_json") from None
    if not isinstance(evidence, dict):
        raise InvalidArgument("evidence_json must be a JSON object", field="evidence_json")
    return IncidentRecord(kind=m.kind, blame=blame, node=m.node, link=m.link, summary=m.summary, evidence=evidence,
                          task=int(m.task), job=m.job, at=m.at)


def validation_to_pb(v: ValidationRecord) -> pb.Validation:
    return pb.Validation(
        id=v.id, node=v.node, level=v.level, trigger=v.trigger.value, started_at=v.started_at,
        finished_at=v.finished_at, status=v.status.value if v.status else "", not_run=v.not_run, inject=v.inject,
        error=v.error, requested_by=v.requested_by,
        results=[pb.CheckResult(check=r.check, status=r.status.value, summary=r.summary,
                                evidence_json=json.dumps(r.evidence, default=str), duration_s=r.duration_s,
                                injected=r.injected) for r in v.results])


class HealthServicer(pb_grpc.HealthServiceServicer):
    def __init__(self, core: HealthCore) -> None:
        self.core = core

    async def ListNodes(self, request: pb.ListNodesRequest, context: Any) -> pb.ListNodesReply:
        return pb.ListNodesReply(nodes=[node_to_pb(h) for h in await self.core.nodes()])

    @requires("admin", "service")
    async def Validate(self, request: pb.ValidateRequest, context: Any) -> pb.ValidateReply:
        if not request.node:
            raise InvalidArgument("name the node to validate", field="node")
        rec, h = await self.core.validate(request.node, int(request.level or 1), inject=dict(request.inject),
                                          requested_by=current_principal().user)
        return pb.ValidateReply(validation=validation_to_pb(rec), node=node_to_pb(h))

    @requires("admin", "service")
    async def ListIncidents(self, request: pb.ListIncidentsRequest, context: Any) -> pb.ListIncidentsReply:
        incs = await self.core.incidents(request.node, int(request.limit))
        return pb.ListIncidentsReply(incidents=[incident_to_pb(i) for i in incs])

    @requires("admin", "service")
    async def GetIncident(self, request: pb.GetIncidentRequest, context: Any) -> pb.IncidentReply:
        return pb.IncidentReply(incident=incident_to_pb(await self.core.incident(request.id)))

    @requires("admin", "service")
    async def ReportIncident(self, request: pb.ReportIncidentRequest, context: Any) -> pb.IncidentReply:
        inc = incident_from_pb(request.incident)
        rec = await self.core.report_incident(inc, reporter=current_principal().user)
        return pb.IncidentReply(incident=incident_to_pb(rec))
