"""The tracer provider of a process: one per process, named for its service."""

from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

from fireflyer.core.config import TelemetrySettings
from fireflyer.core.log import get_logger

from .sampling import default_sampler
from .spanfile import JsonLinesSpanExporter
from .taskctx import TRACEPARENT_ENV, DefaultParentTracerProvider, env_parent

__all__ = ["setup_tracing", "shutdown_tracing", "tracer", "tracing_configured", "ensure_task_tracing"]

log = get_logger(__name__)
_lock = threading.Lock()
_provider: TracerProvider | None = None


def setup_tracing(
    service: str,
    instance: str,
    *,
    state_dir: str | os.PathLike[str] | None = None,
    settings: TelemetrySettings | None = None,
    env: dict[str, str] | None = None,
    batch: bool = True,
) -> TracerProvider | None:
    """Install this process's tracer provider (first call wins; later calls return it).

    Returns None when telemetry is disabled.  ``batch=False`` exports each span
    as it ends (tests and short CLI runs).  Which spans are recorded: see
    :mod:`fireflyer.telemetry.sampling` (parent-based; RPCs from callers that do
    not trace are sampled).  With ``TRACEPARENT`` in the environment (a task's process, started by a
    node agent) spans without a current parent are children of that context
    (:mod:`fireflyer.telemetry.taskctx`).
    """
    global _provider
    settings = settings or TelemetrySettings()
    environ = os.environ if env is None else env
    with _lock:
        if _provider is not None:
            return _provider
        if not settings.enabled:
            return None
        resource = Resource.create({"service.name": service, "service.instance.id": instance})
        # a process the node agent started for a traced task: its root spans join the task's trace
        parent = env_parent(environ)
        provider = (TracerProvider(resource=resource, sampler=default_sampler(environ)) if parent is None else
                    DefaultParentTracerProvider(resource=resource, sampler=default_sampler(environ),
                                                default_parent=parent))
        endpoint = settings.otlp_endpoint or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if endpoint:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=endpoint)
            where = endpoint
        else:
            span_file = settings.span_file or str(Path(state_dir or ".ff") / "spans.jsonl")
            exporter = JsonLinesSpanExporter(span_file)
            where = span_file
        provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _provider = provider
        log.debug("telemetry.started", exporter=type(exporter).__name__, to=where)
        return provider


def shutdown_tracing(timeout_s: float = 5.0) -> None:
    """Flush buffered spans and stop exporting (idempotent)."""
    global _provider
    with _lock:
        provider, _provider = _provider, None
    if provider is not None:
        provider.force_flush(int(timeout_s * 1000))
        provider.shutdown()


def tracing_configured() -> bool:
    """Whether this process already has its provider (in-process test services share one)."""
    return _provider is not None


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


_ensured = False


def ensure_task_tracing() -> bool:
    """In a traced task's process (``TRACEPARENT`` and ``FF_TASK_ID`` set by the node agent), set tracing
    up once, as service ``task`` (instance ``<task>/rank<r>:<pid>``), flushed at exit.  True when it is on.

    Cheap after the first call, so clients call it as they are created."""
    global _ensured
    if _ensured or tracing_configured():
        return tracing_configured()
    _ensured = True
    env = os.environ
    if not env.get(TRACEPARENT_ENV) or not env.get("FF_TASK_ID"):
        return False
    from fireflyer.core.config import TelemetrySettings

    instance = f"task{env['FF_TASK_ID']}/rank{env.get('FF_RANK', '?')}:{os.getpid()}"
    provider = setup_tracing("task", instance, state_dir=env.get("FF_STATE_DIR") or ".ff",
                             settings=TelemetrySettings(span_file=env.get("FF_TELEMETRY_SPAN_FILE") or None))
    if provider is None:
        return False
    atexit.register(shutdown_tracing)
    return True
