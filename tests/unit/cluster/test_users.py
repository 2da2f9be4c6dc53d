"""``ff admin users``: the pure plans, the locked file rewrite, the command line, and how
``ff up``'s readers of the tokens file treat hashed, expired and revoked entries."""

from __future__ import annotations

import datetime
import hashlib
import json
import threading

import pytest

from fireflyer.cli.main import main
from fireflyer.cluster.records import TokensFile, ensure_tokens, read_tokens
from fireflyer.cluster.users import (
    add_user,
    list_users,
    parse_duration,
    parse_time,
    plan_add,
    plan_revoke,
    revoke_user,
    valid_user_name,
)
from fireflyer.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from fireflyer.rpc import TokenEntry, TokenStore, write_tokens_file
from fireflyer.rpc.auth import read_token_entries

UTC = datetime.UTC
T0 = 1_800_000_000.0
ADMIN = TokenEntry(token="fft_admin", user="admin", roles=["admin"])
ME = TokenEntry(token="fft_me", user="me", roles=["user"])
SVC = TokenEntry(token="fft_svc", user="svc-storage", roles=["service"])


def _at(ts: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ts, tz=UTC)


@pytest.mark.parametrize("text, seconds", [("45s", 45), ("90m", 5400), ("12h", 43200), ("90d", 90 * 86400),
                                           ("2w", 14 * 86400), ("1h30m", 5400), ("1.5h", 5400),
                                           ("3600", 3600), ("0.5", 0.5)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-10", "inf", "nan", "h", "0s", "5x", "1h 30m", "-5m", "1h30"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(InvalidArgument, match="bad duration"):
        parse_duration(text)


def test_parse_time() -> None:
    assert parse_time("2027-01-31T00:00:00Z") == datetime.datetime(2027, 1, 31, tzinfo=UTC)
    assert parse_time("2027-01-31") == datetime.datetime(2027, 1, 31, tzinfo=UTC)
    assert parse_time("2027-01-31T08:00:00+08:00") == datetime.datetime(2027, 1, 31, tzinfo=UTC)
    with pytest.raises(InvalidArgument, match="no zone"):
        parse_time("2027-01-31T00:00:00")
    with pytest.raises(InvalidArgument, match="RFC 3339"):
        parse_time("next tuesday")


def test_user_names() -> None:
    assert all(valid_user_name(n) for n in ("bob", "_svc", "a.b-c_1", "x" * 64))
    assert not any(valid_user_name(n) for n in ("", "1bob", "-bob", "b/ob", "..", "x" * 65, "bo b", "bob\n"))


def test_plan_add_stores_only_the_hash_and_keeps_every_other_entry() -> None:
    out = plan_add([ADMIN, ME], "bob", role="user", token="fft_secret", now=T0, expires_at=_at(T0 + 3600))
    assert out[:2] == [ADMIN, ME]
    new = out[2]
    assert (new.user, new.roles, new.token, new.created_at, new.expires_at) == (
        "bob", ["user"], "", _at(T0), _at(T0 + 3600))
    assert new.token_sha256 == hashlib.sha256(b"fft_secret").hexdigest()
    assert TokenStore.from_entries(out).lookup("fft_secret", now=T0).user == "bob"


def test_plan_add_refuses() -> None:
    with pytest.raises(InvalidArgument, match="bad user name"):
        plan_add([ADMIN], "../x", role="user", token="t", now=T0)
    with pytest.raises(InvalidArgument, match="unknown role"):
        plan_add([ADMIN], "bob", role="root", token="t", now=T0)
    with pytest.raises(InvalidArgument, match="not in the future"):
        plan_add([ADMIN], "bob", role="user", token="t", now=T0, expires_at=_at(T0))
    with pytest.raises(AlreadyExists, match="revoke it first"):
        plan_add([ADMIN, ME], "me", role="user", token="t", now=T0)
    # an expired or revoked user may be added again (a new token)
    expired = TokenEntry(token="old", user="bob", expires_at=_at(T0 - 1))
    assert len(plan_add([ADMIN, expired], "bob", role="user", token="t", now=T0)) == 3


def test_plan_revoke_marks_every_active_token_of_the_user_only() -> None:
    bob1 = TokenEntry(token="b1", user="bob")
    bob_old = TokenEntry(token="b0", user="bob", expires_at=_at(T0 - 10))
    out, n = plan_revoke([ADMIN, bob1, ME, bob_old], "bob", now=T0)
    assert n == 1
    assert out[0] == ADMIN and out[2] == ME and out[3] == bob_old  # untouched, in place
    assert out[1].revoked and out[1].revoked_at == _at(T0) and out[1].token == "b1"
    with pytest.raises(NotFound, match="already revoked or expired"):
        plan_revoke(out, "bob", now=T0)
    with pytest.raises(NotFound, match="users ls"):
        plan_revoke(out, "zed", now=T0)
    with pytest.raises(FailedPrecondition, match="services run with"):
        plan_revoke([ADMIN, ME, SVC], "svc-storage", now=T0)
    # the admin's token is an operator's: the services no longer run with it, so it may go
    assert plan_revoke([ADMIN, ME, SVC], "admin", now=T0)[1] == 1


def test_add_and_revoke_rewrite_the_file_keeping_other_entries(tmp_path) -> None:
    path = write_tokens_file(tmp_path / "tokens.json", [ADMIN, ME, SVC])
    token, entry = add_user(path, "bob", expires_at=_at(4_000_000_000))
    assert token.startswith("fft_") and token not in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    entries = read_token_entries(path)
    assert entries[:3] == [ADMIN, ME, SVC] and entries[3] == entry
    assert TokenStore.from_file(path).lookup(token).user == "bob"

    assert revoke_user(path, "bob") == 1
    entries = read_token_entries(path)
    assert entries[:3] == [ADMIN, ME, SVC] and entries[3].revoked
    assert TokenStore.from_file(path).lookup(token) is None
    with pytest.raises(FailedPrecondition, match="services run with"):
        revoke_user(path, "svc-storage")
    assert [(r.user, r.state, r.hashed) for r in list_users(path)] == [
        ("admin", "active", False), ("me", "active", False), ("svc-storage", "active", False),
        ("bob", "revoked", True)]
    assert not list(tmp_path.glob(".tokens.json.*"))  # no temp files left behind


def test_concurrent_adds_lose_no_user(tmp_path) -> None:
    path = write_tokens_file(tmp_path / "tokens.json", [ADMIN, ME])
    names = [f"u{i}" for i in range(12)]
    threads = [threading.Thread(target=add_user, args=(path, n)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(e.user for e in read_token_entries(path))[2:] == sorted(["admin", "me", *names])[2:]
    assert len(read_token_entries(path)) == 2 + len(names)


def test_cli_add_ls_revoke(tmp_path, capsys) -> None:
    path = write_tokens_file(tmp_path / "tokens.json", [ADMIN, ME])
    base = ["admin", "users", "--tokens-file", str(path)]
    assert main([*base, "add", "bob", "--expires-in", "90d"]) == 0
    out = capsys.readouterr().out
    token = out.splitlines()[1]
    assert token.startswith("fft_") and "expires" in out.splitlines()[0]
    assert TokenStore.from_file(path).lookup(token).user == "bob"

    assert main([*base, "add", "carol", "--role", "admin", "--expires", "2099-01-01", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["user"] == "carol" and doc["roles"] == ["admin"] and doc["expires_at"] == "2099-01-01T00:00:00Z"
    assert TokenStore.from_file(path).lookup(doc["token"]).has_role("admin")

    assert main([*base, "ls"]) == 0
    table = capsys.readouterr().out
    assert "bob" in table and "carol" in table and "never" in table
    assert "fft_" not in table  # never a token
    assert main([*base, "ls", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert "fft_" not in json.dumps(rows) and [r["user"] for r in rows] == ["admin", "me", "bob", "carol"]

    assert main([*base, "revoke", "bob"]) == 0
    assert "revoked 1 token of user bob" in capsys.readouterr().out
    assert main([*base, "revoke", "bob"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err
    assert main([*base, "add", "bob", "--expires-in", "soon"]) == 1
    assert "bad duration" in capsys.readouterr().err
    assert TokenStore.from_file(path).lookup(token) is None


def test_cli_finds_the_state_dirs_tokens_file(tmp_path, capsys) -> None:
    write_tokens_file(tmp_path / "tokens.json", [ADMIN, ME])
    assert main(["admin", "--state-dir", str(tmp_path), "users", "add", "bob"]) == 0
    capsys.readouterr()
    assert [e.user for e in read_token_entries(tmp_path / "tokens.json")] == ["admin", "me", "bob"]
    assert main(["admin", "--state-dir", str(tmp_path / "nowhere"), "users", "ls"]) == 1
    assert "run ff up there first" in capsys.readouterr().err


def test_clients_and_ff_up_skip_hashed_expired_and_revoked_entries(tmp_path) -> None:
    hashed = TokenEntry(token_sha256="a" * 64, user="bob")
    revoked_me = TokenEntry(token="fft_me", user="me", revoked=True)
    tf = TokensFile([ADMIN, hashed, revoked_me, TokenEntry(token="late", user="x", expires_at=_at(1_000_000_000))])
    assert tf.for_role("admin") == ADMIN
    assert tf.for_role("user") is None  # no plain, active user entry: a client cannot use any

    # ff up keeps the added users and makes only the missing local-user entry new
    path = write_tokens_file(tmp_path / "tokens.json", [ADMIN, hashed, revoked_me])
    out = ensure_tokens(path)
    assert out.tokens[:3] == [ADMIN, hashed, revoked_me]
    assert len(out.tokens) == 4 and out.for_role("user") == out.tokens[3]
    assert read_tokens(path) == out


def test_ff_up_makes_homes_only_with_tokens_it_holds() -> None:
    """``ff up`` asks meta WhoAmI with each user token it can send; an added (hashed) user gets
    the home on first use instead, and a revoked or expired one not at all."""
    from fireflyer.cluster.homes import home_users

    hashed = TokenEntry(token_sha256="b" * 64, user="bob")
    gone = TokenEntry(token="old", user="carol", revoked=True)
    late = TokenEntry(token="late", user="dave", expires_at=_at(1_000_000_000))
    assert home_users([ADMIN, ME, hashed, gone, late]) == [ME]


def test_the_service_role_is_never_given_to_a_user(tmp_path, capsys) -> None:
    """Issue 48 point 2: service credentials come from ff up (or a deployment's secrets) only."""
    with pytest.raises(InvalidArgument, match="never a user's"):
        plan_add([ADMIN, ME], "bob", role="service", token="t", now=T0)
    with pytest.raises(InvalidArgument, match="reserved for the cluster's service credentials"):
        plan_add([ADMIN, ME], "svc-storage", role="user", token="t", now=T0)
    path = write_tokens_file(tmp_path / "tokens.json", [ADMIN, ME])
    assert main(["admin", "users", "--tokens-file", str(path), "add", "bob", "--role", "service"]) == 1
    assert "INVALID_ARGUMENT" in capsys.readouterr().err
    assert [e.user for e in read_token_entries(path)] == ["admin", "me"]


def test_ensure_tokens_adds_a_service_credential_per_service_and_keeps_them(tmp_path) -> None:
    path = write_tokens_file(tmp_path / "tokens.json", [ADMIN, ME])
    tf = ensure_tokens(path, services=["mgmtd", "storage", "storage"])
    assert [(e.user, e.roles) for e in tf.tokens[2:]] == [("svc-mgmtd", ["service"]), ("svc-storage", ["service"])]
    assert tf.tokens[:2] == [ADMIN, ME]
    storage = tf.for_service("storage")
    assert storage is not None and storage.token not in (ADMIN.token, ME.token, tf.for_service("mgmtd").token)
    assert tf.for_role("user") == ME and tf.for_role("admin") == ADMIN  # clients never pick a service's
    again = ensure_tokens(path, services=["mgmtd", "storage"])
    assert again == tf  # kept: the services' credentials do not rotate on every ff up
