"""Tokens, principals and the auth interceptor's outcomes against a real server."""

from __future__ import annotations

import json
import os
import stat

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from fireflyer.api.echo.v1 import echo_pb2, echo_pb2_grpc
from fireflyer.core.config import RpcSettings
from fireflyer.core.errors import Internal, PermissionDenied, SettingsError, Unauthenticated
from fireflyer.rpc import (
    ANONYMOUS_ADMIN,
    Principal,
    RpcServer,
    TokenStore,
    connect,
    current_principal,
    generate_token,
    require_role,
    write_tokens_file,
)
from fireflyer.rpc.auth import _bind, _unbind

ADMIN_TOKEN = "admin-token-for-tests"  # as in conftest.py
USER_TOKEN = "user-token-for-tests"

# ------------------------------------------------------------------ pure parts


def test_generated_tokens_are_never_read_as_options_on_a_command_line() -> None:
    """A bare URL-safe token starts with '-' one time in 64; `ff admin --token T` then fails."""
    from fireflyer.cli.main import build_parser

    tokens = {generate_token() for _ in range(2000)}
    assert len(tokens) == 2000
    assert not [t for t in tokens if t.startswith("-")]
    for tok in list(tokens)[:50]:
        ns = build_parser().parse_args(["admin", "--token", tok, "chains"])
        assert ns.token == tok


def test_admin_implies_user() -> None:
    admin = Principal("root", frozenset({"admin"}))
    user = Principal("alice", frozenset({"user"}))
    assert admin.has_role("admin") and admin.has_role("user")
    assert user.has_role("user") and not user.has_role("admin")
    assert not Principal("nobody").has_role("user")


def test_token_store_lookup(tokens: TokenStore) -> None:
    assert tokens.lookup(ADMIN_TOKEN) == Principal("root", frozenset({"admin"}))
    assert tokens.lookup(USER_TOKEN) == Principal("alice", frozenset({"user"}))
    assert tokens.lookup("nope") is None
    assert tokens.lookup("") is None


@pytest.mark.parametrize("entry, words", [
    ({"token": "t", "user": "u", "roles": ["root"]}, "unknown roles"),
    ({"token": "", "user": "u"}, "non-empty"),
    ({"token": "t", "user": ""}, "non-empty"),
])
def test_token_store_rejects_bad_entries(entry: dict, words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        TokenStore.from_entries([entry])


def test_token_store_rejects_duplicates() -> None:
    with pytest.raises(SettingsError, match="duplicate"):
        TokenStore.from_entries([{"token": "t", "user": "a"}, {"token": "t", "user": "b"}])


def test_tokens_file_round_trip(tmp_path) -> None:
    admin, user = generate_token(), generate_token()
    assert admin != user and len(admin) >= 40
    path = write_tokens_file(tmp_path / "state" / "tokens.json",
                             [{"token": admin, "user": "admin", "roles": ["admin"]},
                              {"token": user, "user": "alice", "roles": ["user"]}])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # secrets: owner only
    assert json.loads(path.read_text())["tokens"][0]["user"] == "admin"
    store = TokenStore.from_file(path)
    assert store.lookup(admin) == Principal("admin", frozenset({"admin"}))
    assert store.lookup(user) == Principal("alice", frozenset({"user"}))
    assert list(tmp_path.joinpath("state").iterdir()) == [path]  # no temp file left behind


def test_tokens_file_errors_name_the_file(tmp_path) -> None:
    with pytest.raises(SettingsError, match="does not exist"):
        TokenStore.from_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"tokens": [{"user": "x"}]}')
    with pytest.raises(SettingsError, match="bad.json entry 0 .*token or token_sha256"):
        TokenStore.from_file(bad)


def test_require_role_names_user_role_and_method() -> None:
    bound = _bind(Principal("alice", frozenset({"user"})), "/ff.x.v1.X/Drain")
    try:
        with pytest.raises(PermissionDenied) as info:
            require_role("admin")
        assert info.value.fields == {"user": "alice", "role": "admin", "method": "/ff.x.v1.X/Drain"}
        assert "alice" in str(info.value) and "admin" in str(info.value)
        assert require_role("user").user == "alice"
    finally:
        _unbind(bound)


def test_current_principal_outside_a_call_is_a_server_bug() -> None:
    with pytest.raises(Internal, match="outside an RPC handler"):
        current_principal()


# ------------------------------------------------------------ against a server


@pytest.fixture
def echo(dial):
    def stub(address: str, token: str | None) -> echo_pb2_grpc.EchoServiceStub:
        return echo_pb2_grpc.EchoServiceStub(dial(address, token=token))

    return stub


async def test_no_token_is_unauthenticated(echo, server: RpcServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FF_TOKEN", raising=False)
    with pytest.raises(Unauthenticated) as info:
        await echo(server.address, None).Echo(echo_pb2.EchoRequest(text="hi"))
    assert "FF_TOKEN" in str(info.value) and "tokens.json" in str(info.value)
    assert info.value.fields["method"] == "/ff.echo.v1.EchoService/Echo"


async def test_unknown_token_is_unauthenticated(echo, server: RpcServer) -> None:
    with pytest.raises(Unauthenticated, match="unknown bearer token") as info:
        await echo(server.address, "not-a-token").Echo(echo_pb2.EchoRequest(text="hi"))
    assert "not-a-token" not in str(info.value)


async def test_user_token_on_admin_method_is_permission_denied(echo, server: RpcServer) -> None:
    stub = echo(server.address, USER_TOKEN)
    reply = await stub.Echo(echo_pb2.EchoRequest(text="hi"))
    assert (reply.user, list(reply.roles)) == ("alice", ["user"])
    with pytest.raises(PermissionDenied) as info:
        await stub.AdminPing(echo_pb2.AdminPingRequest())
    assert info.value.fields == {"user": "alice", "role": "admin", "method": "/ff.echo.v1.EchoService/AdminPing"}


async def test_admin_token_is_ok(echo, server: RpcServer) -> None:
    stub = echo(server.address, ADMIN_TOKEN)
    assert (await stub.AdminPing(echo_pb2.AdminPingRequest())).user == "root"
    assert (await stub.Echo(echo_pb2.EchoRequest(text="hi"))).user == "root"


async def test_token_from_environment_read_at_connect(echo, server: RpcServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FF_TOKEN", ADMIN_TOKEN)
    stub = echo(server.address, None)
    monkeypatch.delenv("FF_TOKEN")  # already read: the channel keeps it
    assert (await stub.AdminPing(echo_pb2.AdminPingRequest())).user == "root"


async def test_health_and_reflection_need_no_token(echo, server: RpcServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FF_TOKEN", raising=False)
    async with connect(server.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        async for resp in stub.ServerReflectionInfo(iter([req])):
            assert "ff.echo.v1.EchoService" in {s.name for s in resp.list_services_response.service}


async def test_auth_disabled_runs_as_anonymous_admin(echo, serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FF_TOKEN", raising=False)
    server, _ = await serve(auth_enabled=False)
    stub = echo(server.address, None)
    assert (await stub.AdminPing(echo_pb2.AdminPingRequest())).user == ANONYMOUS_ADMIN.user
    reply = await echo(server.address, "whatever").Echo(echo_pb2.EchoRequest(text="x"))
    assert set(reply.roles) == {"admin", "user", "service"}  # auth off: every call is allowed


def test_auth_enabled_without_tokens_fails_at_construction() -> None:
    with pytest.raises(SettingsError, match="no token store"):
        RpcServer(RpcSettings(), service="x", tokens=None, auth_enabled=True)


def test_principal_for_follows_the_servers_auth_rules(tokens: TokenStore) -> None:
    on = RpcServer(RpcSettings(), service="x", tokens=tokens)
    assert on.principal_for(USER_TOKEN) == Principal("alice", frozenset({"user"}))
    assert on.principal_for("not-a-token") is None
    assert on.principal_for("") is None
    off = RpcServer(RpcSettings(), service="x", tokens=None, auth_enabled=False)
    assert off.principal_for("anything") == ANONYMOUS_ADMIN


def test_the_service_role_implies_user_but_not_admin() -> None:
    from fireflyer.rpc import Principal

    svc = Principal("svc-storage", frozenset({"service"}))
    admin = Principal("admin", frozenset({"admin"}))
    assert svc.has_role("service") and svc.has_role("user") and not svc.has_role("admin")
    assert admin.has_role("admin") and admin.has_role("user") and not admin.has_role("service")
    assert TokenStore.from_entries([{"token": "fft_s", "user": "svc-storage", "roles": ["service"]}]
                                   ).lookup("fft_s") == svc
