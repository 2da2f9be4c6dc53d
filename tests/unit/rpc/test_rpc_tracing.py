"""Trace context crosses a call: the server span is the client span's child."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from fireflyer.api.echo.v1 import echo_pb2, echo_pb2_grpc
from fireflyer.core.config import TelemetrySettings
from fireflyer.core.errors import NotFound
from fireflyer.rpc import RpcServer
from fireflyer.telemetry import JsonLinesSpanExporter, read_spans, setup_tracing, shutdown_tracing, tracer
from fireflyer.telemetry import tracing_configured as _configured
from fireflyer.testing.poll import wait_for

ADMIN_TOKEN = "admin-token-for-tests"  # as in conftest.py


@pytest.fixture
def span_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "spans.jsonl"
    owns = not _configured()
    provider = setup_tracing("rpc-test", "rpc-test-0", settings=TelemetrySettings(span_file=str(path)), batch=False)
    extra: JsonLinesSpanExporter | None = None
    current = trace.get_tracer_provider()
    if provider is None or current is not provider or not owns:
        # OpenTelemetry allows one global provider per process and an earlier
        # test may have installed it: export through that one to our file too
        assert isinstance(current, TracerProvider), "tracing is disabled in this process"
        extra = JsonLinesSpanExporter(path)
        current.add_span_processor(SimpleSpanProcessor(extra))
    yield path
    if extra is not None:
        extra.shutdown()  # its processor stays registered but writes nothing more
    if owns:
        shutdown_tracing()


async def test_client_and_server_spans_share_the_trace(span_file: Path, server: RpcServer, dial) -> None:
    stub = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=ADMIN_TOKEN))
    with tracer("test").start_as_current_span("test.root") as root:
        reply = await stub.Echo(echo_pb2.EchoRequest(text="traced"))
        with pytest.raises(NotFound):
            await stub.Fail(echo_pb2.FailRequest(kind="NotFound", message="gone"))
    trace_id = f"{root.get_span_context().trace_id:032x}"
    assert reply.trace_id == trace_id  # the handler ran inside the caller's trace

    def spans() -> dict[str, object]:
        found = {(s.kind, s.name): s for s in read_spans(span_file) if s.trace_id == trace_id}
        return found if len(found) >= 5 else {}

    found = await wait_for(spans, timeout_s=5, what="client, server and root spans in the span file")
    client = found[("CLIENT", "ff.echo.v1.EchoService/Echo")]
    srv = found[("SERVER", "ff.echo.v1.EchoService/Echo")]
    assert srv.parent_span_id == client.span_id
    assert client.parent_span_id == f"{root.get_span_context().span_id:016x}"
    assert srv.attributes["rpc.method"] == "Echo" and srv.attributes["rpc.service"] == "ff.echo.v1.EchoService"
    assert (client.status, srv.status) == ("UNSET", "UNSET")

    failed_client = found[("CLIENT", "ff.echo.v1.EchoService/Fail")]
    failed_server = found[("SERVER", "ff.echo.v1.EchoService/Fail")]
    assert failed_server.parent_span_id == failed_client.span_id
    assert (failed_client.status, failed_server.status) == ("ERROR", "ERROR")
    assert failed_server.attributes["rpc.grpc.status_code"] == 5  # NOT_FOUND
