"""A diagnostic service: proves the foundation end to end.

``python -m fireflyer.testing.echo`` serves ``ff.echo.v1.EchoService`` on the
standard runtime (auth, tracing, health, reflection, graceful stop):

- ``Echo`` returns the text, the caller's user and roles and the trace id; with
  ``publish_subject`` it first publishes an :class:`EchoPublished` event there;
  with ``sleep_s`` it then takes that long (to test graceful shutdown).
- ``Fail`` raises the named FireFlyerError with the given fields (error mapping).
- ``AdminPing`` is admin-only (role checks).

Every instance also subscribes to ``ff.echo.v1.echo.*.published`` and handles
what it receives inside a span, so a single trace follows a call from a client
through one instance and NATS into the others.  ``ff up`` runs it until the
real services land; tests use it as their service under test.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fireflyer.api.echo.v1 import echo_pb2, echo_pb2_grpc
from fireflyer.bus import subjects
from fireflyer.bus.events import Event
from fireflyer.core.errors import error_from_dict
from fireflyer.core.runtime import Service, ServiceContext, run_service
from fireflyer.rpc import current_principal, requires
from fireflyer.telemetry import trace_id_hex, tracer

__all__ = ["EchoService", "EchoPublished", "PUBLISHED_PATTERN", "published_subject"]

SERVICE_NAME = "ff.echo.v1.EchoService"
PUBLISHED_PATTERN = subjects.pattern("echo", entity="echo", event="published")


def published_subject(ident: str) -> str:
    return subjects.subject("echo", "echo", ident, "published")


class EchoPublished(Event, tag="echo.published.v1"):
    text: str
    user: str
    origin: str


class _Servicer(echo_pb2_grpc.EchoServiceServicer):
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    async def Echo(self, request: echo_pb2.EchoRequest, context: Any) -> echo_pb2.EchoReply:
        who = current_principal()
        # publish first, then wait: a test that sees the event knows the call is in flight
        if request.publish_subject:
            event = EchoPublished(text=request.text, user=who.user, origin=self.ctx.instance)
            await self.ctx.require_bus().publish(request.publish_subject, event)
        if request.sleep_s > 0:
            await asyncio.sleep(request.sleep_s)
        return echo_pb2.EchoReply(text=request.text, user=who.user, trace_id=trace_id_hex(),
                                  roles=sorted(who.roles))

    async def Fail(self, request: echo_pb2.FailRequest, context: Any) -> echo_pb2.FailReply:
        raise error_from_dict({"kind": request.kind, "code": "UNKNOWN", "message": request.message,
                               "fields": dict(request.fields)})

    @requires("admin")
    async def AdminPing(self, request: echo_pb2.AdminPingRequest, context: Any) -> echo_pb2.AdminPingReply:
        return echo_pb2.AdminPingReply(user=current_principal().user)


class EchoService(Service):
    """Fire-Flyer diagnostic echo service."""

    name = "echo"

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.received: list[EchoPublished] = []

    async def start(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        ctx.add_servicer(echo_pb2_grpc.add_EchoServiceServicer_to_server, _Servicer(ctx), SERVICE_NAME)
        await ctx.subscribe(PUBLISHED_PATTERN, self._on_published, types=EchoPublished)

    async def _on_published(self, event: EchoPublished, msg: Any) -> None:
        # the bus runs this inside a span whose parent is the publisher's; this
        # child span records what this instance did with it
        with tracer(__name__).start_as_current_span("echo.received") as span:
            span.set_attribute("echo.origin", event.origin)
            span.set_attribute("echo.text", event.text)
            self.received.append(event)
            self.ctx.log.info("echo.received", origin=event.origin, text=event.text, subject=msg.subject)


def main(argv: list[str] | None = None) -> int:
    return run_service(EchoService, argv)


if __name__ == "__main__":
    raise SystemExit(main())
