"""Prometheus metrics of a service process, with the standard ``prometheus_client`` library.

    metrics = ServiceMetrics("storage", "storage-0")
    written = metrics.counter("storage_write_bytes", "Bytes written to chunks", ("op",))
    written.labels(op="write").inc(n)
    metrics.on_scrape(lambda: targets.set(len(node.targets)))   # sampled on the event loop
    metrics.serve("127.0.0.1", 0)                                 # GET http://host:port/metrics

Each service gets its own :class:`ServiceMetrics` from the runtime
(``ServiceContext.metrics``): its own ``CollectorRegistry``, never the library's
global one, so the several services a test runs in one process do not collide.
Every metric name starts with ``ff_``; every sample is exported with a
``service`` label (added at scrape time, so the code that counts never passes
it).  The runtime serves the registry over HTTP when ``FF_METRICS_PORT`` is
set (``ff up`` gives every process a port and records the address in
cluster.json; ``ff metrics`` lists them); see docs/metrics.md.

Gauges of state that lives on the service's event loop (queue depth, targets by
state) are best filled by an :meth:`ServiceMetrics.on_scrape` hook: the hook
runs *on the loop* (the HTTP server answers from its own thread) right before
each scrape, so the hot path pays nothing and no loop-owned dict is read from
another thread.

:func:`health_incident` is the hook the health service counts its incidents
with (``ff_health_incidents_total{kind}``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from fireflyer.core.errors import FailedPrecondition, Unavailable
from fireflyer.core.log import get_logger
from fireflyer.core.netaddr import dial_address

__all__ = ["ServiceMetrics", "RpcServerMetrics", "MethodMetrics", "health_incident", "PREFIX",
           "RPC_LATENCY_BUCKETS", "SCRAPE_HOOK_TIMEOUT_S", "families"]

log = get_logger(__name__)

PREFIX = "ff_"
#: seconds; from half a millisecond (a cached meta lookup) to 30 s (the default deadline)
RPC_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: how long a scrape waits for the on-scrape hooks on a busy loop before it answers with the last values
SCRAPE_HOOK_TIMEOUT_S = 1.0

M = TypeVar("M", bound=MetricWrapperBase)


def _full_name(name: str) -> str:
    return name if name.startswith(PREFIX) else PREFIX + name


class _WithServiceLabel(Collector):
    """What the HTTP endpoint serves: the service's registry, each sample labelled ``service``,
    after the on-scrape hooks ran."""

    def __init__(self, owner: ServiceMetrics) -> None:
        self._owner = owner

    def collect(self) -> Iterable[Metric]:
        self._owner.run_scrape_hooks()
        extra = {"service": self._owner.service}
        for fam in self._owner.registry.collect():
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            out.samples = [s._replace(labels={**s.labels, **extra}) for s in fam.samples]
            yield out


class ServiceMetrics:
    """The metrics of one service instance: a registry, metric helpers, scrape hooks, an HTTP endpoint."""

    def __init__(self, service: str, instance: str = "", *, process: bool = True) -> None:
        self.service = service
        self.instance = instance or service
        #: where this service's metrics are defined (not the library's global registry)
        self.registry = CollectorRegistry(auto_describe=True)
        #: what is served: ``registry`` with the ``service`` label (see :meth:`scrape`)
        self.exposed = CollectorRegistry(auto_describe=False)
        self.exposed.register(_WithServiceLabel(self))
        self._defined: dict[str, tuple[type[Any], tuple[str, ...], MetricWrapperBase]] = {}
        self._define_lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._httpd: Any = None
        self._thread: threading.Thread | None = None
        self.address = ""
        Info("ff_service", "The service instance behind these metrics", registry=self.registry).info(
            {"instance": self.instance})
        if process:
            # cpu, memory, open fds of the process (several services of one test process report it alike)
            ProcessCollector(namespace="ff", registry=self.registry)

    # ------------------------------------------------------------------ definitions

    def _define(self, cls: type[M], name: str, doc: str, labels: Sequence[str], **kw: Any) -> M:
        full = _full_name(name)
        labels = tuple(labels)
        with self._define_lock:
            found = self._defined.get(full)
            if found is not None:
                kind, have, metric = found
                if kind is not cls or have != labels:
                    raise FailedPrecondition(
                        f"metric {full} is already defined as a {kind.__name__} with labels {list(have)}; "
                        f"cannot define it again as a {cls.__name__} with labels {list(labels)}",
                        metric=full)
                return metric  # type: ignore[return-value]
            if "service" in labels:
                raise FailedPrecondition(f"metric {full}: the label 'service' is added to every sample",
                                         metric=full)
            metric = cls(full, doc, labelnames=labels, registry=self.registry, **kw)
            self._defined[full] = (cls, labels, metric)
            return metric

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        """A counter ``ff_<name>_total`` (defining it twice alike returns the first)."""
        return self._define(Counter, name, doc, labels)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        """A gauge ``ff_<name>`` (defining it twice alike returns the first)."""
        return self._define(Gauge, name, doc, labels)

    def histogram(self, name: str, doc: str, labels: Sequence[str] = (),
                  buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS) -> Histogram:
        """A histogram ``ff_<name>_bucket/_sum/_count`` (defining it twice alike returns the first)."""
        return self._define(Histogram, name, doc, labels, buckets=tuple(buckets))

    # ------------------------------------------------------------------ scrape hooks

    def on_scrape(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` before each scrape, on the service's event loop (see the module doc)."""
        self._hooks.append(hook)

    def bind_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """The loop the hooks run on (the runtime binds the service's)."""
        self._loop = loop

    def _call_hooks(self) -> None:
        for hook in list(self._hooks):
            try:
                hook()
            except Exception as e:  # noqa: BLE001 - a broken gauge must not break the scrape
                log.warning("metrics.hook_failed", service=self.service, hook=getattr(hook, "__qualname__", "?"),
                            error=repr(e))

    def run_scrape_hooks(self) -> None:
        """Run the hooks now: directly on the loop's own thread, else handed to the loop and
        waited for (at most :data:`SCRAPE_HOOK_TIMEOUT_S`: a blocked loop gets the last values)."""
        if not self._hooks:
            return
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running() or _running_loop() is loop:
            self._call_hooks()
            return
        done = threading.Event()

        def run() -> None:
            try:
                self._call_hooks()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # closed between the check and the call
            self._call_hooks()
            return
        if not done.wait(SCRAPE_HOOK_TIMEOUT_S):
            log.warning("metrics.hooks_slow", service=self.service, timeout_s=SCRAPE_HOOK_TIMEOUT_S)

    # ------------------------------------------------------------------ exposition

    def scrape(self) -> str:
        """The text exposition the endpoint serves (hooks run first)."""
        return generate_latest(self.exposed).decode()

    def serve(self, host: str, port: int) -> str:
        """Serve ``GET /metrics`` on ``host:port`` (0: a free port) from a daemon thread; returns
        ``host:port`` as a client dials it."""
        from prometheus_client import start_http_server

        if self._httpd is not None:
            raise FailedPrecondition(f"{self.service}: metrics are already served at {self.address}")
        try:
            self._httpd, self._thread = start_http_server(port, addr=host, registry=self.exposed)
        except OSError as e:
            raise Unavailable(f"{self.service}: cannot serve metrics on {dial_address(host, port)}: {e} "
                              "(set FF_METRICS_PORT to a free port, or 0 for any)",
                              address=dial_address(host, port)) from e
        self.address = dial_address(host, int(self._httpd.server_port))
        return self.address

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics" if self.address else ""

    def close(self) -> None:
        """Stop serving (idempotent; blocks up to the server's half-second poll)."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# ---------------------------------------------------------------- gRPC server


class MethodMetrics:
    """The metric children of one gRPC method, resolved once (the per-call path only adds)."""

    __slots__ = ("_requests", "_method", "_by_code", "_latency")

    def __init__(self, requests: Counter, latency: Histogram, method: str) -> None:
        self._requests = requests
        self._method = method
        self._by_code: dict[str, Any] = {}
        self._latency = latency.labels(method=method)

    def observe(self, code: str, seconds: float) -> None:
        """One finished call: its status code name (``OK``, ``NOT_FOUND``...) and its duration."""
        child = self._by_code.get(code)
        if child is None:
            child = self._by_code[code] = self._requests.labels(method=self._method, code=code)
        child.inc()
        self._latency.observe(seconds)


class RpcServerMetrics:
    """``ff_rpc_server_requests_total{method,code}``, ``ff_rpc_server_duration_seconds{method}``
    and ``ff_rpc_server_inflight`` of one server (the interceptor feeds them)."""

    def __init__(self, metrics: ServiceMetrics, inflight: Callable[[], float] | None = None) -> None:
        self.requests = metrics.counter("rpc_server_requests", "gRPC calls finished, by method and status code",
                                        ("method", "code"))
        self.latency = metrics.histogram("rpc_server_duration_seconds",
                                         "gRPC call duration on the server (handler start to end), by method",
                                         ("method",), buckets=RPC_LATENCY_BUCKETS)
        if inflight is not None:
            metrics.gauge("rpc_server_inflight", "gRPC calls being handled now").set_function(inflight)

    def for_method(self, method: str) -> MethodMetrics:
        """``method`` as ``/package.Service/Method``; labelled ``package.Service/Method``."""
        return MethodMetrics(self.requests, self.latency, method.lstrip("/"))


# ---------------------------------------------------------------- health


def health_incident(metrics: ServiceMetrics, kind: str, count: int = 1) -> None:
    """Count ``count`` health incidents of ``kind`` (``ff_health_incidents_total{kind}``).

    The health service calls this for every incident it raises (a failed check, an XID, a
    straggler...); ``kind`` should be a short fixed word (it is a label: no ids in it).
    """
    metrics.counter("health_incidents", "Health incidents raised, by kind", ("kind",)).labels(kind=kind).inc(count)


def families(text: str) -> Iterator[Any]:
    """Parse an exposition (tests and ``ff metrics --scrape``)."""
    from prometheus_client.parser import text_string_to_metric_families

    return text_string_to_metric_families(text)
