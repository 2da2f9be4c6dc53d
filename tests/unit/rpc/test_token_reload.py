"""Token expiry and revocation, the tokens file reload decision, and a real server following
its tokens file (a user added, then revoked, without a restart)."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import time

import pytest

from fireflyer.api.echo.v1 import echo_pb2, echo_pb2_grpc
from fireflyer.core.config import RpcSettings
from fireflyer.core.errors import SettingsError, Unauthenticated
from fireflyer.rpc import RpcServer, TokenEntry, TokenStore, connect, current_principal, write_tokens_file
from fireflyer.rpc.auth import (
    FileSig,
    ReloadingTokenStore,
    file_sig,
    read_token_entries,
    reload_due,
    should_reload,
    token_state,
)

ECHO = "ff.echo.v1.EchoService"


class EchoServicer(echo_pb2_grpc.EchoServiceServicer):
    async def Echo(self, request, context):
        return echo_pb2.EchoReply(text=request.text, user=current_principal().user)

UTC = datetime.UTC
T0 = 1_800_000_000.0  # a fixed "now"


def _at(ts: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ts, tz=UTC)


# ------------------------------------------------------------------ pure parts


def test_token_state_revoked_beats_expired_and_expiry_is_exclusive() -> None:
    assert token_state(revoked=False, expires_at=None, now=T0) == "active"
    assert token_state(revoked=False, expires_at=T0 + 1, now=T0) == "active"
    assert token_state(revoked=False, expires_at=T0, now=T0) == "expired"
    assert token_state(revoked=True, expires_at=None, now=T0) == "revoked"
    assert token_state(revoked=True, expires_at=T0 - 5, now=T0) == "revoked"


def test_expired_and_revoked_tokens_map_to_no_one_and_say_why() -> None:
    store = TokenStore.from_entries([
        TokenEntry(token="t-live", user="alice", expires_at=_at(T0 + 60)),
        TokenEntry(token="t-old", user="bob", expires_at=_at(T0 - 1)),
        TokenEntry(token="t-gone", user="carol", revoked=True, revoked_at=_at(T0 - 30)),
    ])
    assert store.lookup("t-live", now=T0).user == "alice"
    assert store.lookup("t-live", now=T0 + 60) is None  # the same token once its time is up
    assert store.lookup("t-old", now=T0) is None
    assert store.lookup("t-gone", now=T0) is None
    assert store.rejection("t-live", now=T0) is None
    assert store.rejection("nope", now=T0) is None
    assert "user 'bob' expired at" in store.rejection("t-old", now=T0)
    assert "user 'carol' was revoked at" in store.rejection("t-gone", now=T0)
    with pytest.raises(Unauthenticated, match="carol' was revoked"):
        store.authenticate("t-gone")
    assert store.authenticate("nope") is None  # unknown: the caller's own message


def test_hashed_tokens_authenticate_and_the_file_holds_no_secret(tmp_path) -> None:
    secret = "fft_only-the-user-knows"
    entry = TokenEntry(token_sha256=hashlib.sha256(secret.encode()).hexdigest(), user="dave")
    path = write_tokens_file(tmp_path / "tokens.json", [TokenEntry(token="adm", user="admin", roles=["admin"]), entry])
    assert secret not in path.read_text()
    store = TokenStore.from_file(path)
    assert store.lookup(secret).user == "dave"
    assert store.lookup(entry.token_sha256) is None  # the hash is not a token


@pytest.mark.parametrize("entry, words", [
    ({"token": "t", "token_sha256": "a" * 64, "user": "u"}, "exactly one"),
    ({"token_sha256": "xyz", "user": "u"}, "64 lower-case hex"),
    ({"token": "t", "user": "u", "expires_at": "2027-01-01T00:00:00"}, "no time zone"),
])
def test_bad_new_fields_are_refused(entry: dict, words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        TokenStore.from_entries([entry])


def test_a_hashed_and_a_plain_entry_of_one_token_are_duplicates() -> None:
    with pytest.raises(SettingsError, match="duplicate"):
        TokenStore.from_entries([{"token": "t", "user": "a"},
                                 {"token_sha256": hashlib.sha256(b"t").hexdigest(), "user": "b"}])


def test_old_files_read_unchanged(tmp_path) -> None:
    """A file in the format before expiry and revocation existed still loads, and round-trips."""
    path = tmp_path / "tokens.json"
    path.write_text('{"tokens": [{"token": "a", "user": "admin", "roles": ["admin"]}, {"token": "u", "user": "me"}]}')
    entries = read_token_entries(path)
    assert [(e.user, e.roles, e.expires_at, e.revoked) for e in entries] == [
        ("admin", ["admin"], None, False), ("me", ["user"], None, False)]
    write_tokens_file(path, entries)
    assert "expires_at" not in path.read_text() and "revoked" not in path.read_text()


def test_reload_decision() -> None:
    assert reload_due(now=5.0, last_checked=None, interval_s=1.0)
    assert not reload_due(now=5.5, last_checked=5.0, interval_s=1.0)
    assert reload_due(now=6.0, last_checked=5.0, interval_s=1.0)
    a = FileSig(1, 100, 10)
    assert not should_reload(a, a)
    assert should_reload(a, FileSig(2, 100, 10))  # renamed over: new inode
    assert should_reload(a, FileSig(1, 101, 10))
    assert should_reload(a, FileSig(1, 100, 11))
    assert not should_reload(a, None)  # gone for now: keep what we have
    assert should_reload(None, a)


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_reloading_store_follows_the_file_at_most_once_per_interval(tmp_path) -> None:
    path = write_tokens_file(tmp_path / "tokens.json", [TokenEntry(token="adm", user="admin", roles=["admin"])])
    clock = _Clock()
    store = ReloadingTokenStore(path, interval_s=1.0, clock=clock)
    assert store.lookup("bob-token") is None
    write_tokens_file(path, [*read_token_entries(path), TokenEntry(token="bob-token", user="bob")])
    clock.t += 0.5
    assert store.lookup("bob-token") is None  # not checked yet: within the interval
    clock.t += 0.5
    assert store.lookup("bob-token").user == "bob"
    assert store.reloads == 1
    clock.t += 5
    assert store.lookup("bob-token").user == "bob" and store.reloads == 1  # unchanged file: no re-read

    # a broken edit keeps the last good table (and is not re-read until it changes again)
    good = path.read_text()
    path.write_text('{"tokens": [{"user": "oops"}]}')
    clock.t += 1
    assert store.lookup("bob-token").user == "bob" and store.reloads == 1
    path.write_text(good.replace('"bob"', '"robert"'))
    clock.t += 1
    assert store.lookup("bob-token").user == "robert" and store.reloads == 2
    # a removed file keeps the table too
    path.unlink()
    clock.t += 1
    assert store.lookup("adm").user == "admin"
    assert file_sig(path) is None


def test_reloading_store_fails_at_start_on_a_bad_file(tmp_path) -> None:
    (tmp_path / "tokens.json").write_text("not json")
    with pytest.raises(SettingsError, match="malformed"):
        TokenStore.watch(tmp_path / "tokens.json")


# ------------------------------------------------------------------ a real server


async def _poll(fn, *, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await fn()
        except AssertionError:
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout_s}s: {what}") from None
        await asyncio.sleep(0.05)


async def test_a_server_accepts_an_added_user_and_refuses_them_once_revoked(tmp_path) -> None:
    from fireflyer.cluster.users import add_user, revoke_user

    path = write_tokens_file(tmp_path / "tokens.json", [TokenEntry(token="adm", user="admin", roles=["admin"])])
    server = RpcServer(RpcSettings(host="127.0.0.1", port=0), service="echo-test",
                       tokens=TokenStore.watch(path, interval_s=0.1))
    server.add_servicer(echo_pb2_grpc.add_EchoServiceServicer_to_server, EchoServicer(), ECHO)
    await server.start()
    try:
        token, _ = add_user(path, "bob")
        async with connect(server.address, token=token) as channel:
            stub = echo_pb2_grpc.EchoServiceStub(channel)

            async def bob_accepted():
                try:
                    reply = await stub.Echo(echo_pb2.EchoRequest(text="hi"))
                except Unauthenticated as e:
                    raise AssertionError(str(e)) from e
                assert reply.user == "bob"

            await _poll(bob_accepted, timeout_s=5, what="the added user accepted")
            revoke_user(path, "bob")

            async def bob_refused():
                try:
                    await stub.Echo(echo_pb2.EchoRequest(text="hi"))
                except Unauthenticated as e:
                    assert "user 'bob' was revoked" in str(e)
                    return
                raise AssertionError("still accepted")

            await _poll(bob_refused, timeout_s=5, what="the revoked user refused")

        old, _ = add_user(path, "erin", expires_at=_at(time.time() + 1.5))
        async with connect(server.address, token=old) as channel:
            stub = echo_pb2_grpc.EchoServiceStub(channel)

            async def erin_expired():
                try:
                    await stub.Echo(echo_pb2.EchoRequest(text="hi"))
                except Unauthenticated as e:
                    assert "user 'erin' expired at" in str(e)
                    return
                raise AssertionError("still accepted")

            await _poll(erin_expired, timeout_s=10, what="the expired token refused")
    finally:
        await server.stop(0)


def test_refusal_names_the_state_whatever_the_user_is_called() -> None:
    past = 1_000_000_000.0
    store = TokenStore.from_entries([TokenEntry(token="t", user="revoked_bob", expires_at=_at(past))])
    assert store.refusal("t") == ("expired", "the token of user 'revoked_bob' expired at 2001-09-09T01:46:40Z")
    with pytest.raises(Unauthenticated) as info:
        store.authenticate("t")
    assert info.value.fields["reason"] == "expired"
