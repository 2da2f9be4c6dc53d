"""The service runtime: what every Fire-Flyer service process does the same way.

A service is a class with a ``name``, a settings class and two coroutines::

    class EchoService(Service):
        name = "echo"
        async def start(self, ctx: ServiceContext) -> None:
            ctx.add_servicer(echo_pb2_grpc.add_EchoServiceServicer_to_server, Servicer(ctx), "ff.echo.v1.EchoService")
            await ctx.subscribe(subject, self.on_event, types=Published)

    if __name__ == "__main__":
        raise SystemExit(run_service(EchoService))

``run_service`` loads settings (file < FF_* env < ``--set``), configures logging
and tracing, installs uvloop, connects to NATS, starts the gRPC server (with
health and reflection) and, when ``metrics.port`` is set (``FF_METRICS_PORT``;
``ff up`` sets it), the Prometheus endpoint on the same host, and serves until
SIGTERM or SIGINT.  Every service has its own metrics registry,
``ctx.metrics`` (:class:`~fireflyer.telemetry.metrics.ServiceMetrics`), where
the gRPC interceptor counts every call and the service defines its own metrics.
Then, in order:

1. health goes NOT_SERVING and the server stops accepting new RPCs;
2. in-flight RPCs get ``grace_s`` seconds to finish, then are cancelled;
3. the service's own ``stop`` runs and its background tasks are cancelled;
4. NATS is drained (pending publishes flushed, subscriptions finish their
   current message);
5. the metrics endpoint closes, buffered spans are flushed; the process exits 0.

A second signal during shutdown skips the rest of the grace period.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .clock import SYSTEM_CLOCK, Clock
from .config import ServiceSettings
from .errors import FireFlyerError, SettingsError
from .ids import instance_name
from .log import configure_logging, get_logger
from .settings import add_settings_args, load_settings, overrides_from_args

if TYPE_CHECKING:
    from fireflyer.bus import Bus
    from fireflyer.rpc import RpcServer
    from fireflyer.telemetry.metrics import ServiceMetrics

__all__ = ["Service", "ServiceContext", "run_service", "serve", "parse_service_args"]

log = get_logger(__name__)


class ServiceContext:
    """What a service gets at start: settings, its RPC server, the bus, a clock, its metrics."""

    def __init__(self, *, name: str, instance: str, settings: ServiceSettings, server: RpcServer,
                 bus: Bus | None, clock: Clock = SYSTEM_CLOCK, metrics: ServiceMetrics | None = None) -> None:
        from fireflyer.telemetry.metrics import ServiceMetrics

        self.name = name
        self.instance = instance
        self.settings = settings
        self.server = server
        self.bus = bus
        self.clock = clock
        #: this service's Prometheus registry and helpers (served when metrics.port is set)
        self.metrics = metrics if metrics is not None else ServiceMetrics(name, instance)
        self.log = get_logger(f"services.{name}")
        self._tasks: set[asyncio.Task[Any]] = set()

    def add_servicer(self, add_fn: Callable[[Any, Any], None], servicer: Any, full_service_name: str) -> None:
        self.server.add_servicer(add_fn, servicer, full_service_name)

    def require_bus(self) -> Bus:
        if self.bus is None:
            raise SettingsError(f"service {self.name} needs NATS but nats.url is empty", key="nats.url")
        return self.bus

    async def subscribe(self, subject: str, handler: Callable[..., Awaitable[Any]], **kw: Any) -> Any:
        return await self.require_bus().subscribe(subject, handler, **kw)

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        """Run background work owned by the service; cancelled at shutdown, crashes logged."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.log.error("service.task_failed", task=task.get_name(), error=repr(exc))

    async def cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Service:
    """Base class of a service; override ``start`` (and ``stop`` if it holds resources)."""

    name: ClassVar[str] = "service"
    settings_type: ClassVar[type[ServiceSettings]] = ServiceSettings
    #: whether the service needs NATS (start fails clearly without it)
    uses_bus: ClassVar[bool] = True

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings

    async def start(self, ctx: ServiceContext) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    async def stop(self) -> None:
        return None


async def serve(service: Service, *, stop: asyncio.Event | None = None,
                ready: Callable[[ServiceContext], None] | None = None, install_signals: bool = True) -> None:
    """Run ``service`` until ``stop`` is set or SIGTERM/SIGINT arrives, then shut down in order."""
    from fireflyer.bus import Bus
    from fireflyer.rpc import RpcServer, TokenStore
    from fireflyer.telemetry import setup_tracing, shutdown_tracing, tracing_configured
    from fireflyer.telemetry.metrics import ServiceMetrics

    settings = service.settings
    name = service.name
    instance = settings.instance or instance_name(name)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()

    # in-process test clusters run several services in one process: the first
    # one to start owns the tracer provider and the others share it
    owns_tracing = not tracing_configured()
    setup_tracing(name, instance, state_dir=settings.state_dir, settings=settings.telemetry)
    tokens = None
    if settings.auth.enabled:
        if not settings.auth.tokens_file:
            raise SettingsError(
                "auth is enabled but no tokens file is set: set FF_AUTH_TOKENS_FILE (ff up writes "
                "<state_dir>/tokens.json) or disable auth with FF_AUTH_ENABLED=false for local experiments",
                key="auth.tokens_file", expected="path")
        # follows the file: users added or revoked (ff admin users) count within about a second
        tokens = TokenStore.watch(settings.auth.tokens_file, interval_s=settings.auth.reload_interval_s)

    bus: Bus | None = None
    if service.uses_bus and settings.nats.url:
        bus = await Bus.connect(settings.nats, name=instance, token=settings.token)
    metrics = ServiceMetrics(name, instance)
    metrics.bind_loop(loop)
    server = RpcServer(settings.rpc, service=name, tokens=tokens, auth_enabled=settings.auth.enabled,
                       metrics=metrics)
    ctx = ServiceContext(name=name, instance=instance, settings=settings, server=server, bus=bus, metrics=metrics)

    signals = (signal.SIGTERM, signal.SIGINT)
    hard_stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("service.second_signal", signal=signal.Signals(signum).name)
            hard_stop.set()
        else:
            log.info("service.signal", signal=signal.Signals(signum).name)
            stop.set()

    if install_signals:
        for s in signals:
            loop.add_signal_handler(s, on_signal, s)
    try:
        await service.start(ctx)
        port = await server.start()
        if settings.metrics.port is not None:
            # the gRPC host unless told otherwise: a scraper reaches the service where its clients do
            metrics.serve(settings.metrics.host or settings.rpc.host, settings.metrics.port)
        log.info("service.started", service=name, instance=instance, address=server.address, port=port,
                 nats=settings.nats.url if bus else None, loop=type(loop).__module__.split(".")[0],
                 metrics=metrics.url or None)
        if ready is not None:
            ready(ctx)
        await stop.wait()

        log.info("service.stopping", grace_s=settings.grace_s, inflight=server.inflight)
        stopping = asyncio.ensure_future(server.stop(settings.grace_s))
        hard = asyncio.ensure_future(hard_stop.wait())
        await asyncio.wait({stopping, hard}, return_when=asyncio.FIRST_COMPLETED)
        if not stopping.done():
            await server.stop(0)
            await stopping
        hard.cancel()
        await service.stop()
        await ctx.cancel_tasks()
        if bus is not None:
            await bus.drain()
        log.info("service.stopped", service=name, instance=instance)
    finally:
        if install_signals:
            for s in signals:
                loop.remove_signal_handler(s)
        if bus is not None and bus.is_connected:
            await bus.close()
        # (a thread: the HTTP server's shutdown waits for its poll loop, up to half a second)
        await asyncio.to_thread(metrics.close)
        if owns_tracing:
            shutdown_tracing()


def parse_service_args(service_cls: type[Service], argv: Sequence[str] | None) -> ServiceSettings:
    doc = (service_cls.__doc__ or "").strip()
    parser = argparse.ArgumentParser(prog=f"{service_cls.name}", description=doc.splitlines()[0] if doc else None)
    add_settings_args(parser)
    ns = parser.parse_args(argv)
    return load_settings(service_cls.settings_type, file=ns.config, overrides=overrides_from_args(ns))


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_service(service_cls: type[Service], argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m services.<name>``; returns the exit code."""
    try:
        settings = parse_service_args(service_cls, argv)
    except SettingsError as e:
        # before logging is configured: one plain line a person can act on
        print(f"{service_cls.name}: {e}", file=sys.stderr)
        return 2
    configure_logging(level=settings.log_level, fmt=settings.log_format, service=service_cls.name,
                      instance=settings.instance or instance_name(service_cls.name))
    try:
        with asyncio.Runner(loop_factory=_new_loop) as runner:
            runner.run(serve(service_cls(settings)))
    except SettingsError as e:
        log.error("service.bad_settings", error=str(e), key=e.fields.get("key"))
        print(f"{service_cls.name}: {e}", file=sys.stderr)
        return 2
    except FireFlyerError as e:
        log.error("service.failed", error=str(e), kind=e.kind, **{f"f_{k}": v for k, v in e.fields.items()})
        return 1
    except Exception:
        log.exception("service.crashed")
        return 1
    return 0
