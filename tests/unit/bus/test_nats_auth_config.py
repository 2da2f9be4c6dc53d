"""The pure parts of NATS auth (fireflyer.bus.auth): credentials from a token, permissions by role,
and the authorization block made from tokens.json entries."""

from __future__ import annotations

import datetime
import hashlib

import bcrypt

from fireflyer.bus.auth import (
    BCRYPT_COST,
    auth_config,
    bcrypt_hash,
    inbox_prefix,
    nats_credentials,
    nats_password,
    nats_user,
    permissions_for,
)
from fireflyer.rpc.auth import TokenEntry

NOW = 1_800_000_000.0


def _stub(password: str) -> str:
    return f"HASH({password})"


def _sha(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def test_credentials_derive_from_the_token_alone_and_match_a_hashed_entry() -> None:
    c = nats_credentials("tok-bob")
    hashed = TokenEntry(token_sha256=hashlib.sha256(b"tok-bob").hexdigest(), user="bob")
    plain = TokenEntry(token="tok-bob", user="bob")
    assert c.user == nats_user(hashed.digest()) == nats_user(plain.digest())
    assert c.password == nats_password(hashed.digest()) == hashlib.sha256(b"tok-bob").hexdigest()
    assert c.inbox_prefix == inbox_prefix(c.user) == f"_INBOX.{c.user}"
    assert c.user.startswith("ff-") and "tok-bob" not in c.user and c.password not in c.user
    assert nats_credentials("tok-alice").user != c.user
    assert "tok" not in repr(c) and c.password not in repr(c)


def test_permissions_by_role() -> None:
    svc = permissions_for(["service"], "svc-meta", "ff-1")
    assert svc.publish is None and svc.subscribe is None
    user = permissions_for(["user"], "bob", "ff-2")
    assert user.publish == ["ff.user.bob.>"]
    assert user.subscribe == ["ff.user.bob.>", "_INBOX.ff-2.>"]
    admin = permissions_for(["admin"], "admin", "ff-3")
    assert admin.publish == ["ff.>"] and admin.subscribe == ["ff.>", "_INBOX.ff-3.>"]
    for p in (user, admin):
        assert ">" not in (p.subscribe or []) and not any(s.startswith("$JS") for s in p.publish or [])
    # a dotted user name is one subject token; a name that cannot be one gets its inbox only
    assert permissions_for(["user"], "a.b", "ff-4").publish == ["ff.user.a~b.>"]
    odd = permissions_for(["user"], "x y", "ff-5")
    assert odd.publish == [] and odd.subscribe == ["_INBOX.ff-5.>"]


def test_auth_config_has_one_user_per_active_entry() -> None:
    past = datetime.datetime.fromtimestamp(NOW - 1, datetime.UTC)
    future = datetime.datetime.fromtimestamp(NOW + 3600, datetime.UTC)
    entries = [
        TokenEntry(token="t-svc", user="svc-meta", roles=["service"]),
        TokenEntry(token="t-admin", user="admin", roles=["admin"]),
        TokenEntry(token_sha256=hashlib.sha256(b"t-bob").hexdigest(), user="bob", expires_at=future),
        TokenEntry(token="t-gone", user="carol", revoked=True),
        TokenEntry(token="t-old", user="dave", expires_at=past),
        TokenEntry(token="t-svc", user="svc-meta", roles=["service"]),  # the same token twice
    ]
    text = auth_config(entries, now=NOW, hasher=_stub)
    assert text.count("{ user:") == 3
    for tok in ("t-svc", "t-admin", "t-bob"):
        assert nats_user(_sha(tok)) in text
        assert f"HASH({nats_password(_sha(tok))})" in text
    for tok in ("t-gone", "t-old"):
        assert nats_user(_sha(tok)) not in text
    for secret in ("t-svc", "t-admin", "t-bob"):
        assert f'"{secret}"' not in text
    svc_line = next(line for line in text.splitlines() if nats_user(_sha("t-svc")) in line)
    assert "permissions" not in svc_line
    bob_line = next(line for line in text.splitlines() if nats_user(_sha("t-bob")) in line)
    assert 'publish: { allow: ["ff.user.bob.>"] }' in bob_line


def test_no_entries_means_no_users_not_anonymous_access() -> None:
    text = auth_config([], now=NOW, hasher=_stub)
    assert "authorization {" in text and "users: [" in text and "{ user:" not in text


def test_bcrypt_hash_checks_and_is_cheap() -> None:
    pw = nats_password(_sha("t"))
    h = bcrypt_hash(pw)
    assert h.startswith(f"$2b$0{BCRYPT_COST}$") and bcrypt.checkpw(pw.encode(), h.encode())
