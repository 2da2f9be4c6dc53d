"""NATS credentials and permissions, derived from the tokens file (``docs/nats-auth.md``).

One user table: the tokens file (``tokens.json``, :mod:`fireflyer.rpc.auth`) that gRPC
already reads.  Each usable entry becomes one NATS user:

- **name**: ``ff-`` + the first 24 hex digits of SHA-256 of the entry's token digest
  (:func:`nats_user`).  A client derives it from the token it already holds, and an entry
  written by ``ff admin users add`` (only ``token_sha256`` stored) derives the same one, so
  no NATS-specific secret exists anywhere.  It is unique per token (a user with two tokens is
  two NATS users) and reveals nothing about the token.
- **password**: the SHA-256 hex of the bearer token (:func:`nats_password`); the server
  config stores only its bcrypt hash.
- **permissions** by role (:func:`permissions_for`):

  ``service``  publish and subscribe everything, JetStream API included (the cluster's own
               processes: streams, consumers, request/reply between services);
  ``admin``    publish and subscribe ``ff.>`` (watch every cluster event, inject test events)
               and its own reply inbox; no ``>`` and no ``$JS.API`` (the system streams are
               the services' business);
  ``user``     publish and subscribe only its own namespace ``ff.user.<user>.>``
               (:func:`fireflyer.bus.subjects.user_namespace`) and subscribe its own reply
               inbox ``_INBOX.<nats user>.>`` (the client connects with that
               ``inbox_prefix``, so request/reply works and no one reads another's replies).

  A subject a process may not use is refused by the server (a permissions violation reported
  asynchronously, the connection stays).  Entries with several roles get the union.

- Revoked and expired entries get no NATS user; an entry that expires *later* stays a NATS
  user until the auth file is next written (``ff up``, ``ff admin users add|revoke``):
  nats-server's plain config users carry no expiry.

:func:`auth_config` is the pure part (entries, time -> the text of ``nats-auth.conf``);
:func:`write_auth_config` writes it 0600; :func:`nats_credentials` is what a client passes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from fireflyer.core.errors import InvalidArgument

from .subjects import user_namespace

if TYPE_CHECKING:
    from fireflyer.rpc.auth import TokenEntry

__all__ = [
    "NatsCredentials",
    "Permissions",
    "nats_user",
    "nats_password",
    "nats_credentials",
    "inbox_prefix",
    "permissions_for",
    "auth_config",
    "write_auth_config",
    "bcrypt_hash",
    "BCRYPT_COST",
]

#: bcrypt work factor of the stored password hashes.  Low on purpose: the password is a
#: 256-bit random value (the hash of a ``secrets.token_urlsafe(32)`` token), which no
#: dictionary attack can guess whatever the cost, while nats-server pays the cost on every
#: connect and reconnect of every process (a fleet reconnecting after a NATS restart).
BCRYPT_COST = 4

_INBOX = "_INBOX"


class NatsCredentials(msgspec.Struct, frozen=True):
    """What a client passes to ``nats.connect``: user, password and its reply-inbox prefix."""

    user: str
    password: str
    inbox_prefix: str

    def __repr__(self) -> str:  # never print the password
        return f"NatsCredentials(user={self.user!r})"


class Permissions(msgspec.Struct, frozen=True):
    """Allowed subjects; ``None`` for a direction means no restriction (services)."""

    publish: list[str] | None
    subscribe: list[str] | None


def _hex_digest(digest: bytes) -> str:
    return digest.hex()


def nats_user(digest: bytes) -> str:
    """The NATS user name of the token whose SHA-256 is ``digest`` (not a secret)."""
    return "ff-" + hashlib.sha256(_hex_digest(digest).encode()).hexdigest()[:24]


def nats_password(digest: bytes) -> str:
    """The NATS password of the token whose SHA-256 is ``digest``: that digest in hex."""
    return _hex_digest(digest)


def inbox_prefix(user: str) -> str:
    """The reply-inbox prefix of NATS user ``user`` (its only ``_INBOX`` subscription)."""
    return f"{_INBOX}.{user}"


def nats_credentials(token: str) -> NatsCredentials:
    """The credentials of a client holding bearer ``token``."""
    digest = hashlib.sha256(token.encode()).digest()
    user = nats_user(digest)
    return NatsCredentials(user=user, password=nats_password(digest), inbox_prefix=inbox_prefix(user))


def permissions_for(roles: Sequence[str], user: str, nuser: str) -> Permissions:
    """The permissions of Fire-Flyer ``user`` (NATS user ``nuser``) with ``roles``."""
    if "service" in roles:
        return Permissions(publish=None, subscribe=None)
    own_inbox = f"{inbox_prefix(nuser)}.>"
    pub: list[str] = []
    sub: list[str] = []
    if "admin" in roles:
        pub.append("ff.>")
        sub.append("ff.>")
    if "ff.>" not in pub:
        try:
            ns = f"{user_namespace(user)}.>"
        except InvalidArgument:  # a name that cannot be a subject token: its inbox only
            ns = ""
        if ns:
            pub.append(ns)
            sub.append(ns)
    sub.append(own_inbox)
    return Permissions(publish=pub, subscribe=sub)


def _q(s: str) -> str:
    # NATS config accepts JSON string syntax
    return json.dumps(s)


def _perm_block(p: Permissions) -> str:
    if p.publish is None and p.subscribe is None:
        return ""
    parts = []
    for key, allow in (("publish", p.publish), ("subscribe", p.subscribe)):
        if allow is not None:
            parts.append(f"{key}: {{ allow: [{', '.join(_q(s) for s in allow)}] }}")
    return ", permissions: { " + ", ".join(parts) + " }"


def auth_config(entries: Sequence[TokenEntry], *, now: float, hasher: Callable[[str], str]) -> str:
    """The ``authorization`` block giving each active entry its NATS user (pure but for ``hasher``).

    ``hasher(password) -> stored hash`` (bcrypt in :func:`bcrypt_hash`; tests pass a stub).
    No entry: a block with no users, which refuses every client (never anonymous access).
    """
    lines = ["# written by Fire-Flyer from the tokens file (docs/nats-auth.md); do not edit", "authorization {",
             "  users: ["]
    seen: set[str] = set()
    for e in entries:
        if e.state(now) != "active":
            continue
        digest = e.digest()
        nuser = nats_user(digest)
        if nuser in seen:  # the same token twice: one NATS user
            continue
        seen.add(nuser)
        perms = _perm_block(permissions_for(e.roles, e.user, nuser))
        lines.append(f"    {{ user: {_q(nuser)}, password: {_q(hasher(nats_password(digest)))}{perms} }}"
                     f"  # {e.user} ({', '.join(e.roles)})")
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def bcrypt_hash(password: str) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=BCRYPT_COST)).decode()


def write_auth_config(path: Path, entries: Sequence[TokenEntry], *, now: float) -> None:
    """Write ``path`` (mode 0600, atomically) from ``entries`` with bcrypt-hashed passwords."""
    data = auth_config(entries, now=now, hasher=bcrypt_hash).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
