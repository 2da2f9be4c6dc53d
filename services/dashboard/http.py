"""A small HTTP/1.1 server on asyncio streams: one request per connection (``Connection: close``).

Enough for a dashboard a few people open: GET with a query string, POST of a url-encoded form,
cookies.  Bodies are capped and a request must arrive within ``read_timeout_s``, so a slow or huge
client cannot hold the service.  Anything that is not a well-formed request gets a 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from http.cookies import SimpleCookie
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec

__all__ = ["Request", "Response", "serve_http", "esc", "MAX_BODY"]

MAX_BODY = 64 * 1024
MAX_HEADER_LINES = 100


def esc(value: object) -> str:
    """HTML-escape anything shown on a page (quotes too: values also land in attributes)."""
    return html.escape(str(value), quote=True)


class Request(msgspec.Struct, kw_only=True):
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    cookies: dict[str, str]
    form: dict[str, str]


class Response(msgspec.Struct, kw_only=True):
    status: int = 200
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = msgspec.field(default_factory=list)

    @classmethod
    def redirect(cls, location: str, *, cookie: str | None = None) -> Response:
        r = cls(status=303, headers=[("Location", location)])
        if cookie is not None:
            r.headers.append(("Set-Cookie", cookie))
        return r


Handler = Callable[[Request], Awaitable[Response]]


def _first(values: dict[str, list[str]]) -> dict[str, str]:
    return {k: v[0] for k, v in values.items() if v}


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    line = (await reader.readline()).decode("latin-1").strip()
    parts = line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    method, target = parts[0].upper(), parts[1]
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADER_LINES):
        h = (await reader.readline()).decode("latin-1")
        if h in ("\r\n", "\n", ""):
            break
        k, _, v = h.partition(":")
        headers[k.strip().lower()] = v.strip()
    else:
        return None
    body = b""
    if method == "POST":
        try:
            n = int(headers.get("content-length", "0"))
        except ValueError:
            return None
        if not 0 <= n <= MAX_BODY:
            return None
        body = await reader.readexactly(n)
    url = urlsplit(target)
    cookies: dict[str, str] = {}
    if "cookie" in headers:
        c: SimpleCookie = SimpleCookie()
        with contextlib.suppress(Exception):
            c.load(headers["cookie"])
        cookies = {k: m.value for k, m in c.items()}
    form = _first(parse_qs(body.decode("utf-8", "replace"))) if headers.get(
        "content-type", "").startswith("application/x-www-form-urlencoded") else {}
    return Request(method=method, path=unquote(url.path), query=_first(parse_qs(url.query)), headers=headers,
                   cookies=cookies, form=form)


def _encode(resp: Response) -> bytes:
    reason = HTTPStatus(resp.status).phrase
    head = [f"HTTP/1.1 {resp.status} {reason}", f"Content-Type: {resp.content_type}",
            f"Content-Length: {len(resp.body)}", "Connection: close", "Cache-Control: no-store",
            # pages are server-rendered with inline script and style only from us
            "Content-Security-Policy: default-src 'self'; style-src 'self' 'unsafe-inline'; "
            "script-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
            "X-Content-Type-Options: nosniff", "Referrer-Policy: same-origin"]
    head += [f"{k}: {v}" for k, v in resp.headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + resp.body


async def serve_http(handler: Handler, host: str, port: int, *, read_timeout_s: float = 10.0,
                     on_error: Callable[[BaseException], None] | None = None) -> asyncio.Server:
    """Start serving ``handler`` on ``host:port``; close the returned server to stop."""

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                req = await asyncio.wait_for(_read_request(reader), read_timeout_s)
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, UnicodeError):
                req = None
            if req is None:
                resp = Response(status=400, body=b"bad request", content_type="text/plain")
            else:
                try:
                    resp = await handler(req)
                except Exception as e:  # noqa: BLE001 -- one page fails, the server goes on
                    if on_error:
                        on_error(e)
                    resp = Response(status=500, body=f"<h1>internal error</h1><pre>{esc(e)}</pre>".encode())
            writer.write(_encode(resp))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return await asyncio.start_server(conn, host, port)
