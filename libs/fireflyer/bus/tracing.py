"""Trace context in NATS headers, so one trace follows an event across processes.

The sender adds the W3C ``traceparent`` of its current span to the message
headers; the receiver runs the handler inside a CONSUMER span whose parent is
that context.  A message sent outside any span starts a new trace on receipt.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace

from fireflyer.telemetry import extract, inject, tracer

__all__ = ["outgoing_headers", "consumer_span"]

_TRACER = tracer("fireflyer.bus")


def outgoing_headers(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    """The caller's headers plus the current trace context (None if both are empty)."""
    out = dict(headers) if headers else {}
    inject(out)
    return out or None


@contextmanager
def consumer_span(subject: str, headers: Mapping[str, str] | None, operation: str) -> Iterator[trace.Span]:
    """A CONSUMER span for handling one message, parented on the sender's context."""
    with _TRACER.start_as_current_span(
        f"{operation} {subject}",
        context=extract(headers),
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "nats",
            "messaging.destination.name": subject,
            "messaging.operation": operation,
        },
        # handler errors are logged and counted by the bus; the span records them too
        record_exception=True,
        set_status_on_exception=True,
    ) as span:
        yield span
