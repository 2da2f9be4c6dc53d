"""The server interceptor's Prometheus metrics: calls by method and code, latency, in flight, all arities."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fireflyer.api.echo.v1 import echo_pb2, echo_pb2_grpc
from fireflyer.core.config import RpcSettings
from fireflyer.core.errors import NotFound, PermissionDenied
from fireflyer.rpc import RpcServer, TokenStore, check_health, current_principal, requires
from fireflyer.telemetry.metrics import ServiceMetrics
from fireflyer.testing.poll import wait_for

ADMIN_TOKEN = "admin-token-for-tests"  # as in conftest.py (its ``tokens`` fixture knows them)
USER_TOKEN = "user-token-for-tests"
ECHO = "ff.echo.v1.EchoService"
ECHO_M = f"{ECHO}/Echo"
STREAMS = "ff.test.v1.MetricStreams"


class EchoServicer(echo_pb2_grpc.EchoServiceServicer):
    async def Echo(self, request: echo_pb2.EchoRequest, context: Any) -> echo_pb2.EchoReply:
        if request.sleep_s > 0:
            await asyncio.sleep(request.sleep_s)
        return echo_pb2.EchoReply(text=request.text, user=current_principal().user)

    async def Fail(self, request: echo_pb2.FailRequest, context: Any) -> echo_pb2.FailReply:
        raise NotFound(request.message)

    @requires("admin")
    async def AdminPing(self, request: echo_pb2.AdminPingRequest, context: Any) -> echo_pb2.AdminPingReply:
        return echo_pb2.AdminPingReply(user=current_principal().user)


def _streams_handler() -> grpc.GenericRpcHandler:
    """One method per streaming arity over raw bytes; b"fail" ends a call NOT_FOUND."""

    @requires("admin")
    async def unary_stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
        for i in range(3):
            yield str(i).encode()
        if request == b"fail":
            raise NotFound("stream ran dry")

    async def stream_unary(requests: AsyncIterator[bytes], context: Any) -> bytes:
        return b",".join([r async for r in requests])

    async def stream_stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for r in requests:
            yield r.upper()

    return grpc.method_handlers_generic_handler(STREAMS, {
        "UnaryStream": grpc.unary_stream_rpc_method_handler(unary_stream),
        "StreamUnary": grpc.stream_unary_rpc_method_handler(stream_unary),
        "StreamStream": grpc.stream_stream_rpc_method_handler(stream_stream),
    })


async def _items(*items: bytes) -> AsyncIterator[bytes]:
    for i in items:
        yield i


def _value(m: ServiceMetrics, name: str, **labels: str) -> float:
    want = {**labels, "service": m.service}
    for f in text_string_to_metric_families(m.scrape()):
        for s in f.samples:
            if s.name == name and s.labels == want:
                return s.value
    return 0.0


@pytest.fixture
async def served(tokens: TokenStore, dial) -> AsyncIterator[tuple[ServiceMetrics, Any, Any, str]]:
    metrics = ServiceMetrics("echo-test", "echo-test-0")
    server = RpcServer(RpcSettings(host="127.0.0.1", port=0), service="echo-test", tokens=tokens, metrics=metrics)
    server.add_servicer(echo_pb2_grpc.add_EchoServiceServicer_to_server, EchoServicer(), ECHO)
    handler = _streams_handler()
    server.add_servicer(lambda _s, srv: srv.add_generic_rpc_handlers((handler,)), None, STREAMS)
    await server.start()
    try:
        yield metrics, dial(server.address, token=ADMIN_TOKEN), dial(server.address, token=USER_TOKEN), server.address
    finally:
        await server.stop(0)


async def test_unary_calls_counted_by_method_and_code_with_latency(served) -> None:
    m, admin, user, _ = served
    stub = echo_pb2_grpc.EchoServiceStub(admin)
    assert _value(m, "ff_rpc_server_requests_total", method=ECHO_M, code="OK") == 0
    for _ in range(3):
        await stub.Echo(echo_pb2.EchoRequest(text="hi"))
    await stub.Echo(echo_pb2.EchoRequest(text="slow", sleep_s=0.06))
    with pytest.raises(NotFound):
        await stub.Fail(echo_pb2.FailRequest(kind="NotFound", message="gone"))
    with pytest.raises(PermissionDenied):
        await echo_pb2_grpc.EchoServiceStub(user).AdminPing(echo_pb2.AdminPingRequest())

    assert _value(m, "ff_rpc_server_requests_total", method=ECHO_M, code="OK") == 4
    assert _value(m, "ff_rpc_server_requests_total", method=f"{ECHO}/Fail", code="NOT_FOUND") == 1
    assert _value(m, "ff_rpc_server_requests_total", method=f"{ECHO}/AdminPing", code="PERMISSION_DENIED") == 1
    assert _value(m, "ff_rpc_server_duration_seconds_count", method=ECHO_M) == 4
    # the slow call lands above 50 ms, the quick ones below
    assert _value(m, "ff_rpc_server_duration_seconds_bucket", method=ECHO_M, le="0.05") == 3
    assert _value(m, "ff_rpc_server_duration_seconds_bucket", method=ECHO_M, le="+Inf") == 4
    assert _value(m, "ff_rpc_server_duration_seconds_sum", method=ECHO_M) >= 0.06


async def test_inflight_gauge_follows_running_calls(served) -> None:
    m, admin, _, _ = served
    stub = echo_pb2_grpc.EchoServiceStub(admin)
    call = asyncio.ensure_future(stub.Echo(echo_pb2.EchoRequest(text="wait", sleep_s=0.5)))
    await wait_for(lambda: _value(m, "ff_rpc_server_inflight") == 1, timeout_s=5, what="one call in flight")
    await call
    assert _value(m, "ff_rpc_server_inflight") == 0


async def test_streaming_arities_counted_once_each_with_their_code(served) -> None:
    m, admin, user, _ = served
    got = [r async for r in admin.unary_stream(f"/{STREAMS}/UnaryStream")(b"ok")]
    assert len(got) == 3
    with pytest.raises(NotFound):
        _ = [r async for r in admin.unary_stream(f"/{STREAMS}/UnaryStream")(b"fail")]
    assert await admin.stream_unary(f"/{STREAMS}/StreamUnary")(_items(b"a", b"b")) == b"a,b"
    out = [r async for r in admin.stream_stream(f"/{STREAMS}/StreamStream")(_items(b"x", b"y"))]
    assert out == [b"X", b"Y"]
    with pytest.raises(PermissionDenied):  # refused by the role check of the stream
        _ = [r async for r in user.unary_stream(f"/{STREAMS}/UnaryStream")(b"ok")]

    us = f"{STREAMS}/UnaryStream"
    assert _value(m, "ff_rpc_server_requests_total", method=us, code="OK") == 1
    assert _value(m, "ff_rpc_server_requests_total", method=us, code="NOT_FOUND") == 1
    assert _value(m, "ff_rpc_server_requests_total", method=us, code="PERMISSION_DENIED") == 1
    assert _value(m, "ff_rpc_server_requests_total", method=f"{STREAMS}/StreamUnary", code="OK") == 1
    assert _value(m, "ff_rpc_server_requests_total", method=f"{STREAMS}/StreamStream", code="OK") == 1
    assert _value(m, "ff_rpc_server_duration_seconds_count", method=us) == 3


async def test_health_checks_are_counted_too(served) -> None:
    m, _, _, address = served
    check = "grpc.health.v1.Health/Check"
    assert _value(m, "ff_rpc_server_requests_total", method=check, code="OK") == 0
    assert await check_health(address, timeout_s=5) == "SERVING"
    assert _value(m, "ff_rpc_server_requests_total", method=check, code="OK") == 1
