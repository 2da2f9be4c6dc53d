"""``ff admin users``: add, list and revoke the users of a local cluster's tokens file.

The tokens file (``<state_dir>/tokens.json``, see ``docs/tokens.md``) is the user table of a
cluster that ``ff up`` started: the command edits it in place (an exclusive lock on
``tokens.json.lock``, then write a temp file and rename it over), and every service re-reads it
within about a second of the change (:class:`fireflyer.rpc.auth.ReloadingTokenStore`), so
nothing restarts.  The local NATS's users follow too: ``add`` and ``revoke`` rewrite
``nats-auth.conf`` and make nats-server reload it (:mod:`fireflyer.cluster.natsauth`).  Who may run it is who may write the file (its owner: mode 0600).

A new user's secret is generated here, printed once, and stored only as its SHA-256
(``token_sha256``); ``ff up``'s own entries (admin, the local user, the services' ``svc-<name>``
credentials) stay plain because clients and services read them from the file.  Revoking keeps
the entry, marked ``revoked`` with the time, so ``ls`` shows who had access and the token can
never come back by accident.

The ``service`` role is the cluster's own (node registration, heartbeats, chain forwarding):
only ``ff up`` (or a deployment's secret) issues it, so ``add`` refuses ``--role service`` and
names starting with ``svc-``, and ``revoke`` refuses a service credential (the services would
lose their calls to each other; to rotate one, see docs/tokens.md).

Pure parts (:func:`parse_duration`, :func:`parse_time`, :func:`plan_add`, :func:`plan_revoke`,
:func:`user_rows`) take the entries and the time and return new entries; :func:`add_user`,
:func:`revoke_user` and :func:`list_users` do the locked read-modify-write.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec

from fireflyer.cluster.natsauth import sync_nats_auth
from fireflyer.cluster.records import SERVICE_USER_PREFIX
from fireflyer.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from fireflyer.rpc.auth import SERVICE_ROLE, TokenEntry, generate_token, read_token_entries, write_tokens_file

__all__ = ["UserRow", "parse_duration", "parse_time", "valid_user_name", "parse_time_after", "plan_add", "plan_revoke",
           "user_rows", "add_user", "revoke_user", "list_users", "tokens_path"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class UserRow(msgspec.Struct, frozen=True, kw_only=True):
    """One entry as ``ff admin users ls`` shows it (never the token)."""

    user: str
    roles: list[str]
    created_at: str | None
    expires_at: str | None
    revoked_at: str | None
    state: str  # active | expired | revoked
    hashed: bool


def valid_user_name(name: str) -> bool:
    """A login-like name (it becomes ``/home/<name>``): a letter or ``_`` first, then letters,
    digits, ``_ . -``; at most 64 characters."""
    return bool(_NAME.fullmatch(name))


def parse_duration(text: str) -> float:
    """``"90d"``, ``"12h"``, ``"1h30m"``, ``"45s"``, ``"2w"``, or plain seconds (``"3600"``) -> seconds (> 0)."""
    s = text.strip().lower()
    with contextlib.suppress(ValueError):
        plain = float(s)
        if plain > 0 and plain != float("inf"):
            return plain
    pos, total = 0, 0.0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not s or pos != len(s) or total <= 0:
        raise InvalidArgument(f"bad duration {text!r}: use seconds or a number with s, m, h, d or w, e.g. 3600, 90d, 12h, 1h30m",
                              value=text, field="expires_in")
    return total


def parse_time(text: str) -> datetime.datetime:
    """An RFC 3339 / ISO 8601 time with a zone (``2027-01-31T00:00:00Z``); a bare date
    (``2027-01-31``) means its midnight UTC."""
    t = text.strip()
    try:
        when = datetime.datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidArgument(f"bad time {text!r}: use RFC 3339, e.g. 2027-01-31T00:00:00Z or 2027-01-31",
                              value=text, field="expires") from None
    if when.tzinfo is None:
        if len(t) == 10:  # a date
            return when.replace(tzinfo=datetime.UTC)
        raise InvalidArgument(f"time {text!r} has no zone: add Z (UTC) or an offset such as +08:00",
                              value=text, field="expires")
    return when


def parse_time_after(now: float, seconds: float) -> datetime.datetime:
    """``now + seconds`` as a UTC time (whole seconds, rounded up so the token lives at least that long)."""
    return _utc(now + seconds + 0.999)


def _utc(ts: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(int(ts), tz=datetime.UTC)


def _iso(when: datetime.datetime | None) -> str | None:
    return None if when is None else when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_add(entries: Sequence[TokenEntry], name: str, *, role: str, token: str, now: float,
             expires_at: datetime.datetime | None = None) -> list[TokenEntry]:
    """The entries with a new one for ``name`` (``token`` stored as its SHA-256).

    Refused: a bad name, an unknown role, an expiry not in the future, and a user who already
    has an active token (revoke it first; an expired or revoked one may be replaced)."""
    if not valid_user_name(name):
        raise InvalidArgument(f"bad user name {name!r}: start with a letter or _, then letters, digits, _ . -; "
                              "at most 64 characters", field="name", value=name)
    if role == SERVICE_ROLE:
        raise InvalidArgument("role service is the cluster's own credential, never a user's: ff up issues one "
                              "per service (svc-<name> in tokens.json), a deployment takes them from its secrets",
                              field="role", value=role)
    if role not in ("user", "admin"):
        raise InvalidArgument(f"unknown role {role!r} (known: user, admin)", field="role", value=role)
    if name.startswith(SERVICE_USER_PREFIX):
        raise InvalidArgument(f"user names starting with {SERVICE_USER_PREFIX!r} are reserved for the cluster's "
                              f"service credentials; pick another name than {name!r}", field="name", value=name)
    if expires_at is not None and expires_at.timestamp() <= now:
        raise InvalidArgument(f"expiry {_iso(expires_at)} is not in the future", field="expires",
                              value=_iso(expires_at))
    active = [e for e in entries if e.user == name and e.state(now) == "active"]
    if active:
        raise AlreadyExists(f"user {name!r} already has an active token: revoke it first "
                            f"(ff admin users revoke {name}), then add the user again", user=name)
    new = TokenEntry(token_sha256=hashlib.sha256(token.encode()).hexdigest(), user=name, roles=[role],
                     created_at=_utc(now), expires_at=expires_at)
    return [*entries, new]


def plan_revoke(entries: Sequence[TokenEntry], name: str, *, now: float) -> tuple[list[TokenEntry], int]:
    """The entries with every active token of ``name`` marked revoked, and how many.

    A service credential (role ``service``) is refused: the services run with it (FF_TOKEN of
    ``ff up``), and their calls to each other would stop."""
    out: list[TokenEntry] = []
    count = 0
    for e in entries:
        if e.user == name and e.state(now) == "active":
            if SERVICE_ROLE in e.roles:
                raise FailedPrecondition(f"user {name!r} is a service credential the services run with (FF_TOKEN "
                                         "of ff up): revoking it would stop the cluster's own calls; to rotate it, "
                                         "ff down, delete its entry from tokens.json, ff up", user=name)
            e = msgspec.structs.replace(e, revoked=True, revoked_at=_utc(now))
            count += 1
        out.append(e)
    if not count:
        known = any(e.user == name for e in entries)
        raise NotFound(f"user {name!r} has no active token" + (" (already revoked or expired)" if known else
                       " (ff admin users ls lists the users)"), user=name)
    return out, count


def user_rows(entries: Sequence[TokenEntry], *, now: float) -> list[UserRow]:
    return [UserRow(user=e.user, roles=list(e.roles), created_at=_iso(e.created_at), expires_at=_iso(e.expires_at),
                    revoked_at=_iso(e.revoked_at), state=e.state(now), hashed=not e.token) for e in entries]


def tokens_path(state_dir: str | Path | None) -> Path:
    """The tokens file of the cluster of ``state_dir`` (else FF_STATE_DIR, else ``.ff``):
    the one its ``cluster.json`` names, else ``<state_dir>/tokens.json``."""
    from fireflyer.cluster.discovery import state_dir_of
    from fireflyer.cluster.records import StatePaths, read_record

    paths = StatePaths(state_dir_of(state_dir))
    try:
        record = read_record(paths)
    except Exception:  # a broken cluster.json: the state dir's own file is still the right one
        record = None
    path = Path(record.tokens_file) if record is not None and record.tokens_file else paths.tokens
    if not path.exists():
        raise FailedPrecondition(f"no tokens file {path}: run ff up there first, or pass --state-dir DIR "
                                 "or --tokens-file PATH", path=str(path))
    return path


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # two admins adding users at once must not lose one: read-modify-write under a lock
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def add_user(path: Path, name: str, *, role: str = "user", expires_at: datetime.datetime | None = None,
             now: float | None = None) -> tuple[str, TokenEntry]:
    """Add ``name`` to the tokens file; returns (the new token, shown once; its entry)."""
    now = time.time() if now is None else now
    token = generate_token()
    with _locked(path):
        entries = plan_add(read_token_entries(path), name, role=role, token=token, now=now, expires_at=expires_at)
        write_tokens_file(path, entries)
        sync_nats_auth(path, entries, now=now)
    return token, entries[-1]


def revoke_user(path: Path, name: str, *, now: float | None = None) -> int:
    """Revoke every active token of ``name``; how many."""
    now = time.time() if now is None else now
    with _locked(path):
        entries, count = plan_revoke(read_token_entries(path), name, now=now)
        write_tokens_file(path, entries)
        # the local NATS refuses the revoked token's next connect (docs/nats-auth.md)
        sync_nats_auth(path, entries, now=now)
    return count


def list_users(path: Path, *, now: float | None = None) -> list[UserRow]:
    return user_rows(read_token_entries(path), now=time.time() if now is None else now)
