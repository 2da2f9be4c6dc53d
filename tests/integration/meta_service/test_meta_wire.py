"""The meta service's wire endpoint and how MetaClient chooses between it and gRPC.

Every op and error is already run over both transports (the ``meta`` fixture is
parametrized); these tests pin the choice itself: the wire is used when offered,
gRPC when it is not offered, not reachable, refused by settings, or when it broke.
"""

from __future__ import annotations

import asyncio
import errno as E
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from metasvc import Meta, Tokens, in_process_meta

from fireflyer.api.meta.v1 import meta_pb2 as pb
from fireflyer.core.errors import FsError, InvalidArgument, Unauthenticated
from fireflyer.fs import MetaClient
from fireflyer.wire.aio import AioConnection


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def wire_meta(tmp_path: Path, tokens: Tokens) -> AsyncIterator[Meta]:
    async with in_process_meta(tmp_path / "state", tokens) as m:
        yield m


async def test_client_calls_each_replica_over_its_advertised_wire_endpoint(wire_meta: Meta) -> None:
    service = wire_meta.service
    async with await wire_meta.client(wire_meta.tokens.admin) as m:
        reply = await m._replicas[0].stub.Endpoints(pb.EndpointsRequest())
        assert reply.wire_address == service.servicer.wire_address != ""
        before = service.servicer.calls
        await m.mkdir("/w")
        assert (await m.create("/w/f")).created
        assert m.transports() == {wire_meta.address: f"wire {reply.wire_address}"}
        assert service.wire.server.connection_count() == 1
        assert service.servicer.calls == before + 2  # the calls ran in the same servicer


async def test_errors_over_the_wire_keep_type_errno_and_path(wire_meta: Meta) -> None:
    async with await wire_meta.client(wire_meta.tokens.admin) as admin, \
            await wire_meta.client(wire_meta.tokens.bob) as bob:
        await admin.mkdir("/private", 0o700)
        with pytest.raises(FsError) as info:
            await bob.create("/private/x")
        assert info.value.errno == E.EACCES and info.value.fields["path"] == "/private/x"
        with pytest.raises(InvalidArgument):
            await bob.stat("/bad\0path")
        assert set(bob.transports().values()) == {f"wire {wire_meta.service.servicer.wire_address}"}


async def test_a_bad_token_is_refused_on_the_wire_too(wire_meta: Meta) -> None:
    host, port = wire_meta.service.servicer.wire_address.split(":")
    with pytest.raises(Unauthenticated):
        await AioConnection.connect(host, int(port), token="not-a-token")
    client = await MetaClient.connect(wire_meta.address, "not-a-token", failover_timeout_s=1.0)
    async with client:
        with pytest.raises(Unauthenticated):
            await client.stat("/")


async def test_transport_grpc_never_opens_the_wire(wire_meta: Meta, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FF_META_TRANSPORT", "grpc")
    async with await MetaClient.connect(wire_meta.address, wire_meta.tokens.admin) as m:
        await m.stat("/")
        assert m.transports() == {wire_meta.address: "grpc"}
    assert wire_meta.service.wire.server.connection_count() == 0
    with pytest.raises(InvalidArgument, match="quic"):
        MetaClient([wire_meta.address], wire_meta.tokens.admin, transport="quic")


async def test_unreachable_wire_endpoint_falls_back_to_grpc(wire_meta: Meta) -> None:
    servicer = wire_meta.service.servicer
    servicer.wire_address = f"127.0.0.1:{_dead_port()}"  # advertised, but nothing listens (a firewall)
    async with await wire_meta.client(wire_meta.tokens.admin) as m:
        assert (await m.mkdir("/fallback")).name == "fallback"
        assert m.transports() == {wire_meta.address: "grpc"}
        assert m.failovers == 0  # no call failed: the client just stayed on gRPC


async def test_broken_wire_connection_fails_over_to_grpc_and_the_call_succeeds(wire_meta: Meta) -> None:
    service = wire_meta.service
    async with await wire_meta.client(wire_meta.tokens.admin) as m:
        await m.mkdir("/b")
        assert m.transports()[wire_meta.address].startswith("wire")
        await service.wire.stop()  # the listener and its connections go away; gRPC stays
        await asyncio.sleep(0.05)
        res = await m.create("/b/f")  # retried with the same request id: created exactly once
        assert res.created
        assert m.transports() == {wire_meta.address: "grpc"}
        assert [e.name for e in (await m.readdir("/b")).entries] == ["f"]


async def test_replica_with_wire_off_is_called_over_grpc(tmp_path: Path, tokens: Tokens) -> None:
    async with in_process_meta(tmp_path / "state", tokens, FF_META_WIRE="false") as meta:
        assert meta.service.wire is None
        async with await meta.client(tokens.admin) as m:
            assert (await m.stat("/")).id == 1
            assert m.transports() == {meta.address: "grpc"}
            assert (await m._replicas[0].stub.Endpoints(pb.EndpointsRequest())).wire_address == ""


async def test_wire_host_and_port_settings_are_bound_and_advertised(tmp_path: Path, tokens: Tokens) -> None:
    port = _dead_port()
    async with in_process_meta(tmp_path / "state", tokens, FF_META_WIRE_HOST="127.0.0.1",
                               FF_META_WIRE_PORT=str(port)) as meta:
        assert meta.service.servicer.wire_address == f"127.0.0.1:{port}"
        async with await meta.client(tokens.admin) as m:
            await m.stat("/")
            assert m.transports() == {meta.address: f"wire 127.0.0.1:{port}"}
