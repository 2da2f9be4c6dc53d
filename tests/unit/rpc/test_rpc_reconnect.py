"""A client channel sees a service that came back within its reconnect backoff cap.

grpc fails every call on a channel whose last connect failed until its next reconnect
attempt, and by default that wait grows to 120 s; meta calling mgmtd right after both
started met it in CI.  ``rpc.reconnect_backoff_max_s`` caps the wait.
"""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fireflyer.core.config import RpcSettings
from fireflyer.core.errors import FireFlyerError
from fireflyer.rpc import connect
from fireflyer.rpc.channel import channel_options


def test_channel_options_cap_the_reconnect_backoff() -> None:
    opts = dict(channel_options(RpcSettings(reconnect_backoff_max_s=1.5)))
    assert opts["grpc.max_reconnect_backoff_ms"] == 1500
    assert opts["grpc.initial_reconnect_backoff_ms"] == 250
    # never below the shortest connect timeout grpc allows (see channel_options)
    assert "grpc.min_reconnect_backoff_ms" not in opts
    tiny = dict(channel_options(RpcSettings(reconnect_backoff_max_s=0.1)))
    assert tiny["grpc.initial_reconnect_backoff_ms"] == tiny["grpc.max_reconnect_backoff_ms"] == 100


async def _check(stub: health_pb2_grpc.HealthStub) -> bool:
    try:
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        return True
    except FireFlyerError:
        return False


async def test_a_server_that_starts_late_is_reached_within_the_cap() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    channel = connect(f"127.0.0.1:{port}", token="", settings=RpcSettings(reconnect_backoff_max_s=0.4))
    stub = health_pb2_grpc.HealthStub(channel)
    server = grpc.aio.server()
    try:
        # 6 s of failed connects: grpc's default backoff (1 s x 1.6 per attempt) would
        # next try about 2-4 s after the server is up; the cap makes it well under 1.5 s
        t_end = time.monotonic() + 6.0
        while time.monotonic() < t_end:
            assert not await _check(stub)
            await asyncio.sleep(0.3)
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        up = time.monotonic()
        while not await _check(stub):
            assert time.monotonic() - up < 1.5, "the channel stayed in reconnect backoff"
            await asyncio.sleep(0.05)
    finally:
        await channel.close()
        await server.stop(None)
