"""A span exporter that appends finished spans to a JSON-lines file.

Several processes of a local cluster share one file: each export is a single
``os.write`` on an ``O_APPEND`` descriptor, so lines from different processes
never interleave mid-line.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["JsonLinesSpanExporter", "SpanRecord", "read_spans"]


class SpanRecord(msgspec.Struct, frozen=True, kw_only=True):
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status: str
    service: str
    instance: str
    attributes: dict[str, Any] = {}


_encoder = msgspec.json.Encoder(enc_hook=str)


def _record(span: ReadableSpan) -> SpanRecord:
    ctx = span.get_span_context()
    parent = span.parent
    res = span.resource.attributes if span.resource else {}
    return SpanRecord(
        trace_id=f"{ctx.trace_id:032x}",
        span_id=f"{ctx.span_id:016x}",
        parent_span_id=f"{parent.span_id:016x}" if parent else None,
        name=span.name,
        kind=span.kind.name,
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        status=span.status.status_code.name,
        service=str(res.get("service.name", "")),
        instance=str(res.get("service.instance.id", "")),
        attributes={k: (v if isinstance(v, str | int | float | bool) else list(v)) for k, v in (span.attributes or {}).items()},
    )


class JsonLinesSpanExporter(SpanExporter):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = b"".join(_encoder.encode(_record(s)) + b"\n" for s in spans)
        with self._lock:
            if self._fd < 0:
                return SpanExportResult.FAILURE
            os.write(self._fd, data)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def read_spans(path: str | os.PathLike[str]) -> Iterator[SpanRecord]:
    """Read a span file back; a torn last line (a process killed mid-write) is skipped."""
    p = Path(path)
    if not p.exists():
        return
    dec = msgspec.json.Decoder(SpanRecord)
    for line in p.read_bytes().splitlines():
        if line.strip():
            try:
                yield dec.decode(line)
            except msgspec.DecodeError:
                continue
