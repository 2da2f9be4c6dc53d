"""The default sampler: parent-based; RPCs from callers that do not trace are sampled at a ratio."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased
from opentelemetry.trace import SpanKind

from fireflyer.core.errors import SettingsError
from fireflyer.telemetry import DEFAULT_UNTRACED_SERVER_RATIO, default_sampler, extract, inject


def _provider(env: dict[str, str]) -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=default_sampler(env))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def test_default_is_parent_based_with_the_documented_ratio() -> None:
    sampler = default_sampler({})
    assert isinstance(sampler, ParentBased)
    assert str(DEFAULT_UNTRACED_SERVER_RATIO) in sampler.get_description()


def test_untraced_server_calls_follow_the_ratio_other_roots_are_recorded() -> None:
    tracer, exporter = _provider({"OTEL_TRACES_SAMPLER_ARG": "0"})
    with tracer.start_as_current_span("rpc", kind=SpanKind.SERVER) as span:
        assert not span.is_recording()
    with tracer.start_as_current_span("cli", kind=SpanKind.INTERNAL) as span:
        assert span.is_recording()
    with tracer.start_as_current_span("call", kind=SpanKind.CLIENT) as span:
        assert span.is_recording()
    assert sorted(s.name for s in exporter.get_finished_spans()) == ["call", "cli"]
    tracer, exporter = _provider({"OTEL_TRACES_SAMPLER_ARG": "1"})
    with tracer.start_as_current_span("rpc", kind=SpanKind.SERVER) as span:
        assert span.is_recording()


def test_a_traced_callers_decision_is_followed_both_ways() -> None:
    caller, _ = _provider({})
    server, exporter = _provider({"OTEL_TRACES_SAMPLER_ARG": "0"})
    with caller.start_as_current_span("client", kind=SpanKind.CLIENT) as parent:
        carrier: dict[str, str] = {}
        inject(carrier)
    with server.start_as_current_span("rpc", context=extract(carrier), kind=SpanKind.SERVER) as span:
        assert span.is_recording()  # ratio 0, but the caller's trace is sampled: one trace stays whole
        assert span.get_span_context().trace_id == parent.get_span_context().trace_id
    # a caller that sampled its trace out: the server does not record either
    unsampled = {"traceparent": carrier["traceparent"][:-2] + "00"}
    server1, _ = _provider({"OTEL_TRACES_SAMPLER_ARG": "1"})
    with server1.start_as_current_span("rpc", context=extract(unsampled), kind=SpanKind.SERVER) as span:
        assert not span.is_recording()
    assert [s.name for s in exporter.get_finished_spans()] == ["rpc"]


def test_otel_traces_sampler_takes_over() -> None:
    assert default_sampler({"OTEL_TRACES_SAMPLER": "always_on"}) is None


@pytest.mark.parametrize("raw", ["1.5", "-0.1", "often"])
def test_a_bad_ratio_fails_naming_the_variable(raw: str) -> None:
    with pytest.raises(SettingsError, match="OTEL_TRACES_SAMPLER_ARG"):
        default_sampler({"OTEL_TRACES_SAMPLER_ARG": raw})
