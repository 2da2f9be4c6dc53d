"""The meta service's second door: every ``MetaService`` call over ``fireflyer.wire.aio``.

Why a second transport: a stat or a create is a few hundred microseconds of store work,
and gRPC's Python stack (call objects, metadata, interceptor, the aio completion queue)
cost about twice that again on the server and as much on the client; it was two thirds
of the meta server's CPU in ``ff bench meta``.  This endpoint runs the *same* servicer
methods (same argument checks, same store calls, same idempotency ids, same typed errors)
behind a framed request/response protocol on the service's own event loop:

- the op name is the RPC's method name (``Create``, ``Stat``, ...), the request payload the
  serialized protobuf request, the response payload the serialized reply;
- the connection authenticates once, with the hello's bearer token looked up in the same
  token store as the gRPC interceptor's (auth disabled: the anonymous admin, as for gRPC);
  each call then runs as that principal (``acting_as``), so permission checks are unchanged;
- errors travel as wire error frames and are raised again in the client with the same type
  and fields (``FsError`` with its errno and path).

gRPC stays the service's main door (health, admin tools, any gRPC client); ``Endpoints``
tells a :class:`fireflyer.fs.MetaClient` where this one listens, and the client uses it
when it can (``FF_META_TRANSPORT=grpc`` keeps it on gRPC).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.message import DecodeError

from fireflyer.api.meta.v1 import meta_pb2 as pb
from fireflyer.core.errors import InvalidArgument, Unimplemented
from fireflyer.rpc import acting_as
from fireflyer.wire.aio import AioRequest, AioWireServer

from .servicer import SERVICE_NAME

__all__ = ["MetaWireEndpoint", "wire_methods"]

_Method = tuple[Callable[[bytes], Any], Callable[[Any, Any], Awaitable[Any]], str]


def wire_methods(servicer: Any) -> dict[str, _Method]:
    """op name -> (request parser, servicer method, full gRPC method name), from the proto."""
    out: dict[str, _Method] = {}
    for m in pb.DESCRIPTOR.services_by_name["MetaService"].methods:
        request_type = getattr(pb, m.input_type.name)
        out[m.name] = (request_type.FromString, getattr(servicer, m.name), f"/{SERVICE_NAME}/{m.name}")
    return out


class MetaWireEndpoint:
    """A wire listener in front of one :class:`~.servicer.MetaServicer`."""

    def __init__(self, servicer: Any, *, authenticate: Callable[[str], Any], host: str, port: int = 0) -> None:
        self.methods = wire_methods(servicer)
        self.server = AioWireServer(self.handle, authenticate=authenticate, host=host, port=port, name="meta-wire")

    async def start(self) -> str:
        """Listen; returns the address clients should dial."""
        await self.server.start()
        return self.server.address

    async def stop(self, grace_s: float = 0.0) -> None:
        await self.server.stop(grace_s=grace_s)

    async def handle(self, req: AioRequest) -> bytes:
        entry = self.methods.get(req.op)
        if entry is None:
            raise Unimplemented(f"the meta service has no call {req.op!r}", op=req.op)
        parse, call, full_name = entry
        try:
            request = parse(req.payload)
        except DecodeError as e:
            raise InvalidArgument(f"{req.op}: undecodable request payload: {e}", op=req.op) from None
        with acting_as(req.principal, full_name):
            reply = await call(request, None)
        return reply.SerializeToString()  # type: ignore[no-any-return]
