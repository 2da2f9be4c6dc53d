"""Structured logging: one line per event.

    log = get_logger(__name__)
    log.info("rpc.finished", method="/ff.echo.v1.EchoService/Echo", ms=1.7)

prints one JSON object per line (``ts``, ``level``, ``logger``, ``event``, the
service and instance set by :func:`configure_logging`, the current trace and
span ids when a span is active, then the fields).  ``fmt="text"`` prints the
same event as ``key=value`` pairs for terminals.  It sits on the standard
``logging`` module so third-party loggers (grpc, nats) come out the same way.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

import msgspec

__all__ = ["get_logger", "configure_logging", "EventLogger"]

_encoder = msgspec.json.Encoder(enc_hook=str)
_context: dict[str, str] = {}


def _trace_ids() -> tuple[str, str] | None:
    try:
        from opentelemetry import trace
    except ImportError:  # pragma: no cover - opentelemetry is a dependency
        return None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "ff_event", None) or record.getMessage(),
        }
        out.update(_context)
        ids = _trace_ids()
        if ids:
            out["trace_id"], out["span_id"] = ids
        out.update(getattr(record, "ff_fields", {}))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return _encoder.encode(out).decode()


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%H:%M:%S", time.localtime(record.created))
        event = getattr(record, "ff_event", None) or record.getMessage()
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, "ff_fields", {}).items())
        line = f"{ts} {record.levelname.lower():7} {record.name}: {event} {fields}".rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class EventLogger:
    """A logger whose calls are ``event name`` plus keyword fields."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, event: str, exc_info: Any = None, **fields: Any) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, exc_info=exc_info, extra={"ff_event": event, "ff_fields": fields})

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, exc_info=True, **fields)

    def is_enabled(self, level: int) -> bool:
        return self._logger.isEnabledFor(level)


def get_logger(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(name))


def configure_logging(
    *,
    level: str = "info",
    fmt: str = "json",
    service: str | None = None,
    instance: str | None = None,
    stream: TextIO | None = None,
) -> None:
    """Install one handler on the root logger (idempotent: replaces ours)."""
    _context.clear()
    if service:
        _context["service"] = service
    if instance:
        _context["instance"] = instance
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_ff_handler", False):
            root.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._ff_handler = True  # type: ignore[attr-defined]
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _TextFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    # grpc and asyncio are chatty at debug; keep them at warning unless asked
    for noisy in ("grpc", "asyncio", "nats"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
