"""A task's trace, carried into the processes the node agent starts.

The scheduler keeps the trace context of a task's submission with the task, sends it with every
StartTask (gRPC metadata, so the agent's StartTask span is its child), and the agent gives each rank
process (and its HFReduce worker) the W3C ``TRACEPARENT`` of its own span in the environment.  In
such a process, :func:`fireflyer.telemetry.setup_tracing` makes that context the *default parent*:
a span started with no current span (the first span of a thread, an RPC made from training code)
joins the task's trace instead of starting its own.  That works across threads, which a context
attached once at start-up would not: a new thread starts with an empty context.

``fireflyer.telemetry.setup.ensure_task_tracing`` sets tracing up in a rank process on first use of a fireflyer client
(gRPC channel, HFReduce communicator), only when ``TRACEPARENT`` says the task is traced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.util import types

from .propagation import extract

__all__ = ["TRACEPARENT_ENV", "TRACESTATE_ENV", "env_parent", "traceparent_env", "DefaultParentTracerProvider"]

#: the W3C trace context of the process's parent span (the name other OTel SDKs read too)
TRACEPARENT_ENV = "TRACEPARENT"
TRACESTATE_ENV = "TRACESTATE"


def env_parent(environ: Mapping[str, str]) -> otel_context.Context | None:
    """The parent context ``TRACEPARENT`` names; None when it is absent or malformed."""
    tp = environ.get(TRACEPARENT_ENV, "").strip()
    if not tp:
        return None
    carrier = {"traceparent": tp}
    if environ.get(TRACESTATE_ENV):
        carrier["tracestate"] = environ[TRACESTATE_ENV]
    ctx = extract(carrier)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def traceparent_env(context: otel_context.Context | None = None) -> dict[str, str]:
    """``{"TRACEPARENT": ...}`` for the current (or given) span; empty unless that span is sampled (a
    process under an unsampled parent would record nothing, so it need not set tracing up)."""
    from .propagation import inject

    if not trace.get_current_span(context).get_span_context().trace_flags.sampled:
        return {}
    carrier: dict[str, str] = {}
    inject(carrier, context)
    out = {}
    if "traceparent" in carrier:
        out[TRACEPARENT_ENV] = carrier["traceparent"]
        if carrier.get("tracestate"):
            out[TRACESTATE_ENV] = carrier["tracestate"]
    return out


class _DefaultParentTracer(trace.Tracer):
    """Delegates to the SDK tracer, with ``parent`` standing in for a missing current span."""

    def __init__(self, inner: trace.Tracer, parent: otel_context.Context) -> None:
        self._inner = inner
        self._parent = parent

    def _context(self, context: otel_context.Context | None) -> otel_context.Context | None:
        if trace.get_current_span(context).get_span_context().is_valid:
            return context
        return self._parent

    def start_span(self, name: str, context: otel_context.Context | None = None,
                   kind: trace.SpanKind = trace.SpanKind.INTERNAL, attributes: types.Attributes = None,
                   links: Sequence[trace.Link] | None = (), start_time: int | None = None,
                   record_exception: bool = True, set_status_on_exception: bool = True) -> trace.Span:
        return self._inner.start_span(name, self._context(context), kind, attributes, links, start_time,
                                      record_exception, set_status_on_exception)

    @contextlib.contextmanager  # type: ignore[override]
    def start_as_current_span(self, name: str, context: otel_context.Context | None = None,
                              kind: trace.SpanKind = trace.SpanKind.INTERNAL, attributes: types.Attributes = None,
                              links: Sequence[trace.Link] | None = (), start_time: int | None = None,
                              record_exception: bool = True, set_status_on_exception: bool = True,
                              end_on_exit: bool = True) -> Iterator[trace.Span]:
        span = self.start_span(name, context, kind, attributes, links, start_time, record_exception,
                               set_status_on_exception)
        with trace.use_span(span, end_on_exit=end_on_exit, record_exception=record_exception,
                            set_status_on_exception=set_status_on_exception) as s:
            yield s


class DefaultParentTracerProvider(TracerProvider):
    """A tracer provider whose root spans are children of ``default_parent`` (module doc)."""

    def __init__(self, *args: Any, default_parent: otel_context.Context, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.default_parent = default_parent

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _DefaultParentTracer(super().get_tracer(*args, **kwargs), self.default_parent)
