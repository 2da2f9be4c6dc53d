"""The in-process service starter: same runtime, on the test's loop."""

import pytest

from fireflyer.api.echo.v1 import echo_pb2, echo_pb2_grpc
from fireflyer.core import load_settings
from fireflyer.core.config import ServiceSettings
from fireflyer.core.errors import Unavailable
from fireflyer.rpc import check_health, connect
from fireflyer.testing.echo import EchoService
from fireflyer.testing.services import running_service


async def test_running_service_serves_and_stops(tmp_path, nats_server, tokens):
    settings = load_settings(ServiceSettings, env={
        "FF_NATS_URL": nats_server.url, "FF_AUTH_TOKENS_FILE": str(tokens.path), "FF_STATE_DIR": str(tmp_path),
        "FF_INSTANCE": "echo-inproc", "FF_GRACE_S": "1"})
    async with running_service(EchoService(settings)) as ctx:
        address = ctx.server.address
        assert await check_health(address) == "SERVING"
        async with connect(address, token=tokens.user) as ch:
            reply = await echo_pb2_grpc.EchoServiceStub(ch).Echo(echo_pb2.EchoRequest(text="in-process"))
        assert reply.user == "alice" and ctx.bus is not None and ctx.bus.is_connected
    with pytest.raises(Unavailable):
        await check_health(address, timeout_s=0.5)


async def test_start_up_error_surfaces(tmp_path, nats_server):
    settings = load_settings(ServiceSettings, env={"FF_NATS_URL": nats_server.url, "FF_STATE_DIR": str(tmp_path)})
    with pytest.raises(Exception, match="auth.tokens_file|tokens file"):
        async with running_service(EchoService(settings)):
            pass
