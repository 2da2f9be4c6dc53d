"""Bearer tokens, principals and role checks for gRPC calls.

Every call carries ``authorization: Bearer <token>``; the server interceptor
looks the token up in a :class:`TokenStore` and runs the handler with the
caller's :class:`Principal` in a context variable::

    @requires("admin")
    async def DrainNode(self, request, context):
        log.info("drain", by=current_principal().user)

Roles are ``user``, ``admin`` (operators) and ``service`` (the cluster's own processes:
node registration, heartbeats, chain forwarding, resync; never held by a user).  Admin and
service each imply user; neither implies the other, so a service cannot add users and an
operator's token cannot register a node or forward a chain update.  A method open to
several roles names them all: ``@requires("admin", "service")``.  The token file that
``ff up`` writes (``<state_dir>/tokens.json``, mode 0600) looks like::

    {"tokens": [{"token": "...", "user": "admin", "roles": ["admin"]},
                {"token": "...", "user": "svc-storage", "roles": ["service"]},
                {"token_sha256": "<hex>", "user": "bob", "roles": ["user"],
                 "expires_at": "2027-03-04T08:12:42Z", "revoked": false}, ...]}

(``docs/tokens.md`` has every field).  Services load it with :meth:`TokenStore.watch`, which
re-reads it when it changes, so ``ff admin users add|revoke`` needs no restart.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import functools
import hashlib
import inspect
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from fireflyer.core.errors import FireFlyerError, Internal, PermissionDenied, SettingsError, Unauthenticated

__all__ = [
    "ROLES",
    "SERVICE_ROLE",
    "Principal",
    "ANONYMOUS_ADMIN",
    "TokenEntry",
    "TokenStore",
    "ReloadingTokenStore",
    "FileSig",
    "file_sig",
    "reload_due",
    "should_reload",
    "token_state",
    "read_token_entries",
    "validate_entries",
    "generate_token",
    "write_tokens_file",
    "current_principal",
    "current_method",
    "acting_as",
    "require_role",
    "requires",
]

ROLES = frozenset({"user", "admin", "service"})
#: roles that only the cluster's own credentials carry (``ff up`` / deployment secrets), never a user
SERVICE_ROLE = "service"
# what each role grants: admin and service can each do everything a user can, not each other's calls
_IMPLIED: dict[str, frozenset[str]] = {"admin": frozenset({"admin", "user"}), "user": frozenset({"user"}),
                                       "service": frozenset({"service", "user"})}
_KNOWN = ", ".join(sorted(ROLES))


class Principal(msgspec.Struct, frozen=True):
    """Who is calling: a user name and its roles."""

    user: str
    roles: frozenset[str] = frozenset()

    def has_role(self, role: str) -> bool:
        return any(role in _IMPLIED.get(r, frozenset({r})) for r in self.roles)


#: the caller when auth is disabled (single-user development only): every call is allowed,
#: the cluster's own (service) calls included
ANONYMOUS_ADMIN = Principal("anonymous", frozenset({"admin", "user", "service"}))
#: the caller of an RPC that needs no token (health, reflection) and sent none
_ANONYMOUS = Principal("anonymous", frozenset())


class TokenEntry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One entry of a tokens file (``docs/tokens.md``).

    The secret is either ``token`` (plain, as ``ff up`` writes its admin and local-user entries,
    which clients read back) or ``token_sha256`` (its SHA-256 in hex, as ``ff admin users add``
    writes it: the secret is printed once and never stored).  ``expires_at`` absent means never;
    a ``revoked`` entry stays in the file (``ff admin users ls`` shows it) but authenticates no one.
    """

    token: str = ""
    token_sha256: str = ""
    user: str
    roles: list[str] = msgspec.field(default_factory=lambda: ["user"])
    created_at: datetime.datetime | None = None
    expires_at: datetime.datetime | None = None
    revoked: bool = False
    revoked_at: datetime.datetime | None = None

    def digest(self) -> bytes:
        return _digest(self.token) if self.token else bytes.fromhex(self.token_sha256)

    def state(self, now: float) -> str:
        """``"active"``, ``"revoked"`` or ``"expired"`` at wall-clock time ``now`` (seconds)."""
        return token_state(revoked=self.revoked, expires_at=_ts(self.expires_at), now=now)


def token_state(*, revoked: bool, expires_at: float | None, now: float) -> str:
    """Whether a token works at ``now``: revoked beats expired; an expiry is exclusive
    (a token that expires at T is refused at T)."""
    if revoked:
        return "revoked"
    if expires_at is not None and now >= expires_at:
        return "expired"
    return "active"


def _ts(when: datetime.datetime | None) -> float | None:
    return None if when is None else when.timestamp()


def _iso(when: datetime.datetime | None) -> str:
    return "-" if when is None else when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _TokenFile(msgspec.Struct):
    tokens: list[TokenEntry]


def _digest(token: str) -> bytes:
    # the store is keyed by a hash, so a lookup's timing depends on the hash,
    # never on how many leading characters of a real token a guess shares
    return hashlib.sha256(token.encode()).digest()


_HEX64 = re.compile(r"[0-9a-f]{64}")


class _Record(msgspec.Struct, frozen=True):
    principal: Principal
    expires_at: float | None
    revoked: bool
    revoked_at: datetime.datetime | None
    expires: datetime.datetime | None


def validate_entries(entries: Iterable[TokenEntry | Mapping[str, Any]], *, source: str = "<entries>"
                     ) -> dict[bytes, _Record]:
    """Check a file's entries (the rules of docs/tokens.md) and key them by token digest."""
    by_digest: dict[bytes, _Record] = {}
    for i, raw in enumerate(entries):
        entry = raw if isinstance(raw, TokenEntry) else msgspec.convert(dict(raw), TokenEntry)
        where = f"{source} entry {i}"
        if not entry.user:
            raise SettingsError(f"{where}: user must be non-empty", key="tokens", source=source)
        if bool(entry.token) == bool(entry.token_sha256):
            raise SettingsError(f"{where} (user {entry.user}): give exactly one non-empty token or token_sha256",
                                key="tokens", source=source)
        if entry.token_sha256 and not _HEX64.fullmatch(entry.token_sha256):
            raise SettingsError(f"{where} (user {entry.user}): token_sha256 must be 64 lower-case hex digits",
                                key="tokens.token_sha256", expected="sha256 hex", source=source)
        unknown = set(entry.roles) - ROLES
        if unknown:
            raise SettingsError(f"{where}: unknown roles {sorted(unknown)} (known: {_KNOWN})",
                                key="tokens.roles", expected="user|admin|service", source=source)
        for name in ("created_at", "expires_at", "revoked_at"):
            when = getattr(entry, name)
            if when is not None and when.tzinfo is None:
                raise SettingsError(f"{where} (user {entry.user}): {name} {when.isoformat()} has no time zone "
                                    "(write it as RFC 3339 with Z or an offset, e.g. 2027-01-31T00:00:00Z)",
                                    key=f"tokens.{name}", expected="RFC 3339 time with zone", source=source)
        digest = entry.digest()
        if digest in by_digest:
            raise SettingsError(f"{where}: duplicate token (user {entry.user})", key="tokens", source=source)
        by_digest[digest] = _Record(Principal(entry.user, frozenset(entry.roles)), _ts(entry.expires_at),
                                    entry.revoked, entry.revoked_at, entry.expires_at)
    return by_digest


def read_token_entries(path: str | os.PathLike[str]) -> list[TokenEntry]:
    """The entries of a tokens file (decoded and checked); SettingsError naming the file otherwise."""
    p = Path(path)
    try:
        data = msgspec.json.decode(p.read_bytes(), type=_TokenFile)
    except FileNotFoundError:
        raise SettingsError(f"tokens file {p} does not exist (ff up writes <state_dir>/tokens.json)",
                            key="auth.tokens_file", expected="path", source=str(p)) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise SettingsError(f"tokens file {p} is malformed: {e} (expected "
                            '{"tokens": [{"token": ..., "user": ..., "roles": [...]}]})',
                            key="auth.tokens_file", expected="tokens JSON", source=str(p)) from None
    validate_entries(data.tokens, source=str(p))
    return data.tokens


class TokenStore:
    """Maps bearer tokens to principals.

    A token that is revoked or past its ``expires_at`` maps to no one (:meth:`lookup` is None)
    and :meth:`rejection` says why.  :meth:`watch` builds one that follows its file.
    """

    def __init__(self, principals: Mapping[bytes, Principal | _Record], *, source: str = "<entries>") -> None:
        self._by_digest: dict[bytes, _Record] = {
            k: v if isinstance(v, _Record) else _Record(v, None, False, None, None) for k, v in principals.items()}
        self.source = source

    @classmethod
    def from_entries(cls, entries: Iterable[TokenEntry | Mapping[str, Any]], *, source: str = "<entries>") -> TokenStore:
        return cls(validate_entries(entries, source=source), source=source)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> TokenStore:
        return cls.from_entries(read_token_entries(path), source=str(path))

    @classmethod
    def watch(cls, path: str | os.PathLike[str], *, interval_s: float = 1.0) -> ReloadingTokenStore:
        """A store that re-reads ``path`` when it changes (checked at most every ``interval_s``)."""
        return ReloadingTokenStore(path, interval_s=interval_s)

    def _table(self) -> dict[bytes, _Record]:
        return self._by_digest

    def lookup(self, token: str, *, now: float | None = None) -> Principal | None:
        if not token:
            return None
        rec = self._table().get(_digest(token))
        if rec is None:
            return None
        if token_state(revoked=rec.revoked, expires_at=rec.expires_at,
                       now=time.time() if now is None else now) != "active":
            return None
        return rec.principal

    def refusal(self, token: str, *, now: float | None = None) -> tuple[str, str] | None:
        """(``"revoked"`` or ``"expired"``, why) for a known token that is refused, else None."""
        rec = self._table().get(_digest(token)) if token else None
        if rec is None:
            return None
        state = token_state(revoked=rec.revoked, expires_at=rec.expires_at, now=time.time() if now is None else now)
        if state == "revoked":
            at = f" at {_iso(rec.revoked_at)}" if rec.revoked_at else ""
            return state, f"the token of user {rec.principal.user!r} was revoked{at}"
        if state == "expired":
            return state, f"the token of user {rec.principal.user!r} expired at {_iso(rec.expires)}"
        return None

    def rejection(self, token: str, *, now: float | None = None) -> str | None:
        """Why a known token is refused (``"the token of user 'bob' was revoked at ..."``), else None."""
        found = self.refusal(token, now=now)
        return found[1] if found else None

    def authenticate(self, token: str) -> Principal | None:
        """For a wire server's ``authenticate``: the principal, None for an unknown token, and
        Unauthenticated saying so for an expired or revoked one."""
        found = self.lookup(token)
        if found is None:
            refused = self.refusal(token)
            if refused is not None:
                raise Unauthenticated(f"{refused[1]}: ask an admin for a new one (ff admin users add)",
                                      reason=refused[0])
        return found

    def __len__(self) -> int:
        return len(self._table())


class FileSig(msgspec.Struct, frozen=True):
    """What identifies one version of a file cheaply: inode (a rename makes a new one), size, mtime."""

    ino: int
    size: int
    mtime_ns: int


def file_sig(path: str | os.PathLike[str]) -> FileSig | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileSig(st.st_ino, st.st_size, st.st_mtime_ns)


def reload_due(*, now: float, last_checked: float | None, interval_s: float) -> bool:
    """Whether to stat the file again (at most every ``interval_s``)."""
    return last_checked is None or now - last_checked >= interval_s


def should_reload(loaded: FileSig | None, seen: FileSig | None) -> bool:
    """Whether the file changed since it was loaded.  A file that cannot be stat-ed right now
    (removed by hand) keeps the loaded table: dropping every token would stop the cluster."""
    return seen is not None and seen != loaded


class ReloadingTokenStore(TokenStore):
    """A :class:`TokenStore` that follows its tokens file: every lookup stats the file when the
    last check is ``interval_s`` old and re-reads it when its inode, size or mtime changed.

    A change that does not parse or validate keeps the previous table (logged once per version
    of the file), so a half-finished hand edit never locks everybody out.  Thread-safe: the
    table is swapped as one reference and one thread re-reads at a time.
    """

    def __init__(self, path: str | os.PathLike[str], *, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        sig = file_sig(self.path)
        super().__init__(validate_entries(read_token_entries(self.path), source=str(self.path)), source=str(self.path))
        self._loaded = sig
        self._last_checked: float | None = clock()
        self.reloads = 0

    def _table(self) -> dict[bytes, _Record]:
        if reload_due(now=self._clock(), last_checked=self._last_checked, interval_s=self.interval_s):
            self.check()
        return self._by_digest

    def check(self) -> bool:
        """Stat the file now and re-read it if it changed; True when a new table was loaded."""
        if not self._lock.acquire(blocking=False):
            return False  # another thread is at it: use the current table
        try:
            self._last_checked = self._clock()
            seen = file_sig(self.path)
            if not should_reload(self._loaded, seen):
                return False
            try:
                table = validate_entries(read_token_entries(self.path), source=str(self.path))
            except SettingsError as e:
                _log().warning("auth.tokens_reload_failed", path=str(self.path), error=str(e))
                self._loaded = seen  # not again until the file changes again
                return False
            self._by_digest = table
            self._loaded = seen
            self.reloads += 1
            _log().info("auth.tokens_reloaded", path=str(self.path), entries=len(table))
            return True
        finally:
            self._lock.release()


def _log() -> Any:
    from fireflyer.core.log import get_logger

    return get_logger("fireflyer.rpc.auth")


TOKEN_PREFIX = "fft_"


def generate_token() -> str:
    """A new random bearer token: ``fft_`` and 256 random bits, URL-safe.

    The prefix is there because a bare URL-safe token starts with ``-`` one time
    in 64, and ``ff admin --token -Xy...`` then reads the token as an option (a
    CI run failed that way); it also makes a leaked token easy to grep for.
    """
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def write_tokens_file(path: str | os.PathLike[str], entries: Iterable[TokenEntry | Mapping[str, Any]]) -> Path:
    """Write a tokens file atomically, readable by its owner only."""
    items = [e if isinstance(e, TokenEntry) else msgspec.convert(dict(e), TokenEntry) for e in entries]
    validate_entries(items, source=str(path))  # refuse to write what we could not read back
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = msgspec.json.format(msgspec.json.encode(_TokenFile(items)), indent=2) + b"\n"
    # temp file in the same dir + rename: a reader never sees half a file, and
    # mkstemp creates it 0600 so the secrets are never world-readable
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


# Set by the server interceptor for the duration of one call.  grpc.aio runs
# each RPC in its own task, so concurrent calls never see each other's values.
_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("ff_principal", default=None)
_method: contextvars.ContextVar[str] = contextvars.ContextVar("ff_method", default="")


def current_principal() -> Principal:
    """The caller of the RPC being handled."""
    p = _principal.get()
    if p is None:
        # a programming error on the server, not the caller's fault: INTERNAL
        raise Internal("current_principal() called outside an RPC handler served by fireflyer.rpc")
    return p


def current_method() -> str:
    """The full method name of the RPC being handled ('' outside one)."""
    return _method.get()


def require_role(role: str, *more: str, method: str | None = None) -> Principal:
    """Raise PermissionDenied unless the caller has ``role`` (or one of ``more``); returns the caller."""
    who = current_principal()
    wanted = (role, *more)
    if not any(who.has_role(r) for r in wanted):
        method = method or current_method() or "this call"
        need = repr(role) if not more else " or ".join(repr(r) for r in wanted)
        raise PermissionDenied(f"user {who.user!r} lacks role {need} required by {method}",
                               user=who.user, role="|".join(wanted), method=method)
    return who


F = TypeVar("F", bound=Callable[..., Any])


def requires(role: str, *more: str) -> Callable[[F], F]:
    """Decorate a servicer method so that only callers with ``role`` (or one of ``more``) may run it."""
    for r in (role, *more):
        if r not in ROLES:
            raise FireFlyerError(f"unknown role {r!r} (known: {_KNOWN})")

    def decorate(fn: F) -> F:
        if inspect.isasyncgenfunction(fn):
            @functools.wraps(fn)
            async def gen_wrapper(*args: Any, **kw: Any) -> Any:
                require_role(role, *more)
                async for item in fn(*args, **kw):
                    yield item

            return gen_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kw: Any) -> Any:
            require_role(role, *more)
            result = fn(*args, **kw)
            return await result if inspect.isawaitable(result) else result

        return wrapper  # type: ignore[return-value]

    return decorate


@contextlib.contextmanager
def acting_as(principal: Principal, method: str) -> Iterator[None]:
    """Run a block as ``principal`` calling ``method``: what the gRPC interceptor does around a
    handler, for transports that authenticate their own way (``fireflyer.wire.aio``)."""
    tokens = _bind(principal, method)
    try:
        yield
    finally:
        _unbind(tokens)


def _bind(principal: Principal, method: str) -> tuple[contextvars.Token[Principal | None], contextvars.Token[str]]:
    """Install the caller for one call (used by the server interceptor)."""
    return _principal.set(principal), _method.set(method)


def _unbind(tokens: tuple[contextvars.Token[Principal | None], contextvars.Token[str]]) -> None:
    try:
        _method.reset(tokens[1])
        _principal.reset(tokens[0])
    except ValueError:
        # a streaming handler finalised in another context (garbage collected
        # generator): the call's context dies with its task anyway
        pass
