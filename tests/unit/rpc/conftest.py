"""Real grpc.aio servers on 127.0.0.1:0, in-process, serving a test echo servicer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from fireflyer.api.echo.v1 import echo_pb2, echo_pb2_grpc
from fireflyer.core.config import RpcSettings
from fireflyer.core.errors import error_from_dict
from fireflyer.rpc import RpcServer, TokenStore, connect, current_principal, requires
from fireflyer.telemetry import trace_id_hex

ECHO = "ff.echo.v1.EchoService"
ADMIN_TOKEN = "admin-token-for-tests"
USER_TOKEN = "user-token-for-tests"


class EchoServicer(echo_pb2_grpc.EchoServiceServicer):
    """The echo contract, written here so these tests need nothing but fireflyer.rpc."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finished = 0

    async def Echo(self, request: echo_pb2.EchoRequest, context: Any) -> echo_pb2.EchoReply:
        who = current_principal()
        self.started.set()
        if request.sleep_s > 0:
            await asyncio.sleep(request.sleep_s)
        self.finished += 1
        return echo_pb2.EchoReply(text=request.text, user=who.user, trace_id=trace_id_hex(), roles=sorted(who.roles))

    async def Fail(self, request: echo_pb2.FailRequest, context: Any) -> echo_pb2.FailReply:
        if request.kind == "ZeroDivisionError":  # not a FireFlyerError: must become INTERNAL
            return echo_pb2.FailReply(x=1 / 0)  # type: ignore[call-arg]
        fields: dict[str, Any] = {}
        for k, v in request.fields.items():
            fields[k] = int(v) if v.isdigit() else v
        raise error_from_dict({"kind": request.kind, "code": "UNKNOWN", "message": request.message, "fields": fields})

    @requires("admin")
    async def AdminPing(self, request: echo_pb2.AdminPingRequest, context: Any) -> echo_pb2.AdminPingReply:
        return echo_pb2.AdminPingReply(user=current_principal().user)


@pytest.fixture
def admin_token() -> str:
    return ADMIN_TOKEN


@pytest.fixture
def user_token() -> str:
    return USER_TOKEN


@pytest.fixture
def tokens() -> TokenStore:
    return TokenStore.from_entries([
        {"token": ADMIN_TOKEN, "user": "root", "roles": ["admin"]},
        {"token": USER_TOKEN, "user": "alice", "roles": ["user"]},
    ])


ServeFn = Callable[..., Awaitable[tuple[RpcServer, EchoServicer]]]


@pytest.fixture
async def serve(tokens: TokenStore) -> AsyncIterator[ServeFn]:
    """``server, servicer = await serve(settings=..., auth_enabled=..., extra=[(add_fn, servicer, name)])``."""
    started: list[RpcServer] = []

    async def start(*, settings: RpcSettings | None = None, auth_enabled: bool = True,
                    extra: list[tuple[Any, Any, str]] = ()) -> tuple[RpcServer, EchoServicer]:  # type: ignore[assignment]
        server = RpcServer(settings or RpcSettings(host="127.0.0.1", port=0), service="echo-test",
                           tokens=tokens, auth_enabled=auth_enabled)
        servicer = EchoServicer()
        server.add_servicer(echo_pb2_grpc.add_EchoServiceServicer_to_server, servicer, ECHO)
        for add_fn, other, name in extra:
            server.add_servicer(add_fn, other, name)
        await server.start()
        started.append(server)
        return server, servicer

    yield start
    for server in started:
        await server.stop(0)


@pytest.fixture
async def server(serve: ServeFn) -> RpcServer:
    return (await serve())[0]



@pytest.fixture
async def dial() -> AsyncIterator[Callable[..., grpc.aio.Channel]]:
    """``channel = dial(address, token=..., settings=...)``; closed at teardown.

    A grpc.aio channel closes itself when garbage collected, and a stub does
    not keep its channel alive, so tests hold the channels here.
    """
    channels: list[grpc.aio.Channel] = []

    def make(address: str, **kw: Any) -> grpc.aio.Channel:
        channels.append(connect(address, **kw))
        return channels[-1]

    yield make
    for ch in channels:
        await ch.close()
