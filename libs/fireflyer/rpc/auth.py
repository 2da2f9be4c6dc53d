"""Bearer tokens, principals and role checks for gRPC calls.

Every call carries ``authorization: Bearer <token>``; the server interceptor
looks the token up in a :class:`TokenStore` and runs the handler with the
caller's :class:`Principal` in a context variable::

    @requires("admin")
    async def DrainNode(self, request, context):
        log.info("drain", by=current_principal().user)

Roles are ``user`` and ``admin``; admin implies user.  The token file that
``ff up`` writes (``<state_dir>/tokens.json``, mode 0600) looks like::

    {"tokens": [{"token": "...", "user": "admin", "roles": ["admin"]}, ...]}
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import inspect
import os
import secrets
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from fireflyer.core.errors import FireFlyerError, Internal, PermissionDenied, SettingsError

__all__ = [
    "ROLES",
    "Principal",
    "ANONYMOUS_ADMIN",
    "TokenEntry",
    "TokenStore",
    "generate_token",
    "write_tokens_file",
    "current_principal",
    "current_method",
    "acting_as",
    "require_role",
    "requires",
]

ROLES = frozenset({"user", "admin"})
# what each role grants: admin can do everything a user can
_IMPLIED: dict[str, frozenset[str]] = {"admin": frozenset({"admin", "user"}), "user": frozenset({"user"})}


class Principal(msgspec.Struct, frozen=True):
    """Who is calling: a user name and its roles."""

    user: str
    roles: frozenset[str] = frozenset()

    def has_role(self, role: str) -> bool:
        return any(role in _IMPLIED.get(r, frozenset({r})) for r in self.roles)


#: the caller when auth is disabled (single-user development only)
ANONYMOUS_ADMIN = Principal("anonymous", frozenset({"admin", "user"}))
#: the caller of an RPC that needs no token (health, reflection) and sent none
_ANONYMOUS = Principal("anonymous", frozenset())


class TokenEntry(msgspec.Struct, frozen=True, kw_only=True):
    token: str
    user: str
    roles: list[str] = msgspec.field(default_factory=lambda: ["user"])


class _TokenFile(msgspec.Struct):
    tokens: list[TokenEntry]


def _digest(token: str) -> bytes:
    # the store is keyed by a hash, so a lookup's timing depends on the hash,
    # never on how many leading characters of a real token a guess shares
    return hashlib.sha256(token.encode()).digest()


class TokenStore:
    """Maps bearer tokens to principals; immutable once built."""

    def __init__(self, principals: Mapping[bytes, Principal], *, source: str = "<entries>") -> None:
        self._by_digest = dict(principals)
        self.source = source

    @classmethod
    def from_entries(cls, entries: Iterable[TokenEntry | Mapping[str, Any]], *, source: str = "<entries>") -> TokenStore:
        by_digest: dict[bytes, Principal] = {}
        for i, raw in enumerate(entries):
            entry = raw if isinstance(raw, TokenEntry) else msgspec.convert(dict(raw), TokenEntry)
            where = f"{source} entry {i}"
            if not entry.token or not entry.user:
                raise SettingsError(f"{where}: token and user must be non-empty", key="tokens", source=source)
            unknown = set(entry.roles) - ROLES
            if unknown:
                raise SettingsError(f"{where}: unknown roles {sorted(unknown)} (known: user, admin)",
                                    key="tokens.roles", expected="user|admin", source=source)
            digest = _digest(entry.token)
            if digest in by_digest:
                raise SettingsError(f"{where}: duplicate token (user {entry.user})", key="tokens", source=source)
            by_digest[digest] = Principal(entry.user, frozenset(entry.roles))
        return cls(by_digest, source=source)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> TokenStore:
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
        return cls.from_entries(data.tokens, source=str(p))

    def lookup(self, token: str) -> Principal | None:
        return self._by_digest.get(_digest(token)) if token else None

    def __len__(self) -> int:
        return len(self._by_digest)


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
    TokenStore.from_entries(items, source=str(path))  # refuse to write what we could not read back
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


def require_role(role: str, *, method: str | None = None) -> Principal:
    """Raise PermissionDenied unless the caller has ``role``; returns the caller."""
    who = current_principal()
    if not who.has_role(role):
        method = method or current_method() or "this call"
        raise PermissionDenied(f"user {who.user!r} lacks role {role!r} required by {method}",
                               user=who.user, role=role, method=method)
    return who


F = TypeVar("F", bound=Callable[..., Any])


def requires(role: str) -> Callable[[F], F]:
    """Decorate a servicer method so that only callers with ``role`` may run it."""
    if role not in ROLES:
        raise FireFlyerError(f"unknown role {role!r} (known: user, admin)")

    def decorate(fn: F) -> F:
        if inspect.isasyncgenfunction(fn):
            @functools.wraps(fn)
            async def gen_wrapper(*args: Any, **kw: Any) -> Any:
                require_role(role)
                async for item in fn(*args, **kw):
                    yield item

            return gen_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kw: Any) -> Any:
            require_role(role)
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
