"""OpenTelemetry for every Fire-Flyer process.

    setup_tracing("mgmtd", "mgmtd-0", state_dir=".ff")   # once, at start-up
    with tracer(__name__).start_as_current_span("op"): ...
    inject(headers)            # before sending: gRPC metadata, NATS headers, wire headers
    ctx = extract(headers)     # on receipt: parent context for the handler span
    shutdown_tracing()         # at exit: flushes what is buffered

Export goes to OTLP/gRPC when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the
``telemetry.otlp_endpoint`` setting) is set, and otherwise to a JSON-lines span
file (``<state_dir>/spans.jsonl`` unless ``telemetry.span_file`` says otherwise)
that ``ff`` and tests read back.  Trace context travels as W3C ``traceparent``.  Sampling is parent-based; RPCs
from callers that do not trace are recorded at a ratio (``sampling.py``).
"""

from .propagation import extract, inject, trace_id_hex
from .sampling import DEFAULT_UNTRACED_SERVER_RATIO, UntracedServerRatio, default_sampler
from .setup import ensure_task_tracing, setup_tracing, shutdown_tracing, tracer, tracing_configured
from .spanfile import JsonLinesSpanExporter, read_spans
from .taskctx import TRACEPARENT_ENV, env_parent, traceparent_env

__all__ = [
    "setup_tracing",
    "shutdown_tracing",
    "tracer",
    "tracing_configured",
    "inject",
    "extract",
    "trace_id_hex",
    "JsonLinesSpanExporter",
    "read_spans",
    "default_sampler",
    "UntracedServerRatio",
    "DEFAULT_UNTRACED_SERVER_RATIO",
    "TRACEPARENT_ENV",
    "ensure_task_tracing",
    "env_parent",
    "traceparent_env",
]
