"""Ask a server's ``grpc.health.v1`` service how it is (``ff up``, ``ff status``)."""

from __future__ import annotations

from grpc_health.v1 import health_pb2, health_pb2_grpc

from fireflyer.core.config import RpcSettings
from fireflyer.core.errors import Cancelled, DeadlineExceeded, NotFound, Unavailable

from .channel import connect

__all__ = ["check_health"]


async def check_health(address: str, *, service: str = "", timeout_s: float = 2.0) -> str:
    """The serving status of ``service`` ("" = the whole server) at ``address``.

    Returns "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" (the server does not
    know that service) or "UNKNOWN"; raises :class:`Unavailable` naming the
    address when nothing answers within ``timeout_s``.
    """
    settings = RpcSettings(default_deadline_s=timeout_s)
    # health needs no token; "" keeps FF_TOKEN out of a probe that does not need it
    async with connect(address, token="", settings=settings) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except NotFound:
            # the health service answers NOT_FOUND for a service it was never told about
            return "SERVICE_UNKNOWN"
        except (Unavailable, DeadlineExceeded, Cancelled) as e:
            # CANCELLED: the server began stopping while the probe was in flight
            raise Unavailable(f"nothing answers gRPC health checks at {address} within {timeout_s}s "
                              f"({e.kind}): is the service running?", address=address, service=service) from None
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
