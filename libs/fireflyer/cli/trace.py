"""``ff trace ls`` / ``ff trace show ID``: the traces of the local cluster, from its span file.

    ff trace ls [--limit N] [--all] [--json]
                                        recent traces a person started (task submissions, ff commands,
                                        a rank's calls); --all: the services' own loops too
    ff trace show ID                    a waterfall: one row per span, indented under its parent,
                                        a bar on the trace's time axis, service and duration

The span file is ``<state>/spans.jsonl`` (``--spans FILE`` for another).  A cluster that exports
OTLP (``OTEL_EXPORTER_OTLP_ENDPOINT``) writes no span file: read those traces in the collector.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fireflyer.core.errors import NotFound

__all__ = ["register", "render_waterfall", "render_list"]

#: the bar column's width when the terminal's is unknown
BAR_WIDTH = 40
_SERVICE_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")


def _fmt_duration(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def _fmt_start(ns: int) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


def bar(offset_s: float, duration_s: float, total_s: float, width: int) -> str:
    """A span's bar on a ``width``-cell time axis of ``total_s``: spaces up to its start, then at least
    one block (a span too short to see still shows where it happened)."""
    if total_s <= 0:
        return "█".ljust(width)
    start = min(width - 1, int(offset_s / total_s * width))
    cells = max(1, round(duration_s / total_s * width))
    cells = min(cells, width - start)
    return (" " * start + "█" * cells).ljust(width)


def render_waterfall(rows: Sequence[Any], *, bar_width: int = BAR_WIDTH) -> Any:
    """A rich Table of :class:`~fireflyer.telemetry.traces.WaterfallRow`: span (indented by depth),
    service, a bar on the time axis, duration."""
    from rich.table import Table
    from rich.text import Text

    total = max((r.offset_s + r.duration_s for r in rows), default=0.0)
    services = sorted({r.span.service for r in rows})
    style = {s: _SERVICE_STYLES[i % len(_SERVICE_STYLES)] for i, s in enumerate(services)}
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold",
                  title=f"{len(rows)} spans, {len(services)} services, {_fmt_duration(total)}", title_justify="left")
    table.add_column("span", no_wrap=True)
    table.add_column("service", no_wrap=True)
    table.add_column(f"0 … {_fmt_duration(total)}", no_wrap=True, min_width=bar_width)
    table.add_column("duration", justify="right", no_wrap=True)
    for r in rows:
        name = Text("  " * r.depth + ("↳ " if r.depth else "") + r.span.name)
        if r.orphan:
            name.append(" (parent missing)", style="dim")
        if r.span.status == "ERROR":
            name.stylize("bold red")
        svc = style.get(r.span.service, "white")
        table.add_row(name, Text(r.span.service, style=svc),
                      Text(bar(r.offset_s, r.duration_s, total, bar_width), style=svc),
                      _fmt_duration(r.duration_s))
    return table


def render_list(summaries: Sequence[Any]) -> Any:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("trace", "root span", "services", "spans", "duration", "start"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("services", "spans", "duration") else "left")
    for s in summaries:
        table.add_row(s.trace_id[:16], s.root, str(len(s.services)), str(s.span_count),
                      _fmt_duration(s.duration_s), _fmt_start(s.start_ns))
    return table


def _spans_path(ns: argparse.Namespace) -> Path:
    from fireflyer.cli.cluster_cmds import resolve_state_dir
    from fireflyer.cluster.records import StatePaths

    return Path(ns.spans) if ns.spans else StatePaths(resolve_state_dir(ns.state_dir)).spans


def _console() -> Any:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 160)


def _ls(ns: argparse.Namespace) -> int:
    from fireflyer.telemetry import read_spans
    from fireflyer.telemetry.traces import recent_traces

    sums = recent_traces(read_spans(_spans_path(ns)), limit=ns.limit, min_spans=ns.min_spans,
                         users_only=not ns.all)
    if ns.json:
        for s in sums:
            print(json.dumps({"trace_id": s.trace_id, "root": s.root, "root_service": s.root_service,
                              "services": list(s.services), "service_count": len(s.services),
                              "span_count": s.span_count, "duration_s": round(s.duration_s, 6),
                              "start": s.start_ns / 1e9, "errors": s.errors}))
        return 0
    if not sums:
        print(f"no traces in {_spans_path(ns)}" + ("" if ns.all else " started by a user (--all: the services' own too)"))
        return 0
    _console().print(render_list(sums))
    return 0


def _show(ns: argparse.Namespace) -> int:
    from fireflyer.telemetry import read_spans
    from fireflyer.telemetry.traces import find_trace, waterfall

    path = _spans_path(ns)
    spans = find_trace(read_spans(path), ns.trace_id)
    if not spans:
        raise NotFound(f"no trace {ns.trace_id!r} in {path} (give at least 6 hex digits of an id "
                       "`ff trace ls` shows)", trace=ns.trace_id)
    console = _console()
    console.print(f"trace {spans[0].trace_id}")
    width = max(20, min(80, (console.width or 120) - 70))
    console.print(render_waterfall(waterfall(spans), bar_width=width))
    return 0


def register(sub: Any) -> None:
    from fireflyer.cli.options import add_state_dir

    p = sub.add_parser("trace", help="list the local cluster's traces, show one as a waterfall")
    tsub = p.add_subparsers(dest="trace_cmd", required=True)
    ls = tsub.add_parser("ls", help="recent traces: root span, services, spans, duration, start")
    add_state_dir(ls)
    ls.add_argument("--spans", default=None, metavar="FILE", help="span file (default <state>/spans.jsonl)")
    ls.add_argument("--limit", type=int, default=20, help="at most this many traces (newest first; 0: all)")
    ls.add_argument("--min-spans", type=int, default=1, help="only traces with at least this many spans")
    ls.add_argument("--all", action="store_true",
                    help="also the services' own traces (heartbeats, routing pulls, sweeps)")
    ls.add_argument("--json", action="store_true", help="one JSON object per trace")
    ls.set_defaults(func=_ls)
    show = tsub.add_parser("show", help="one trace as a waterfall")
    add_state_dir(show)
    show.add_argument("--spans", default=None, metavar="FILE", help="span file (default <state>/spans.jsonl)")
    show.add_argument("trace_id", metavar="ID", help="trace id (or its first 6+ hex digits)")
    show.set_defaults(func=_show)
