"""RpcServer and connect() against real grpc.aio servers: limits, shutdown, health, streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from fireflyer.api.echo.v1 import echo_pb2, echo_pb2_grpc
from fireflyer.core.config import RpcSettings
from fireflyer.core.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from fireflyer.rpc import RpcServer, check_health, current_principal, requires
from fireflyer.testing.poll import wait_for

ADMIN_TOKEN = "admin-token-for-tests"  # as in conftest.py
USER_TOKEN = "user-token-for-tests"


async def test_default_deadline_applies_when_caller_sets_none(server: RpcServer, dial) -> None:
    channel = dial(server.address, token=ADMIN_TOKEN, settings=RpcSettings(default_deadline_s=0.2))
    stub = echo_pb2_grpc.EchoServiceStub(channel)
    with pytest.raises(DeadlineExceeded) as info:
        await stub.Echo(echo_pb2.EchoRequest(text="slow", sleep_s=5))
    assert info.value.fields["method"] == "/ff.echo.v1.EchoService/Echo"
    assert info.value.fields["target"] == server.address
    # an explicit timeout wins over the default
    reply = await stub.Echo(echo_pb2.EchoRequest(text="ok", sleep_s=0.3), timeout=5)
    assert reply.text == "ok"


async def test_oversize_request_is_resource_exhausted(serve, dial) -> None:
    server, servicer = await serve(settings=RpcSettings(port=0, max_message_mb=1))
    stub = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=ADMIN_TOKEN))
    with pytest.raises(ResourceExhausted):
        await stub.Echo(echo_pb2.EchoRequest(text="x" * (2 * 1024 * 1024)))
    assert servicer.finished == 0
    assert (await stub.Echo(echo_pb2.EchoRequest(text="x" * 1000))).text == "x" * 1000


async def test_graceful_stop_finishes_inflight_and_refuses_new(server: RpcServer, dial) -> None:
    stub = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=ADMIN_TOKEN))
    inflight = asyncio.ensure_future(stub.Echo(echo_pb2.EchoRequest(text="in flight", sleep_s=0.5)))
    await wait_for(lambda: server.inflight == 1, timeout_s=5, what="the call to reach the handler")

    stopping = asyncio.ensure_future(server.stop(5))
    await wait_for(lambda: server.stopping, timeout_s=5, what="stop to begin")
    late = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=ADMIN_TOKEN))
    with pytest.raises(Unavailable):
        await late.Echo(echo_pb2.EchoRequest(text="too late"), timeout=2)

    assert (await inflight).text == "in flight"
    await asyncio.wait_for(stopping, 5)
    assert server.inflight == 0
    assert await server.wait_for_termination(1)


async def test_stop_cancels_calls_that_outlive_the_grace(server: RpcServer, dial) -> None:
    stub = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=ADMIN_TOKEN))
    call = asyncio.ensure_future(stub.Echo(echo_pb2.EchoRequest(text="long", sleep_s=30)))
    await wait_for(lambda: server.inflight == 1, timeout_s=5, what="the call to reach the handler")
    await asyncio.wait_for(server.stop(0.2), 5)
    with pytest.raises(Unavailable):  # grpc cuts the connection: UNAVAILABLE
        await call
    await wait_for(lambda: server.inflight == 0, timeout_s=5, what="the cancelled handler to unwind")


async def test_health_goes_not_serving_on_stop(server: RpcServer, dial) -> None:
    assert await check_health(server.address) == "SERVING"
    assert await check_health(server.address, service="ff.echo.v1.EchoService") == "SERVING"
    assert await check_health(server.address, service="ff.nope.v1.Nope") == "SERVICE_UNKNOWN"

    # a watcher already connected hears NOT_SERVING before the port closes
    health = health_pb2_grpc.HealthStub(dial(server.address))
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    seen: list[str] = []

    async def follow() -> None:
        async for update in watch:
            seen.append(health_pb2.HealthCheckResponse.ServingStatus.Name(update.status))

    follower = asyncio.ensure_future(follow())
    await wait_for(lambda: seen == ["SERVING"], timeout_s=5, what="the first health update")
    stopping = asyncio.ensure_future(server.stop(0.5))
    await wait_for(lambda: "NOT_SERVING" in seen, timeout_s=5, what="NOT_SERVING on stop")
    await stopping
    follower.cancel()
    await asyncio.gather(follower, return_exceptions=True)


async def test_check_health_with_nothing_listening_is_unavailable(serve) -> None:
    server, _ = await serve()
    address = server.address
    await server.stop(0)
    with pytest.raises(Unavailable) as info:
        await check_health(address, timeout_s=1)
    assert address in str(info.value) and info.value.fields["address"] == address


async def test_reflection_lists_the_services(server: RpcServer, dial) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(dial(server.address))
    names: set[str] = set()
    async for resp in stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])):
        names |= {s.name for s in resp.list_services_response.service}
    assert {"ff.echo.v1.EchoService", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"} <= names


async def test_port_in_use_fails_to_start(server: RpcServer, tokens) -> None:
    other = RpcServer(RpcSettings(port=server.port), service="dup", tokens=tokens)
    with pytest.raises(Unavailable, match="cannot listen"):
        await other.start()


async def test_add_servicer_after_start_is_refused(server: RpcServer) -> None:
    with pytest.raises(FailedPrecondition):
        server.add_servicer(lambda s, srv: None, object(), "ff.late.v1.Late")


# ------------------------------------------------- all four arities, raw bytes

STREAMS = "ff.test.v1.Streams"


def _streams_handler() -> grpc.GenericRpcHandler:
    """A hand-made service over raw bytes: one method per arity, each can fail typed."""

    async def unary_unary(request: bytes, context: Any) -> bytes:
        if request == b"fail":
            raise NotFound("no such thing", thing=1)
        return current_principal().user.encode()

    @requires("admin")
    async def unary_stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
        for i in range(3):
            yield f"{current_principal().user}:{i}".encode()
        if request == b"fail":
            raise NotFound("stream ran dry", after=3)

    async def stream_unary(requests: AsyncIterator[bytes], context: Any) -> bytes:
        got = [r async for r in requests]
        if b"fail" in got:
            raise NotFound("bad item", index=got.index(b"fail"))
        return b",".join(got)

    async def stream_stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for r in requests:
            if r == b"fail":
                raise NotFound("bad item", item="fail")
            yield r.upper()

    return grpc.method_handlers_generic_handler(STREAMS, {
        "UnaryUnary": grpc.unary_unary_rpc_method_handler(unary_unary),
        "UnaryStream": grpc.unary_stream_rpc_method_handler(unary_stream),
        "StreamUnary": grpc.stream_unary_rpc_method_handler(stream_unary),
        "StreamStream": grpc.stream_stream_rpc_method_handler(stream_stream),
    })


@pytest.fixture
async def streams(serve, dial) -> tuple[grpc.aio.Channel, grpc.aio.Channel]:
    handler = _streams_handler()
    server, _ = await serve(extra=[(lambda _s, srv: srv.add_generic_rpc_handlers((handler,)), None, STREAMS)])
    return dial(server.address, token=ADMIN_TOKEN), dial(server.address, token=USER_TOKEN)


async def _items(*items: bytes) -> AsyncIterator[bytes]:
    for i in items:
        yield i


async def test_unary_unary_raw(streams) -> None:
    admin, _ = streams
    m = admin.unary_unary(f"/{STREAMS}/UnaryUnary")
    assert await m(b"hi") == b"root"
    with pytest.raises(NotFound) as info:
        await m(b"fail")
    assert info.value.fields == {"thing": 1}


async def test_unary_stream_principal_roles_and_typed_error(streams) -> None:
    admin, user = streams
    got = [r async for r in admin.unary_stream(f"/{STREAMS}/UnaryStream")(b"ok")]
    assert got == [b"root:0", b"root:1", b"root:2"]

    call = admin.unary_stream(f"/{STREAMS}/UnaryStream")(b"fail")
    seen = []
    with pytest.raises(NotFound) as info:
        async for r in call:
            seen.append(r)
    assert len(seen) == 3 and info.value.fields == {"after": 3}

    # read() style works too, and the role check guards the stream
    call = user.unary_stream(f"/{STREAMS}/UnaryStream")(b"ok")
    from fireflyer.core.errors import PermissionDenied
    with pytest.raises(PermissionDenied):
        await call.read()


async def test_stream_unary_iterator_and_write_styles(streams) -> None:
    admin, _ = streams
    m = admin.stream_unary(f"/{STREAMS}/StreamUnary")
    assert await m(_items(b"a", b"b")) == b"a,b"
    with pytest.raises(NotFound) as info:
        await m(_items(b"a", b"fail"))
    assert info.value.fields == {"index": 1}
    # write() style: the interceptor must not hold the call while the caller writes
    call = m()
    await call.write(b"x")
    await call.write(b"y")
    await call.done_writing()
    assert await asyncio.wait_for(call, 5) == b"x,y"


async def test_stream_stream_write_and_read(streams) -> None:
    admin, _ = streams
    m = admin.stream_stream(f"/{STREAMS}/StreamStream")
    assert [r async for r in m(_items(b"a", b"b"))] == [b"A", b"B"]
    call = m()
    await call.write(b"q")
    assert await call.read() == b"Q"
    await call.write(b"fail")
    with pytest.raises(NotFound) as info:
        await call.read()
    assert info.value.fields == {"item": "fail"}
