"""Carry trace context in any string mapping (gRPC metadata, NATS/wire headers)."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["inject", "extract", "trace_id_hex"]

# W3C trace context only: the headers are small and every OTel SDK reads them
_PROPAGATOR = TraceContextTextMapPropagator()


def inject(carrier: MutableMapping[str, str], context: otel_context.Context | None = None) -> None:
    """Add ``traceparent`` (and ``tracestate``) for the current span, if any."""
    _PROPAGATOR.inject(carrier, context=context)


def extract(carrier: Mapping[str, str] | None) -> otel_context.Context:
    """The context a remote caller sent; an empty context when none was sent."""
    if not carrier:
        return otel_context.Context()
    # gRPC metadata keys arrive lower case; the propagator looks for "traceparent"
    return _PROPAGATOR.extract({k.lower(): v for k, v in carrier.items()})


def trace_id_hex(span: trace.Span | None = None) -> str:
    """The current (or given) span's trace id as 32 hex digits; '' if none."""
    ctx = (span or trace.get_current_span()).get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else ""
