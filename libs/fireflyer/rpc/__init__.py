"""gRPC for Fire-Flyer: the only place that builds servers and channels.

Server side::

    server = RpcServer(settings.rpc, service="echo", tokens=TokenStore.from_file(path))
    server.add_servicer(echo_pb2_grpc.add_EchoServiceServicer_to_server, servicer, "ff.echo.v1.EchoService")
    port = await server.start()
    ...
    await server.stop(grace_s=10)

    class Servicer(echo_pb2_grpc.EchoServiceServicer):
        @requires("admin")
        async def AdminPing(self, request, context):
            return echo_pb2.AdminPingReply(user=current_principal().user)

Client side::

    async with connect(address, token=token) as channel:
        reply = await echo_pb2_grpc.EchoServiceStub(channel).Echo(req)   # raises NotFound, ...

    await check_health(address)   # "SERVING", "NOT_SERVING", ... or Unavailable

Servers: keepalive, message-size limits, ``grpc.health.v1`` and reflection
(no token needed), and per call a SERVER span, bearer-token auth, error
mapping and one log line.  Channels: token and trace context in the metadata,
a default deadline, a CLIENT span, typed errors.  Error mapping is in
:mod:`fireflyer.rpc.errors`; tokens and roles in :mod:`fireflyer.rpc.auth`.
"""

from typing import TYPE_CHECKING

from fireflyer.core.lazy import lazy_attributes

# (lazy: :mod:`.auth` is light and used by processes that never open a channel -- the local
# cluster's records, an HFReduce worker through them -- which must not import gRPC for it)
__getattr__ = lazy_attributes(__name__, {
    **dict.fromkeys(["ANONYMOUS_ADMIN", "ROLES", "SERVICE_ROLE", "Principal", "TokenEntry", "TokenStore", "acting_as",
                     "current_method", "current_principal", "generate_token", "require_role", "requires",
                     "write_tokens_file"], "auth"),
    "connect": "channel",
    **dict.fromkeys(["ERROR_DETAILS_KEY", "error_class_for_status", "error_from_rpc_error", "status_for_error"],
                    "errors"),
    "check_health": "health", "RpcServer": "server",
})

if TYPE_CHECKING:
    from .auth import (
        ANONYMOUS_ADMIN,
        ROLES,
        SERVICE_ROLE,
        Principal,
        TokenEntry,
        TokenStore,
        acting_as,
        current_method,
        current_principal,
        generate_token,
        require_role,
        requires,
        write_tokens_file,
    )
    from .channel import connect
    from .errors import (
        ERROR_DETAILS_KEY,
        error_class_for_status,
        error_from_rpc_error,
        status_for_error,
    )
    from .health import check_health
    from .server import RpcServer


__all__ = [
    "RpcServer",
    "connect",
    "check_health",
    "Principal",
    "TokenEntry",
    "TokenStore",
    "ROLES",
    "SERVICE_ROLE",
    "ANONYMOUS_ADMIN",
    "generate_token",
    "write_tokens_file",
    "current_principal",
    "current_method",
    "acting_as",
    "require_role",
    "requires",
    "ERROR_DETAILS_KEY",
    "status_for_error",
    "error_class_for_status",
    "error_from_rpc_error",
]
