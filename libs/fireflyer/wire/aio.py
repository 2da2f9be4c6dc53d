"""The data-plane protocol on an event loop: small request/response calls without gRPC.

    server = AioWireServer(handle, authenticate=tokens.lookup, host="127.0.0.1")
    port = await server.start()                 # async def handle(req: AioRequest) -> bytes
    conn = await AioConnection.connect("127.0.0.1", port, token=token)
    reply = await conn.request("Stat", payload=request_bytes, timeout_s=5.0)

:class:`~.server.WireServer` and :class:`~.client.Connection` move bulk payloads with a
thread per connection, receiving straight into the caller's buffers.  A control-plane
service whose handlers already run on its event loop (meta: a stat is a few hundred
microseconds of store work) pays more for a call's transport than for its work: gRPC's
Python stack was about two thirds of the meta server's CPU per call.  These are the same
frames (:mod:`.frame`), the same hello/welcome handshake and the same error frames, carried
by ``asyncio.Protocol`` objects, so a call costs one frame parse and one task on each side.

Semantics, as for the threaded peers:

- the client's first frame is ``hello`` with a bearer token; ``authenticate(token)`` maps it to
  a principal, and ``None`` rejects the connection with an ``Unauthenticated`` error frame;
- every request runs the handler in its own task (requests on one connection overlap); what it
  returns is the response payload; a :class:`FireFlyerError` it raises goes back as an error
  frame and is raised again, same type and fields, in the caller; anything else is logged and
  answered with ``Internal``.  The connection stays open either way;
- a connection with ``max_inflight`` requests running stops being read until one finishes
  (flow control: a client cannot queue unbounded work in the server);
- a bad frame closes that connection with a ``wire.frame_rejected`` warning; a connection that
  closes fails its caller's outstanding requests with ``Unavailable`` naming the peer;
- a request that carries a trace context runs in a SERVER span under it; one without does not
  (see :mod:`.server` for why).

Payloads are read into memory: this transport is for requests of kilobytes, not chunks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, cast

from opentelemetry.trace import SpanKind, Status, StatusCode

from fireflyer.core.errors import (
    DeadlineExceeded,
    FireFlyerError,
    Internal,
    ProtocolError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    error_from_dict,
)
from fireflyer.core.log import get_logger
from fireflyer.core.netaddr import dial_address
from fireflyer.telemetry import extract, inject, tracer

from .frame import (
    PREFIX,
    ErrorFrame,
    FrameLimits,
    Header,
    Hello,
    Request,
    Response,
    Welcome,
    decode_header,
    encode_head,
    hello_problem,
    parse_prefix,
)
from .reauth import Reauth
from .server import principal_key

__all__ = ["AioWireServer", "AioConnection", "AioRequest", "AioHandler", "FrameSplitter"]

log = get_logger(__name__)

#: requests one connection may have running before the server stops reading it
DEFAULT_MAX_INFLIGHT = 256


class FrameSplitter:
    """Cuts a byte stream into frames (pure: no I/O).  ``feed`` returns the frames completed by
    ``data``; a frame that breaks the protocol or ``limits`` raises :class:`ProtocolError`."""

    __slots__ = ("_buf", "_limits")

    def __init__(self, limits: FrameLimits) -> None:
        self._buf = bytearray()
        self._limits = limits

    def feed(self, data: bytes) -> list[tuple[Header, bytes]]:
        buf = self._buf
        buf += data
        frames: list[tuple[Header, bytes]] = []
        pos, end = 0, len(buf)
        while end - pos >= PREFIX.size:
            # checked before anything is buffered for it: an oversized frame costs 20 bytes
            header_len, payload_len = parse_prefix(buf[pos:pos + PREFIX.size], self._limits)
            start = pos + PREFIX.size
            stop = start + header_len + payload_len
            if stop > end:
                break
            header = decode_header(buf[start:start + header_len])
            frames.append((header, bytes(buf[start + header_len:stop])))
            pos = stop
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)


def _frame(header: Header, payload: bytes = b"") -> bytearray:
    out = encode_head(header, len(payload))
    out += payload
    return out


class AioRequest:
    """One request as the handler sees it."""

    __slots__ = ("op", "rid", "meta", "payload", "principal", "peer", "trace")

    def __init__(self, header: Request, payload: bytes, principal: Any, peer: str) -> None:
        self.op = header.op
        self.rid = header.rid
        self.meta = header.meta
        self.payload = payload
        self.principal = principal
        self.peer = peer
        self.trace = header.trace


AioHandler = Callable[[AioRequest], Awaitable[bytes]]


class _ServerProtocol(asyncio.Protocol):
    def __init__(self, server: AioWireServer) -> None:
        self.server = server
        self.splitter = FrameSplitter(server.limits)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.principal: Any = None
        self.reauth: Reauth | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        #: requests read while ``max_inflight`` were running: started as running ones finish
        self.backlog: collections.deque[tuple[Request, bytes]] = collections.deque()
        self.paused = False
        self._handshake_timer: asyncio.TimerHandle | None = None
        #: armed while a frame is partly received: the frame must be whole before it fires
        self._frame_timer: asyncio.TimerHandle | None = None
        #: the per-user cap's key once authenticated (None: uncapped)
        self.key: str | None = None

    # -- connection life ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        server = self.server
        server._conns.add(self)
        if len(server._conns) > server.max_connections:
            log.info("wire.conn_refused", reason="node_limit", peer=self.peer, server=server.name,
                     limit=server.max_connections)
            self._close_with(ErrorFrame(rid=0, error=ResourceExhausted(
                f"{server.name} has {server.max_connections} connections open, its limit; close idle connections "
                f"or retry later", reason="node_limit", limit=server.max_connections, server=server.name).to_dict()))
            return
        self._handshake_timer = asyncio.get_running_loop().call_later(
            server.handshake_timeout_s, self._handshake_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._conns.discard(self)
        if self.key is not None:
            self.server._unkey(self.key)
            self.key = None
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self._frame_timer is not None:
            self._frame_timer.cancel()
        self.backlog.clear()
        for task in self.tasks:  # nobody is left to read their answers
            task.cancel()
        log.debug("wire.conn_closed", peer=self.peer, server=self.server.name)

    def _handshake_expired(self) -> None:
        if self.principal is None:
            self._reject(ProtocolError(f"no hello within {self.server.handshake_timeout_s}s",
                                       reason="handshake_timeout"))

    def _reject(self, err: FireFlyerError) -> None:
        log.warning("wire.frame_rejected", reason=err.fields.get("reason") or err.kind, peer=self.peer,
                    error=str(err), server=self.server.name)
        self._close_with(ErrorFrame(rid=0, error=err.to_dict()))

    def _close_with(self, frame: ErrorFrame) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_frame(frame))
            self.transport.close()

    # -- frames -----------------------------------------------------------------------------
    def _frame_expired(self) -> None:
        self._frame_timer = None
        if self.splitter.buffered:
            self._reject(DeadlineExceeded(
                f"{self.peer} did not complete a frame within {self.server.frame_timeout_s}s",
                peer=self.peer, reason="frame_timeout", timeout_s=self.server.frame_timeout_s))

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.splitter.feed(data)
        except ProtocolError as e:
            self._reject(e)
            return
        timeout = self.server.frame_timeout_s
        if timeout is not None:
            # a frame that has started (bytes buffered) must be whole within the deadline; one
            # completed here restarts it for the next
            if self._frame_timer is not None and (frames or not self.splitter.buffered):
                self._frame_timer.cancel()
                self._frame_timer = None
            if self.splitter.buffered and self._frame_timer is None:
                self._frame_timer = asyncio.get_running_loop().call_later(timeout, self._frame_expired)
        for header, payload in frames:
            if self.transport is None or self.transport.is_closing():
                return
            if self.principal is None:
                self._hello(header, payload)
            elif isinstance(header, Request):
                self._start(header, payload)
            else:
                self._reject(ProtocolError(f"a client may not send a {type(header).__name__} frame",
                                           reason="unexpected_frame"))

    def _hello(self, header: Header, payload: bytes) -> None:
        problem = hello_problem(header, len(payload))
        if problem is not None or not isinstance(header, Hello):
            self._reject(problem or ProtocolError("the first frame must be a hello", reason="expected_hello"))
            return
        try:
            principal = self.server.authenticate(header.token)
        except Unauthenticated as e:  # the authenticator says why (revoked, expired)
            principal, why = None, str(e)
        except Exception as e:  # an authenticator bug rejects the client, it does not crash the loop
            log.exception("wire.auth_failed", peer=self.peer)
            principal, why = None, f"authenticator failed: {type(e).__name__}"
        else:
            why = "invalid or expired token"
        if principal is None:
            log.warning("wire.auth_rejected", reason="bad_token", peer=self.peer, client=header.client)
            err = Unauthenticated(f"connection rejected by {self.server.name}: {why}", peer=self.peer,
                                  server=self.server.name)
            self._close_with(ErrorFrame(rid=0, error=err.to_dict()))
            return
        key = principal_key(principal)
        if key is not None:
            server = self.server
            if server._per_user.get(key, 0) >= server.max_connections_per_user:
                log.info("wire.conn_refused", reason="user_limit", peer=self.peer, user=key, server=server.name,
                         limit=server.max_connections_per_user)
                self._close_with(ErrorFrame(rid=0, error=ResourceExhausted(
                    f"{key} has {server.max_connections_per_user} connections open to {server.name}, the per-user "
                    f"limit; close idle connections or retry later", reason="user_limit", user=key,
                    limit=server.max_connections_per_user, server=server.name).to_dict()))
                return
            server._per_user[key] = server._per_user.get(key, 0) + 1
            self.key = key
        self.principal = principal
        self.reauth = Reauth(self.server.authenticate, header.token, server=self.server.name)
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        assert self.transport is not None
        self.transport.write(_frame(Welcome(principal=str(principal), server=self.server.name)))

    def _start(self, header: Request, payload: bytes) -> None:
        # one read may carry many requests: past the limit they wait here, and reading stops
        # until the backlog drains, so a client cannot queue more than a read's worth
        if len(self.tasks) >= self.server.max_inflight:
            self.backlog.append((header, payload))
            if not self.paused:
                self.paused = True
                assert self.transport is not None
                self.transport.pause_reading()
            return
        req = AioRequest(header, payload, self.principal, self.peer)
        task = asyncio.get_running_loop().create_task(self._serve(req))
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if self.transport is None or self.transport.is_closing():
            return
        while self.backlog and len(self.tasks) < self.server.max_inflight:
            self._start(*self.backlog.popleft())
        if self.paused and not self.backlog and len(self.tasks) < self.server.max_inflight:
            self.paused = False
            self.transport.resume_reading()

    async def _serve(self, req: AioRequest) -> None:
        server = self.server
        if server.trace_requests and req.trace:
            with server._tracer.start_as_current_span(
                f"wire.{req.op}", context=extract(req.trace), kind=SpanKind.SERVER,
                attributes={"wire.op": req.op, "wire.payload_bytes": len(req.payload), "net.peer.name": self.peer},
            ) as span:
                frame = await self._call(req)
                if isinstance(frame[0], ErrorFrame):
                    span.set_status(Status(StatusCode.ERROR, frame[0].error.get("message", "")))
        else:
            frame = await self._call(req)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_frame(*frame))

    async def _call(self, req: AioRequest) -> tuple[Header, bytes]:
        refused = self.reauth.check() if self.reauth is not None else None
        if refused is not None:  # revoked or expired since the hello
            return ErrorFrame(rid=req.rid, error=refused.to_dict()), b""
        try:
            out = await self.server.handler(req)
        except FireFlyerError as e:
            return ErrorFrame(rid=req.rid, error=e.to_dict()), b""
        except Exception as e:
            log.exception("wire.handler_failed", op=req.op, peer=self.peer)
            err = Internal(f"{self.server.name} handler for {req.op!r} failed: {type(e).__name__}: {e}", op=req.op)
            return ErrorFrame(rid=req.rid, error=err.to_dict()), b""
        if not isinstance(out, bytes | bytearray | memoryview):  # a handler bug: answer it, do not hang the caller
            log.error("wire.handler_bad_result", op=req.op, peer=self.peer, type=type(out).__name__)
            err = Internal(f"{self.server.name} handler for {req.op!r} returned {type(out).__name__}, not bytes",
                           op=req.op)
            return ErrorFrame(rid=req.rid, error=err.to_dict()), b""
        return Response(rid=req.rid), bytes(out)


class AioWireServer:
    """Serves framed requests on the running event loop (see the module doc)."""

    def __init__(self, handler: AioHandler, *, authenticate: Callable[[str], Any], host: str = "127.0.0.1",
                 port: int = 0, name: str = "wire-aio", limits: FrameLimits | None = None,
                 handshake_timeout_s: float = 5.0, max_inflight: int = DEFAULT_MAX_INFLIGHT,
                 trace_requests: bool = True, frame_timeout_s: float | None = 5.0, max_connections: int = 1024,
                 max_connections_per_user: int = 256) -> None:
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
        if max_connections < 1 or max_connections_per_user < 1:
            raise ValueError("max_connections and max_connections_per_user must be >= 1")
        #: a frame whose first bytes arrived must be whole within this (None: no deadline)
        self.frame_timeout_s = frame_timeout_s
        #: connections open at once / authenticated ones of one user (see :class:`~.server.WireServer`)
        self.max_connections = max_connections
        self.max_connections_per_user = max_connections_per_user
        self._per_user: dict[str, int] = {}
        self.handler = handler
        self.authenticate = authenticate
        self.host = host
        self._port = port
        self.name = name
        # control-plane requests are small: a megabyte is far above any metadata call
        self.limits = limits or FrameLimits(max_payload_bytes=1 << 20)
        self.handshake_timeout_s = handshake_timeout_s
        self.max_inflight = max_inflight
        self.trace_requests = trace_requests
        self._tracer = tracer("fireflyer.wire")
        self._server: asyncio.Server | None = None
        self._conns: set[_ServerProtocol] = set()

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        """``host:port`` as clients should dial it (a wildcard bind is reachable on loopback; an
        IPv6 wildcard listens IPv6-only, so on ``::1``).  With ``host=""`` asyncio opens one
        listener per address family, each on its own port when ``port`` is 0: this is the first."""
        return dial_address(self.host, self._port)

    def connection_count(self) -> int:
        return len(self._conns)

    def _unkey(self, key: str) -> None:
        left = self._per_user.get(key, 1) - 1
        if left > 0:
            self._per_user[key] = left
        else:
            self._per_user.pop(key, None)

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(lambda: _ServerProtocol(self), self.host, self._port,
                                                    reuse_address=True)
        except OSError as e:
            raise Unavailable(f"{self.name}: cannot listen on {self.host}:{self._port}: {e.strerror or e}",
                              host=self.host, port=self._port) from None
        self._port = self._server.sockets[0].getsockname()[1]
        log.info("wire.listening", server=self.name, host=self.host, port=self._port)
        return self._port

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop accepting; give requests already running up to ``grace_s`` to answer; then close
        every connection (their callers see Unavailable and, for meta, retry elsewhere)."""
        if self._server is None:
            return
        self._server.close()
        running = [t for conn in self._conns for t in conn.tasks]
        if running and grace_s > 0:
            _, late = await asyncio.wait(running, timeout=grace_s)
            if late:
                log.warning("wire.stop_cancelled_requests", server=self.name, requests=len(late))
        for conn in list(self._conns):
            if conn.transport is not None:
                conn.transport.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5.0)
        self._server = None
        log.info("wire.stopped", server=self.name, port=self._port)


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, conn: AioConnection) -> None:
        self.conn = conn
        self.splitter = FrameSplitter(conn.limits)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        try:
            frames = self.splitter.feed(data)
        except ProtocolError as e:
            conn._fail(e)
            return
        for header, payload in frames:
            if isinstance(header, Response | ErrorFrame) and header.rid:
                fut = conn._pending.pop(header.rid, None)
                if fut is None or fut.done():  # the caller gave up (timeout, cancel)
                    continue
                if isinstance(header, Response):
                    fut.set_result(payload)
                else:
                    fut.set_exception(error_from_dict(header.error))
            elif isinstance(header, Welcome) and conn._welcome is not None and not conn._welcome.done():
                conn._welcome.set_result(header)
            elif isinstance(header, ErrorFrame):  # rid 0: the server gave up on this connection
                conn._fail(error_from_dict(header.error))
            else:
                conn._fail(ProtocolError(f"unexpected {type(header).__name__} frame from {conn.peer}",
                                         reason="unexpected_frame", peer=conn.peer))

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._fail(Unavailable(f"connection to {self.conn.peer} closed", peer=self.conn.peer))


class AioConnection:
    """One authenticated connection; many requests in flight, matched by request id."""

    def __init__(self, peer: str, limits: FrameLimits) -> None:
        self.peer = peer
        self.limits = limits
        self.principal = ""
        self.server = ""
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._welcome: asyncio.Future[Welcome] | None = None
        self._next_rid = 1
        self._failure: FireFlyerError | None = None

    @classmethod
    async def connect(cls, host: str, port: int, *, token: str, timeout_s: float = 10.0, client_name: str = "",
                      limits: FrameLimits | None = None) -> AioConnection:
        """Connect and authenticate; Unavailable when nothing listens, Unauthenticated for a bad token."""
        conn = cls(f"{host}:{port}", limits or FrameLimits(max_payload_bytes=1 << 20))
        loop = asyncio.get_running_loop()
        conn._welcome = loop.create_future()
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    await loop.create_connection(lambda: _ClientProtocol(conn), host, port)
                except OSError as e:
                    raise Unavailable(f"cannot connect to {conn.peer}: {e.strerror or e}", peer=conn.peer) from None
                assert conn._transport is not None
                conn._transport.write(_frame(Hello(token=token, client=client_name)))
                welcome = await conn._welcome
        except TimeoutError:
            conn.close()
            raise DeadlineExceeded(f"connecting to {conn.peer} took over {timeout_s}s", peer=conn.peer) from None
        except BaseException:
            conn.close()
            raise
        conn.principal, conn.server = welcome.principal, welcome.server
        return conn

    @property
    def closed(self) -> bool:
        return self._failure is not None

    def outstanding(self) -> int:
        return len(self._pending)

    async def request(self, op: str, payload: bytes = b"", *, meta: dict[str, Any] | None = None,
                      timeout_s: float | None = None) -> bytes:
        """Send one request and wait for its payload; the server's error is raised as it was raised."""
        if self._failure is not None:
            raise self._failure
        assert self._transport is not None
        rid = self._next_rid
        self._next_rid += 1
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        trace: dict[str, str] = {}
        inject(trace)
        self._transport.write(_frame(Request(rid=rid, op=op, meta=meta or {}, trace=trace), payload))
        try:
            if timeout_s is None:
                return await fut
            scope = asyncio.timeout(timeout_s)
            try:
                async with scope:
                    return await fut
            except TimeoutError:
                if not scope.expired():
                    raise  # the server's own DeadlineExceeded (a TimeoutError): keep its message and fields
                raise DeadlineExceeded(f"{op} to {self.peer} got no answer within {timeout_s}s", peer=self.peer,
                                       op=op) from None
        finally:
            self._pending.pop(rid, None)

    def _fail(self, err: FireFlyerError) -> None:
        if self._failure is None:
            self._failure = err
        if self._welcome is not None and not self._welcome.done():
            self._welcome.set_exception(err)
            # connect() may already have given up on it (refused, timed out): mark it retrieved so
            # asyncio does not report an unretrieved exception; an awaiting connect() still gets it
            self._welcome.exception()
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def close(self) -> None:
        self._fail(Unavailable(f"connection to {self.peer} was closed by this client", peer=self.peer))

    async def __aenter__(self) -> AioConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
