"""Traces from span records: the summaries ``ff trace ls`` and the dashboard list, and the rows of a
waterfall (``ff trace show``, the dashboard's trace page).

Pure functions over :class:`~fireflyer.telemetry.spanfile.SpanRecord`: reading the span file and
drawing are the callers' business.  A span whose parent is not in the trace (its parent's process was
killed before it exported, or the parent was not sampled) is shown at the top level, marked as an
orphan, rather than dropped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import msgspec

from .spanfile import SpanRecord

__all__ = ["TraceSummary", "WaterfallRow", "group_traces", "summarize", "recent_traces", "waterfall",
           "find_trace", "started_by_a_user", "USER_ROOT_SERVICES"]

#: services whose spans start traces on a person's behalf: the ``ff`` CLI and a task's rank processes
#: (a scheduled task's own trace starts at the scheduler's ``task.submit``)
USER_ROOT_SERVICES = ("ff", "task")


class TraceSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One trace in a list: what ``ff trace ls --json`` prints per trace."""

    trace_id: str
    #: the earliest span without a parent (else the earliest span: the root was lost)
    root: str
    root_service: str
    services: tuple[str, ...]
    span_count: int
    start_ns: int
    end_ns: int
    errors: int

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9


class WaterfallRow(msgspec.Struct, frozen=True, kw_only=True):
    """One span in a waterfall: its depth under the trace's roots and its place on the time axis
    (``offset_s`` from the trace's start)."""

    span: SpanRecord
    depth: int
    offset_s: float
    duration_s: float
    #: its parent span is named but not in the trace
    orphan: bool = False


def group_traces(spans: Iterable[SpanRecord]) -> dict[str, list[SpanRecord]]:
    """Spans by trace id (each trace's spans in file order)."""
    out: dict[str, list[SpanRecord]] = defaultdict(list)
    for s in spans:
        out[s.trace_id].append(s)
    return dict(out)


def summarize(trace_id: str, spans: list[SpanRecord]) -> TraceSummary:
    roots = sorted((s for s in spans if not s.parent_span_id), key=lambda s: s.start_ns)
    # no true root: the trace's first span stands in (its parent was lost)
    top = roots[0] if roots else min(spans, key=lambda s: s.start_ns)
    return TraceSummary(
        trace_id=trace_id, root=top.name,
        root_service=top.service,
        services=tuple(sorted({s.service for s in spans if s.service})),
        span_count=len(spans), start_ns=min(s.start_ns for s in spans), end_ns=max(s.end_ns for s in spans),
        errors=sum(1 for s in spans if s.status == "ERROR"))


def started_by_a_user(summary: TraceSummary) -> bool:
    """A trace a person started (a task submission, an ``ff`` command, a rank's own calls), not one of
    the services' own loops (heartbeats, routing pulls, sweeps), which outnumber them by far."""
    return summary.root == "task.submit" or summary.root_service in USER_ROOT_SERVICES


def recent_traces(spans: Iterable[SpanRecord], *, limit: int = 20, min_spans: int = 1,
                  users_only: bool = False) -> list[TraceSummary]:
    """The ``limit`` most recently started traces (newest first) with at least ``min_spans`` spans
    (with ``users_only``, only those :func:`started_by_a_user`)."""
    sums = [summarize(t, ss) for t, ss in group_traces(spans).items() if len(ss) >= min_spans]
    if users_only:
        sums = [s for s in sums if started_by_a_user(s)]
    sums.sort(key=lambda s: s.start_ns, reverse=True)
    return sums[:limit] if limit > 0 else sums


def find_trace(spans: Iterable[SpanRecord], trace_id: str) -> list[SpanRecord]:
    """The spans of the trace whose id is ``trace_id`` or starts with it (at least 6 hex digits, like a
    short git hash); empty when none or the prefix is ambiguous."""
    want = trace_id.strip().lower()
    if len(want) < 6:
        return []
    groups: dict[str, list[SpanRecord]] = defaultdict(list)
    for s in spans:
        if s.trace_id.startswith(want):
            groups[s.trace_id].append(s)
    return next(iter(groups.values())) if len(groups) == 1 else []


def waterfall(spans: list[SpanRecord]) -> list[WaterfallRow]:
    """The spans of one trace in waterfall order: depth-first from the roots, siblings by start time.

    A span seen twice (a process exported it twice) is shown once; a cycle of parent links (which
    only a corrupt file could hold) cannot loop, since every span is visited once."""
    if not spans:
        return []
    by_id: dict[str, SpanRecord] = {}
    for s in spans:
        by_id.setdefault(s.span_id, s)
    children: dict[str, list[SpanRecord]] = defaultdict(list)
    tops: list[tuple[SpanRecord, bool]] = []
    for s in by_id.values():
        if s.parent_span_id and s.parent_span_id in by_id and s.parent_span_id != s.span_id:
            children[s.parent_span_id].append(s)
        else:
            tops.append((s, bool(s.parent_span_id)))
    t0 = min(s.start_ns for s in by_id.values())
    rows: list[WaterfallRow] = []
    seen: set[str] = set()

    def visit(s: SpanRecord, depth: int, orphan: bool) -> None:
        stack = [(s, depth, orphan)]
        while stack:
            span, d, orph = stack.pop()
            if span.span_id in seen:
                continue
            seen.add(span.span_id)
            rows.append(WaterfallRow(span=span, depth=d, offset_s=(span.start_ns - t0) / 1e9,
                                     duration_s=max(0, span.end_ns - span.start_ns) / 1e9, orphan=orph))
            kids = sorted(children.get(span.span_id, ()), key=lambda c: (c.start_ns, c.name))
            stack.extend((k, d + 1, False) for k in reversed(kids))

    for s, orphan in sorted(tops, key=lambda x: (x[1], x[0].start_ns)):
        visit(s, 0, orphan)
    return rows
