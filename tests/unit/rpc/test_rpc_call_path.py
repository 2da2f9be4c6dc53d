"""The server's per-call wrapper (cached per method) and the client's unary fast path."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import pytest

from fireflyer.api.echo.v1 import echo_pb2, echo_pb2_grpc
from fireflyer.core import errors as ff
from fireflyer.rpc import RpcServer
from fireflyer.rpc.interceptors import UnaryUnaryCaller

ECHO_METHOD = "/ff.echo.v1.EchoService/Echo"


def _call_logs(caplog: pytest.LogCaptureFixture) -> list[tuple[int, dict]]:
    return [(r.levelno, r.ff_fields) for r in caplog.records if getattr(r, "ff_event", "") == "rpc.call"]


async def test_auth_is_checked_on_every_call_of_a_cached_method(server: RpcServer, dial, admin_token: str) -> None:
    good = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=admin_token))
    bad = echo_pb2_grpc.EchoServiceStub(dial(server.address, token="not-a-token"))
    none = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=""))
    assert (await good.Echo(echo_pb2.EchoRequest(text="a"))).user == "root"
    # the handler of Echo is now cached: the next callers must still be authenticated one by one
    with pytest.raises(ff.Unauthenticated, match="unknown bearer token"):
        await bad.Echo(echo_pb2.EchoRequest(text="b"))
    with pytest.raises(ff.Unauthenticated, match="no bearer token"):
        await none.Echo(echo_pb2.EchoRequest(text="c"))
    assert (await good.Echo(echo_pb2.EchoRequest(text="d"))).user == "root"


async def test_a_callers_principal_does_not_leak_into_the_next_call(server: RpcServer, dial, admin_token: str,
                                                                     user_token: str) -> None:
    admin = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=admin_token))
    user = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=user_token))
    for _ in range(3):
        assert (await admin.Echo(echo_pb2.EchoRequest(text="x"))).user == "root"
        assert (await user.Echo(echo_pb2.EchoRequest(text="x"))).user == "alice"
    with pytest.raises(ff.PermissionDenied):
        await user.AdminPing(echo_pb2.AdminPingRequest())


async def test_success_logs_at_debug_and_failure_at_info(server: RpcServer, dial, admin_token: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    stub = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=admin_token))
    with caplog.at_level(logging.INFO, logger="fireflyer.rpc"):
        await stub.Echo(echo_pb2.EchoRequest(text="quiet"))
        with pytest.raises(ff.NotFound):
            await stub.Fail(echo_pb2.FailRequest(kind="NotFound", message="no such chain"))
    logged = _call_logs(caplog)
    assert [(lvl, f["method"], f["code"]) for lvl, f in logged] == [
        (logging.INFO, "/ff.echo.v1.EchoService/Fail", "NOT_FOUND")]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="fireflyer.rpc"):
        await stub.Echo(echo_pb2.EchoRequest(text="loud"))
    logged = _call_logs(caplog)
    assert [(lvl, f["method"], f["code"], f["user"]) for lvl, f in logged] == [
        (logging.DEBUG, ECHO_METHOD, "OK", "root")]


async def test_a_routine_error_logs_at_debug(server: RpcServer, dial, admin_token: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    # a NotPrimary redirect is normal life (clients follow it); another failed precondition is not
    from fireflyer.mgmt.lease import NotPrimary

    stub = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=admin_token))
    with caplog.at_level(logging.DEBUG, logger="fireflyer.rpc"):
        with pytest.raises(NotPrimary):
            await stub.Fail(echo_pb2.FailRequest(kind="NotPrimary", message="mgmtd m1 is not the primary"))
        with pytest.raises(ff.FailedPrecondition):
            await stub.Fail(echo_pb2.FailRequest(kind="FailedPrecondition", message="not yet"))
    assert [(lvl, f["code"]) for lvl, f in _call_logs(caplog)] == [
        (logging.DEBUG, "FAILED_PRECONDITION"), (logging.INFO, "FAILED_PRECONDITION")]


async def test_slow_success_is_logged_at_info(server: RpcServer, dial, admin_token: str,
                                              caplog: pytest.LogCaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from fireflyer.rpc import interceptors

    monkeypatch.setattr(interceptors, "SLOW_CALL_S", 0.0)  # every call counts as slow
    stub = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=admin_token))
    with caplog.at_level(logging.INFO, logger="fireflyer.rpc"):
        await stub.Echo(echo_pb2.EchoRequest(text="slow"))
    assert [(lvl, f["code"]) for lvl, f in _call_logs(caplog)] == [(logging.INFO, "OK")]


async def test_inflight_returns_to_zero_after_success_failure_and_auth_error(server: RpcServer, dial,
                                                                             admin_token: str) -> None:
    stub = echo_pb2_grpc.EchoServiceStub(dial(server.address, token=admin_token))
    await stub.Echo(echo_pb2.EchoRequest(text="a"))
    with pytest.raises(ff.Internal):
        await stub.Fail(echo_pb2.FailRequest(kind="ZeroDivisionError"))
    with pytest.raises(ff.Unauthenticated):
        await echo_pb2_grpc.EchoServiceStub(dial(server.address, token="nope")).Echo(echo_pb2.EchoRequest())
    # the client has its status before the server task leaves the wrapper: poll with a deadline
    deadline = time.monotonic() + 10.0
    while server.inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert server.inflight == 0


async def test_unary_fast_path_keeps_typed_errors_call_api_and_explicit_headers(server: RpcServer, dial,
                                                                               admin_token: str,
                                                                               user_token: str) -> None:
    channel = dial(server.address, token=user_token)
    stub = echo_pb2_grpc.EchoServiceStub(channel)
    call = stub.Echo(echo_pb2.EchoRequest(text="hi"))
    assert isinstance(call, grpc.aio.UnaryUnaryCall)
    assert (await call).text == "hi" and await call.code() == grpc.StatusCode.OK
    # an explicit authorization header wins over the channel's token
    reply = await stub.Echo(echo_pb2.EchoRequest(text="x"), metadata=(("authorization", f"Bearer {admin_token}"),))
    assert reply.user == "root"
    with pytest.raises(ff.PermissionDenied) as info:
        await stub.AdminPing(echo_pb2.AdminPingRequest())
    assert info.value.fields.get("user") == "alice" or "alice" in str(info.value)
    # grpc's own deadline still maps to the typed error
    with pytest.raises(ff.DeadlineExceeded):
        await stub.Echo(echo_pb2.EchoRequest(text="slow", sleep_s=5.0), timeout=0.05)


def test_unary_caller_applies_the_default_deadline_and_token() -> None:
    seen: dict = {}

    def inner(request, *, timeout, metadata, **kw):
        seen.update(timeout=timeout, metadata=list(metadata))
        return _DoneCall()

    caller = UnaryUnaryCaller(target="t:1", token="tok", default_timeout_s=7.0)
    caller.call(inner, ECHO_METHOD, object(), None, None)
    assert seen["timeout"] == 7.0 and ("authorization", "Bearer tok") in seen["metadata"]
    caller.call(inner, ECHO_METHOD, object(), 1.5, [("authorization", "Bearer other")])
    auth = [kv for kv in seen["metadata"] if kv[0] == "authorization"]  # (plus traceparent if a provider is set)
    assert seen["timeout"] == 1.5 and auth == [("authorization", "Bearer other")]


class _DoneCall:
    def add_done_callback(self, cb) -> None:  # only asked when a tracer provider records the span
        pass
