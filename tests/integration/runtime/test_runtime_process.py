"""The service runtime against real processes, real NATS and real signals."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest

from fireflyer.api.echo.v1 import echo_pb2, echo_pb2_grpc
from fireflyer.bus import Bus
from fireflyer.core.errors import NotFound, PermissionDenied, Unauthenticated, Unavailable
from fireflyer.rpc import check_health, connect
from fireflyer.testing.echo import EchoPublished, published_subject
from fireflyer.testing.nats import fast_nats_settings, unique_name
from fireflyer.testing.poll import wait_for
from fireflyer.testing.services import ServiceProcess

ECHO = "fireflyer.testing.echo"


def test_bad_setting_stops_start_up_naming_the_key(tmp_path):
    env = {"FF_RPC_PORT": "eighty", "FF_STATE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-m", ECHO], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "'rpc.port'" in res.stderr and "FF_RPC_PORT" in res.stderr and "expected int" in res.stderr
    res = subprocess.run([sys.executable, "-m", ECHO, "--set", "grace_s=soon"], env={**env, "FF_RPC_PORT": "0"},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "'grace_s'" in res.stderr and "expected float" in res.stderr


def test_auth_enabled_without_tokens_file_is_a_clear_start_error(tmp_path, nats_server):
    res = subprocess.run([sys.executable, "-m", ECHO],
                         env={"FF_STATE_DIR": str(tmp_path), "FF_NATS_URL": nats_server.url, "FF_RPC_PORT": "0"},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "auth.tokens_file" in res.stderr


@pytest.fixture
async def echo(tmp_path, nats_server, tokens):
    svc = ServiceProcess(ECHO, state_dir=tmp_path, nats_url=nats_server.url, tokens_file=tokens.path,
                         instance="echo-0", env={"FF_GRACE_S": "5"}).start()
    try:
        await svc.wait_healthy()
        yield svc
    finally:
        svc.stop()


async def test_auth_and_error_mapping_against_a_real_process(echo, tokens):
    async with connect(echo.address, token="") as ch:
        with pytest.raises(Unauthenticated):
            await echo_pb2_grpc.EchoServiceStub(ch).Echo(echo_pb2.EchoRequest(text="x"))
    async with connect(echo.address, token="not-a-token") as ch:
        with pytest.raises(Unauthenticated):
            await echo_pb2_grpc.EchoServiceStub(ch).Echo(echo_pb2.EchoRequest(text="x"))
    async with connect(echo.address, token=tokens.user) as ch:
        stub = echo_pb2_grpc.EchoServiceStub(ch)
        reply = await stub.Echo(echo_pb2.EchoRequest(text="hi"))
        assert (reply.text, reply.user, list(reply.roles)) == ("hi", "alice", ["user"])
        with pytest.raises(PermissionDenied):
            await stub.AdminPing(echo_pb2.AdminPingRequest())
        with pytest.raises(NotFound) as e:
            await stub.Fail(echo_pb2.FailRequest(kind="NotFound", message="no chain 7", fields={"chain": "7"}))
        assert e.value.fields == {"chain": "7"} and "no chain 7" in str(e.value)
    async with connect(echo.address, token=tokens.admin) as ch:
        assert (await echo_pb2_grpc.EchoServiceStub(ch).AdminPing(echo_pb2.AdminPingRequest())).user == "root-admin"


async def _call_in_flight(echo, tokens, nats_server, sleep_s: float):
    """Start an Echo that sleeps; return (task, bus) once the service is inside the call."""
    bus = await Bus.connect(fast_nats_settings(nats_server.url), name="test")
    ident = unique_name("inflight")
    seen: list[EchoPublished] = []

    async def on_event(ev, msg):
        seen.append(ev)

    await bus.subscribe(published_subject(ident), on_event, types=EchoPublished)
    ch = connect(echo.address, token=tokens.user)
    stub = echo_pb2_grpc.EchoServiceStub(ch)

    async def call():
        return await stub.Echo(echo_pb2.EchoRequest(text="slow", sleep_s=sleep_s,
                                                    publish_subject=published_subject(ident)), timeout=30)

    task = asyncio.create_task(call())
    await wait_for(lambda: seen, timeout_s=10, what="the echo call to be in flight")
    return task, ch, bus


async def test_sigterm_lets_an_in_flight_rpc_finish_then_exits_0(echo, tokens, nats_server):
    task, ch, bus = await _call_in_flight(echo, tokens, nats_server, sleep_s=1.0)
    t0 = time.monotonic()
    echo.signal(signal.SIGTERM)
    # new calls are refused while the old one drains
    await wait_for(lambda: _not_serving(echo.address), timeout_s=5, what="health NOT_SERVING or gone")
    reply = await task
    assert reply.text == "slow"
    code = await asyncio.to_thread(echo.wait, 15)
    assert code == 0 and time.monotonic() - t0 < 5 + 2
    log = echo.log()
    assert '"service.stopping"' in log and '"service.stopped"' in log
    assert '"loop":"uvloop"' in log  # the runtime installed uvloop
    await ch.close()
    await bus.close()


async def test_grace_expiry_cancels_a_long_rpc_and_still_exits_0(tmp_path, nats_server, tokens):
    svc = ServiceProcess(ECHO, state_dir=tmp_path, nats_url=nats_server.url, tokens_file=tokens.path,
                         instance="echo-g", env={"FF_GRACE_S": "0.5"}).start()
    try:
        await svc.wait_healthy()
        task, ch, bus = await _call_in_flight(svc, tokens, nats_server, sleep_s=20)
        t0 = time.monotonic()
        svc.signal(signal.SIGTERM)
        with pytest.raises(Unavailable):
            await task
        assert await asyncio.to_thread(svc.wait, 15) == 0
        assert time.monotonic() - t0 < 0.5 + 5
        await ch.close()
        await bus.close()
    finally:
        svc.stop()


async def _not_serving(address: str) -> bool:
    try:
        return await check_health(address, timeout_s=0.5) != "SERVING"
    except Unavailable:
        return True


async def test_malformed_nats_message_does_not_kill_the_service(echo, tokens, nats_server):
    bus = await Bus.connect(fast_nats_settings(nats_server.url), name="test")
    ident = unique_name("bad")
    await bus.publish_raw(published_subject(ident), b"\x00 not json {")
    await bus.publish_raw(published_subject(ident), b'{"type": "no.such.event.v1"}')
    async with connect(echo.address, token=tokens.user) as ch:
        await echo_pb2_grpc.EchoServiceStub(ch).Echo(
            echo_pb2.EchoRequest(text="after-garbage", publish_subject=published_subject(ident)))
    await wait_for(lambda: "after-garbage" in echo.log() and "echo.received" in echo.log(), timeout_s=10,
                   what="the valid event handled after the garbage")
    assert "bus.malformed" in echo.log()
    assert echo.returncode is None and await check_health(echo.address) == "SERVING"
    await bus.close()


async def test_a_service_whose_port_was_taken_meanwhile_starts_again_on_a_fresh_one(tmp_path, nats_server, tokens):
    """free_ports can only pick a port that is free *now*; another process may bind it before the
    service does. wait_healthy then restarts the service on a fresh port instead of failing the test."""
    import socket as _socket

    svc = ServiceProcess(ECHO, state_dir=tmp_path, nats_url=nats_server.url, tokens_file=tokens.path,
                         instance="echo-taken")
    thief = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    thief.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    thief.bind(("127.0.0.1", svc.port))
    thief.listen(1)
    taken = svc.port
    try:
        svc.start()
        await svc.wait_healthy(30.0)
        assert svc.port != taken and await check_health(svc.address, timeout_s=2.0) == "SERVING"
    finally:
        thief.close()
        svc.stop()
