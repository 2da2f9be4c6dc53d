"""Which spans a Fire-Flyer process records.

Default (:func:`default_sampler`): parent-based, so a call inside a sampled
trace is always recorded (one trace from ``ff`` through gRPC and NATS stays
whole) and one inside an unsampled trace never is.  A span with no parent is
recorded, except a SERVER span, i.e. an RPC from a caller that does not trace
(a benchmark, grpcurl, a client without a tracer provider): those are recorded
at ``ratio`` (``OTEL_TRACES_SAMPLER_ARG``, default ``DEFAULT_UNTRACED_SERVER_RATIO``).
Recording every such call cost a busy meta server about a tenth of its CPU and
filled the span file with single-span traces; a sample still shows what the
service does.  ``OTEL_TRACES_SAMPLER`` (the OpenTelemetry variable: ``always_on``,
``parentbased_traceidratio``, ...) replaces this policy entirely.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from fireflyer.core.errors import SettingsError

__all__ = ["UntracedServerRatio", "default_sampler", "DEFAULT_UNTRACED_SERVER_RATIO"]

#: share of RPCs from non-tracing callers that get a (root) SERVER span
DEFAULT_UNTRACED_SERVER_RATIO = 0.1


class UntracedServerRatio(Sampler):
    """Root sampler: SERVER spans at ``ratio`` (by trace id), every other kind always."""

    def __init__(self, ratio: float) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"untraced server ratio must be in [0, 1], got {ratio}")
        self.ratio = ratio
        self._server = TraceIdRatioBased(ratio)

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None, trace_state: TraceState | None = None) -> SamplingResult:
        inner = self._server if kind is SpanKind.SERVER else ALWAYS_ON
        return inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"UntracedServerRatio{{{self.ratio}}}"


def default_sampler(environ: Mapping[str, str]) -> Sampler | None:
    """The sampler for a tracer provider; None when ``OTEL_TRACES_SAMPLER`` is set
    (the OpenTelemetry SDK then builds the one it names from the process environment)."""
    if environ.get("OTEL_TRACES_SAMPLER"):
        return None
    raw = environ.get("OTEL_TRACES_SAMPLER_ARG", "")
    try:
        ratio = float(raw) if raw else DEFAULT_UNTRACED_SERVER_RATIO
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise SettingsError(f"OTEL_TRACES_SAMPLER_ARG={raw!r}: expected a ratio in [0, 1]",
                            key="OTEL_TRACES_SAMPLER_ARG", expected="float in [0, 1]")
    return ParentBased(root=UntracedServerRatio(ratio))
