"""Tracer provider setup: span file by default, OTLP when the endpoint is set.

Each case runs in a fresh interpreter: OpenTelemetry allows one provider per process.
"""

import json
import subprocess
import sys

from fireflyer.telemetry import extract, inject, read_spans

SCRIPT = """
import json, sys
from opentelemetry import trace
from fireflyer.core.config import TelemetrySettings
from fireflyer.telemetry import setup_tracing, shutdown_tracing, tracer
p = setup_tracing("svc", "svc-7", state_dir=sys.argv[1], settings=TelemetrySettings(), batch=False)
exporter = p._active_span_processor._span_processors[0].span_exporter
if sys.argv[2] == "spans":  # exporting to a dead OTLP endpoint would retry for seconds
    with tracer("t").start_as_current_span("outer"):
        with tracer("t").start_as_current_span("inner"):
            pass
shutdown_tracing()
print(json.dumps({"exporter": type(exporter).__name__}))
"""


def _run(tmp_path, env_extra, spans=True):
    env = {"PATH": "/usr/bin:/bin", **env_extra}
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), "spans" if spans else "none"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_spans_go_to_the_state_dirs_span_file_by_default(tmp_path):
    assert _run(tmp_path, {})["exporter"] == "JsonLinesSpanExporter"
    spans = list(read_spans(tmp_path / "spans.jsonl"))
    assert [s.name for s in spans] == ["inner", "outer"]
    inner, outer = spans
    assert inner.trace_id == outer.trace_id and inner.parent_span_id == outer.span_id
    assert (outer.service, outer.instance) == ("svc", "svc-7")


def test_otlp_endpoint_selects_the_otlp_exporter(tmp_path):
    out = _run(tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, spans=False)
    assert out["exporter"] == "OTLPSpanExporter"
    assert not (tmp_path / "spans.jsonl").exists()


def test_inject_extract_round_trip_and_empty_carrier():
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    t = TracerProvider().get_tracer("x")
    with t.start_as_current_span("s") as span:
        carrier: dict[str, str] = {}
        inject(carrier)
    ctx = extract({k.upper(): v for k, v in carrier.items()})  # metadata keys may change case
    assert trace.get_current_span(ctx).get_span_context().trace_id == span.get_span_context().trace_id
    assert not trace.get_current_span(extract(None)).get_span_context().is_valid


def test_torn_last_line_is_skipped(tmp_path):
    f = tmp_path / "spans.jsonl"
    f.write_text('{"trace_id": "a"')
    assert list(read_spans(f)) == []
