"""The one way Fire-Flyer builds a gRPC server.

    server = RpcServer(settings.rpc, service="mgmtd", tokens=TokenStore.from_file(path))
    server.add_servicer(mgmtd_pb2_grpc.add_MgmtdServiceServicer_to_server, servicer, "ff.mgmtd.v1.MgmtdService")
    port = await server.start()          # health SERVING, reflection on
    ...
    await server.stop(grace_s=10)        # NOT_SERVING, refuse new calls, drain, cancel

Every server gets keepalive and message-size limits from :class:`RpcSettings`,
serves ``grpc.health.v1.Health`` and server reflection (both callable without
a token), and runs :class:`~fireflyer.rpc.interceptors.ServerInterceptor`
(tracing, auth, error mapping, the call log, and request metrics when given a
:class:`~fireflyer.telemetry.metrics.ServiceMetrics`), with every service served
through its generic handler (see :class:`_GenericHandlersOnly`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from fireflyer.core.config import RpcSettings
from fireflyer.core.errors import FailedPrecondition, SettingsError, Unavailable
from fireflyer.core.log import get_logger
from fireflyer.core.netaddr import dial_address
from fireflyer.telemetry.metrics import RpcServerMetrics, ServiceMetrics

from .auth import ANONYMOUS_ADMIN, Principal, TokenStore
from .interceptors import Inflight, ServerInterceptor
from .options import common_options

__all__ = ["RpcServer", "server_options"]

log = get_logger(__name__)
def server_options(settings: RpcSettings) -> list[tuple[str, int]]:
    """grpc core channel arguments for a server built from ``settings``."""
    return [
        *common_options(settings),
        # accept client keepalive pings at any rate: clients and servers may be
        # configured differently, and grpc's default answer to "too many pings"
        # is GOAWAY, which would cut every call on the connection
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
        ("grpc.http2.max_ping_strikes", 0),
        # Linux grpc sets SO_REUSEPORT by default, so a second server on a taken
        # port would silently share it; we want the bind to fail instead
        ("grpc.so_reuseport", 0),
    ]


class _GenericHandlersOnly:
    """The server as generated ``add_*_to_server`` functions see it: generic handlers only.

    Generated code registers each service twice, as a generic handler and as
    "registered methods".  grpc.aio keeps one pending request task per registered
    method and, for every call, waits on all of them with ``asyncio.wait``: with
    the ~20 methods of the meta service that wait was about a fifth of the
    server's CPU per call.  The generic handler serves the same methods through
    one request loop, and the interceptor caches the handler lookup per method.
    """

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: Any) -> None:
        pass  # the generic handler added with them serves the same methods

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class RpcServer:
    """A grpc.aio server with Fire-Flyer's interceptors, health and reflection."""

    def __init__(self, settings: RpcSettings, *, service: str, tokens: TokenStore | None = None,
                 auth_enabled: bool = True, metrics: ServiceMetrics | None = None) -> None:
        if auth_enabled and tokens is None:
            raise SettingsError(f"{service}: auth is enabled but no token store was given (set "
                                "FF_AUTH_TOKENS_FILE, or FF_AUTH_ENABLED=false for local experiments)",
                                key="auth.tokens_file", expected="path")
        self.settings = settings
        self.service = service
        self.tokens = tokens
        self.auth_enabled = auth_enabled
        self._servicers: list[tuple[Callable[[Any, Any], None], Any, str]] = []
        self._inflight = Inflight()
        #: request count, latency and in-flight gauge in the service's registry (None: not kept)
        self.metrics = RpcServerMetrics(metrics, inflight=lambda: self._inflight.count) if metrics is not None \
            else None
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self._port = 0
        self._stopping = False
        self._draining = False

    def add_servicer(self, add_fn: Callable[[Any, Any], None], servicer: Any, full_service_name: str) -> None:
        """Register a generated ``add_XServicer_to_server`` with its servicer (before :meth:`start`)."""
        if self._server is not None:
            raise FailedPrecondition(f"add_servicer({full_service_name}) after start: grpc fixes the "
                                     "services when the server starts", service=full_service_name)
        self._servicers.append((add_fn, servicer, full_service_name))

    @property
    def service_names(self) -> list[str]:
        return [name for _, _, name in self._servicers]

    async def start(self) -> int:
        """Bind ``host:port`` (0 picks a free port), start serving; returns the bound port."""
        if self._server is not None:
            raise FailedPrecondition(f"{self.service}: RpcServer.start called twice")
        # built here, not in __init__: grpc.aio binds the server to the running loop
        interceptor = ServerInterceptor(tokens=self.tokens, auth_enabled=self.auth_enabled,
                                        inflight=self._inflight, metrics=self.metrics)
        server = grpc.aio.server(interceptors=[interceptor], options=server_options(self.settings))
        target = _GenericHandlersOnly(server)
        for add_fn, servicer, _ in self._servicers:
            add_fn(servicer, target)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, target)
        # what reflection.enable_server_reflection does for an aio server (it type-checks the server)
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
            reflection.aio.ReflectionServicer([*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]),
            target)

        want = f"{self.settings.host}:{self.settings.port}"
        try:
            port = server.add_insecure_port(want)
        except RuntimeError as e:  # grpc raises RuntimeError when the bind fails
            port, cause = 0, e
        else:
            cause = None
        if not port:
            raise Unavailable(f"{self.service}: cannot listen on {want} (port in use or host not local?)",
                              address=want) from cause
        self._port = port
        self._server = server
        await server.start()
        for name in ["", *self.service_names]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.debug("rpc.server_started", service=self.service, address=self.address, services=self.service_names)
        return port

    @property
    def port(self) -> int:
        return self._port

    def principal_for(self, token: str) -> Principal | None:
        """Who ``token`` is by this server's rules (auth off: the anonymous admin; unknown: None;
        revoked or expired: Unauthenticated saying so), for a transport beside gRPC that
        authenticates once per connection (meta's wire endpoint)."""
        if not self.auth_enabled:
            return ANONYMOUS_ADMIN
        assert self.tokens is not None  # checked in __init__
        return self.tokens.authenticate(token)

    @property
    def address(self) -> str:
        """``host:port`` as clients should dial it (valid after :meth:`start`)."""
        return dial_address(self.settings.host, self._port)

    @property
    def inflight(self) -> int:
        """Calls being handled right now."""
        return self._inflight.count

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` has begun: new calls are refused from then on."""
        return self._stopping

    async def stop(self, grace_s: float | None) -> None:
        """Go NOT_SERVING, refuse new calls, let in-flight calls run ``grace_s``, then cancel them.

        Safe to call again (e.g. ``stop(0)`` on a second signal cuts the grace short).
        """
        if self._server is None:
            return
        if self._health is not None and not self._draining:
            self._draining = True
            # watchers (load balancers, `ff status --watch`) hear it before the port closes
            await self._health.enter_graceful_shutdown()
            log.debug("rpc.server_stopping", service=self.service, grace_s=grace_s, inflight=self.inflight)
        # set with no await between it and grpc's stop, whose first step (before
        # it suspends) closes the listener: once this reads True, new calls fail
        self._stopping = True
        await self._server.stop(grace_s)

    async def wait_for_termination(self, timeout_s: float | None = None) -> bool:
        """Wait until the server has stopped; False if ``timeout_s`` passed first."""
        if self._server is None:
            return True
        # grpc returns whether it *timed out*; we answer whether it terminated
        return not await self._server.wait_for_termination(timeout_s)
