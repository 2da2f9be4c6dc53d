"""Trace summaries and the waterfall (fireflyer.telemetry.traces, ff trace show's renderer), and the
default parent a task's process takes from TRACEPARENT (fireflyer.telemetry.taskctx)."""

from __future__ import annotations

import io

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console

from fireflyer.cli.trace import bar, render_waterfall
from fireflyer.telemetry.spanfile import SpanRecord
from fireflyer.telemetry.taskctx import DefaultParentTracerProvider, env_parent, traceparent_env
from fireflyer.telemetry.traces import find_trace, recent_traces, waterfall

T1 = "a" * 32
T2 = "b" * 32


def _span(sid: str, parent: str | None, name: str, start: float, end: float, service: str = "svc",
          trace_id: str = T1, status: str = "UNSET") -> SpanRecord:
    return SpanRecord(trace_id=trace_id, span_id=sid.ljust(16, "0"), parent_span_id=parent.ljust(16, "0") if parent else None,
                      name=name, kind="INTERNAL", start_ns=int(start * 1e9), end_ns=int(end * 1e9), status=status,
                      service=service, instance=f"{service}-0")


SPANS = [
    _span("3", "2", "node.start_rank", 1.2, 1.3, "node"),
    _span("1", None, "task.submit", 1.0, 1.1, "scheduler"),
    _span("2", "1", "scheduler.start_rank", 1.15, 1.4, "scheduler"),
    _span("5", "3", "ckpt.save", 1.5, 2.0, "task"),
    _span("4", "3", "hfreduce.allreduce", 1.35, 1.45, "task", status="ERROR"),
    _span("9", "8", "lost.child", 1.6, 1.7, "task"),  # its parent never arrived
    _span("1", None, "other", 5.0, 5.5, "ff", trace_id=T2),
]


def test_waterfall_orders_depth_first_with_siblings_by_start_and_orphans_last() -> None:
    rows = waterfall([s for s in SPANS if s.trace_id == T1])
    assert [(r.span.name, r.depth, r.orphan) for r in rows] == [
        ("task.submit", 0, False), ("scheduler.start_rank", 1, False), ("node.start_rank", 2, False),
        ("hfreduce.allreduce", 3, False), ("ckpt.save", 3, False), ("lost.child", 0, True)]
    assert abs(rows[0].offset_s) < 1e-9 and abs(rows[4].offset_s - 0.5) < 1e-6 and abs(rows[4].duration_s - 0.5) < 1e-6


def test_waterfall_shows_a_duplicate_span_once() -> None:
    rows = waterfall([SPANS[1], SPANS[1], SPANS[2]])
    assert [r.span.name for r in rows] == ["task.submit", "scheduler.start_rank"]


def test_recent_traces_newest_first_with_counts() -> None:
    sums = recent_traces(SPANS)
    assert [s.trace_id for s in sums] == [T2, T1]
    t1 = sums[1]
    assert (t1.root, t1.span_count, t1.services, t1.errors) == ("task.submit", 6, ("node", "scheduler", "task"), 1)
    assert abs(t1.duration_s - 1.0) < 1e-6
    assert recent_traces(SPANS, min_spans=2) == [t1]


def test_users_only_leaves_out_the_services_own_loops() -> None:
    T3 = "c" * 32
    spans = [*SPANS, _span("1", None, "ff.mgmtd.v1.MgmtdService/Heartbeat", 9.0, 9.1, "storage", trace_id=T3)]
    assert [s.trace_id for s in recent_traces(spans)] == [T3, T2, T1]
    assert [s.trace_id for s in recent_traces(spans, users_only=True)] == [T2, T1], \
        "a task submission and an ff command stay, a storage heartbeat goes"


def test_find_trace_by_prefix_needs_six_digits_and_one_match() -> None:
    assert len(find_trace(SPANS, "aaaaaa")) == 6
    assert find_trace(SPANS, "aaa") == []
    assert find_trace(SPANS, "cccccc") == []


def test_bar_places_and_sizes_spans_on_the_axis() -> None:
    assert bar(0.0, 1.0, 2.0, 10) == "█████     "
    assert bar(1.0, 1.0, 2.0, 10) == "     █████"
    assert bar(1.999, 0.0, 2.0, 10) == "         █"  # too short to see: still one cell
    assert bar(0.0, 0.0, 0.0, 4) == "█   "


def test_render_waterfall_indents_by_parent_and_draws_a_bar_per_span() -> None:
    rows = waterfall([s for s in SPANS if s.trace_id == T1])
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(render_waterfall(rows, bar_width=20))
    lines = out.getvalue().splitlines()
    assert "6 spans, 3 services, 1.00 s" in lines[0]
    body = {ln.strip().split()[0] if not ln.strip().startswith("↳") else ln.strip().split()[1]: ln for ln in lines[2:]}
    assert body["task.submit"].startswith("task.submit")
    assert body["scheduler.start_rank"].startswith("  ↳ scheduler.start_rank")
    assert body["ckpt.save"].startswith("      ↳ ckpt.save")
    assert "(parent missing)" in body["lost.child"]
    # ckpt.save runs from 0.5 s to 1.0 s of a 1 s trace: the right half of the 20-cell axis
    assert " " * 10 + "█" * 10 in body["ckpt.save"] and "500.0 ms" in body["ckpt.save"]
    assert all("█" in ln for ln in body.values())


def test_traceparent_env_is_the_default_parent_of_a_tasks_process() -> None:
    up = InMemorySpanExporter()
    # the agent's side: an ordinary provider (an empty default parent changes nothing)
    parent_provider = DefaultParentTracerProvider(default_parent=otel_context.Context())
    parent_provider.add_span_processor(SimpleSpanProcessor(up))
    with parent_provider.get_tracer("t").start_as_current_span("agent") as agent:
        env = traceparent_env()
    assert env["TRACEPARENT"].split("-")[1] == f"{agent.get_span_context().trace_id:032x}"

    exp = InMemorySpanExporter()
    ctx = env_parent(env)
    assert ctx is not None
    provider = DefaultParentTracerProvider(default_parent=ctx)
    provider.add_span_processor(SimpleSpanProcessor(exp))
    tr = provider.get_tracer("rank")
    with tr.start_as_current_span("rank.op") as op:
        with tr.start_as_current_span("rank.inner"):
            pass
    tr.start_span("rank.other").end()
    got = {s.name: s for s in exp.get_finished_spans()}
    trace_id = agent.get_span_context().trace_id
    assert all(s.context.trace_id == trace_id for s in got.values())
    assert got["rank.op"].parent.span_id == agent.get_span_context().span_id
    assert got["rank.other"].parent.span_id == agent.get_span_context().span_id
    assert got["rank.inner"].parent.span_id == op.get_span_context().span_id
    assert env_parent({"TRACEPARENT": "garbage"}) is None and env_parent({}) is None
