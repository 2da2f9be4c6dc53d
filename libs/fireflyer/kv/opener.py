"""``open_kv`` / ``aopen_kv``: the store a URL names, on the backend it names.

Above the backends (``fireflyer.kv.sqlite``, ``fireflyer.kv.postgres``, imported when a URL
names one), which are above :mod:`.api`: the one module that knows every backend, so none
of them imports back.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qsl

from fireflyer.core.log import get_logger

from .api import KV
from .errors import KVInvalidArgument, KVUnavailable

__all__ = ["open_kv", "aopen_kv"]


_COMMON = {
    "max_retries": int,
    "backoff_base_s": float,
    "backoff_max_s": float,
    "idempotency_expiry_s": float,
    "idempotency_gc_interval_s": float,
}
_SQLITE = {"synchronous": str, "busy_timeout_s": float, "max_txn_age_s": float, "pool_size": int}
_POSTGRES = {"schema": str, "pool_size": int, "connect_timeout_s": float}


def _url_options(query: str, allowed: dict[str, type]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Split a URL query into our options (typed) and the rest (passed to the driver)."""
    ours: dict[str, Any] = {}
    rest: list[tuple[str, str]] = []
    for k, v in parse_qsl(query, keep_blank_values=True):
        if k in allowed:
            try:
                ours[k] = allowed[k](v)
            except ValueError as e:
                raise KVInvalidArgument(f"URL option {k}={v!r} is not a {allowed[k].__name__}", key=k) from e
        else:
            rest.append((k, v))
    return ours, rest


def open_kv(url: str, **options: Any) -> KV:
    """Open (creating tables if missing) the store at ``url``.

    - ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` (SQLAlchemy's
      convention), ``sqlite://:memory:`` (a private temporary file, removed on close:
      a real in-memory database cannot give each thread its own snapshot);
      options ``synchronous`` (NORMAL), ``busy_timeout_s``, ``max_txn_age_s``, ``pool_size``.
    - ``postgresql://user@host:port/db?schema=name`` (also ``postgres://``); options
      ``schema``, ``pool_size``, ``connect_timeout_s``; other query items go to libpq.

    Options come from the URL query or keyword arguments (keywords win); both take
    ``max_retries``, ``backoff_base_s``, ``backoff_max_s``, ``idempotency_expiry_s``,
    ``idempotency_gc_interval_s`` and ``clock``.
    """
    if not isinstance(url, str):
        raise KVInvalidArgument("KV url must be a str", type=type(url).__name__)
    if url.startswith("sqlite://"):
        from .sqlite import SqliteKV

        rest = url[len("sqlite://") :]
        path, _, query = rest.partition("?")
        ours, unknown = _url_options(query, {**_COMMON, **_SQLITE})
        if unknown:
            raise KVInvalidArgument(f"unknown sqlite URL options {[k for k, _ in unknown]}", url=url)
        if path in (":memory:", "/:memory:"):
            return SqliteKV(None, **{**ours, **options})
        if not path.startswith("/") or len(path) < 2:
            raise KVInvalidArgument("sqlite URL needs a path: sqlite:///rel.db or sqlite:////abs.db", url=url)
        return SqliteKV(path[1:], **{**ours, **options})
    if url.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresKV  # (psycopg is imported only for a PostgreSQL URL)

        base, _, query = url.partition("?")
        ours, rest = _url_options(query, {**_COMMON, **_POSTGRES})
        dsn = base + ("?" + "&".join(f"{k}={v}" for k, v in rest) if rest else "")
        return PostgresKV(dsn, **{**ours, **options})
    raise KVInvalidArgument(
        "unsupported KV url; use sqlite:///path.db, sqlite://:memory: or postgresql://...",
        url=url.split("@")[-1],
    )


async def aopen_kv(url: str, *, wait_s: float = 15.0, **options: Any) -> KV:
    """Open a KV from asyncio, retrying ``KVUnavailable`` with backoff for up to ``wait_s``.

    Services start together with their store: a PostgreSQL server may still be starting, a
    restarted process may find a SQLite file still locked by the one it replaces.  A store that
    stays unavailable past ``wait_s`` raises the last error.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    delay = 0.05
    while True:
        try:
            return await asyncio.to_thread(open_kv, url, **options)
        except KVUnavailable as e:
            if loop.time() + delay > deadline:
                raise
            get_logger(__name__).warning("kv.open_retry", url=_redact(url), error=str(e), delay_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


def _redact(url: str) -> str:
    """The URL without a password, for logs."""
    head, sep, tail = url.partition("@")
    if not sep or "://" not in head:
        return url
    scheme, _, userinfo = head.partition("://")
    return f"{scheme}://{userinfo.split(':', 1)[0]}@{tail}"
