"""The data-plane server: a thread per connection, a handler per request.

    def handle(req: ServerRequest) -> None:
        data = req.recv_payload(into=my_buffer)       # zero copy into the handler's own buffer
        req.reply(result_view, meta={"version": 3})   # header + payload, sent zero copy
        req.reply([head_view, FileRegion(fd, 0, n)])  # or several parts: buffers and file regions

    server = WireServer(handle, authenticate=tokens.lookup)   # lookup(token) -> principal | None
    port = server.start()
    ...
    server.stop()

Connection life: the client's first frame must be ``hello`` with a bearer token (and no
payload), which ``authenticate`` maps to a principal (anything; ``None`` rejects).  Until then the
connection has no thread: the accept thread reads the hellos of all new connections in one
``selectors`` loop and closes those that take over ``handshake_timeout_s``.  A rejected client
gets an ``error`` frame (Unauthenticated) and the connection is closed; one over the node's or its
user's connection cap gets ``ResourceExhausted`` (see :class:`WireServer`).  After that every
frame is a ``req``; the connection's own thread reads its header and calls the handler, which may
receive the payload into a buffer of its choosing (``recv_payload``; without one, the server
allocates it once the payload's first byte arrives, within its :class:`PayloadBudget`) and reply
(``reply``).  A frame that has started must be whole within ``frame_timeout_s`` (plus its payload
at ``min_payload_rate``).

What the server does for the handler, so handlers stay short:

- a payload the handler did not receive is read and dropped (the stream must stay framed);
- a handler that returns without replying sends an empty response, unless it called ``defer()``
  and replies later from another thread (``reply`` is thread-safe);
- a :class:`FireFlyerError` raised by the handler goes back as an ``error`` frame and is raised
  again, same type and fields, in the client; any other exception is logged and goes back as
  ``Internal``.  Either way the connection stays open;
- the handler runs inside a SERVER span whose parent is the trace context the client sent; a
  request sent without one (an untraced caller) runs without a span: a root span per data-plane
  request would be a trace nobody asked for, and costs a noticeable share of a small request.

Requests on one connection are handled one after the other (the payloads arrive in order on one
stream); clients that want parallel handling open several connections.

A bad frame (bad magic or version, a size over the limits, an undecodable header, a frame type a
client must not send, a peer that closes or stalls inside a frame) closes *that* connection with
a ``wire.frame_rejected`` warning naming the reason and the peer; other connections go on.  A
client that goes away (a clean close between frames, or a reset: ``Connection reset by peer``)
is routine: ``wire.conn_closed`` / ``wire.conn_lost`` at DEBUG.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from fireflyer.core.errors import (
    FailedPrecondition,
    FireFlyerError,
    Internal,
    InvalidArgument,
    ProtocolError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from fireflyer.core.log import get_logger
from fireflyer.telemetry import extract, tracer

from .conn import FileRegion, FramedSocket, Idle, Part, PeerClosed, _timeval, as_bytes_view, tune_socket
from .frame import (
    PREFIX,
    ErrorFrame,
    FrameLimits,
    Hello,
    Request,
    Response,
    Welcome,
    crc32,
    decode_frame_head,
    encode_head,
    hello_problem,
)
from .reauth import Reauth

__all__ = ["WireServer", "ServerRequest", "Handler", "Authenticate", "PayloadBudget", "principal_key"]

log = get_logger(__name__)

#: maps a bearer token to a principal (user name, or a richer object); None rejects it
Authenticate = Callable[[str], Any]
Handler = Callable[["ServerRequest"], None]

_EMPTY = memoryview(b"")


class ServerRequest:
    """One request as its handler sees it."""

    __slots__ = ("op", "rid", "meta", "size", "principal", "peer", "_conn", "_crc",
                 "_consumed", "_replied", "_deferred")

    def __init__(self, conn: _ServerConn, header: Request, size: int) -> None:
        self.op = header.op
        self.rid = header.rid
        self.meta = header.meta
        #: payload bytes that follow the header
        self.size = size
        self.principal = conn.principal
        self.peer = conn.fs.peer
        self._conn = conn
        self._crc = header.crc32
        self._consumed = size == 0
        self._replied = False
        self._deferred = False

    def recv_payload(self, into: Any = None) -> memoryview:
        """Receive the payload into ``into`` (any writable buffer of at least ``size`` bytes;
        a new bytearray when None) and return the view of the bytes received.

        Verifies the client's ``crc32`` when it sent one (ProtocolError ``checksum_mismatch``).
        """
        if self._consumed and self.size:
            raise FailedPrecondition("request payload was already received", op=self.op, rid=self.rid)
        if into is None:
            # allocate for a payload only once it is arriving, and within the server's budget:
            # a header's word alone (64 MiB!) costs nothing
            if self.size:
                self._conn.fs.wait_payload()
            self._conn.lease(self.size, op=self.op)
            view = memoryview(bytearray(self.size))
        else:
            view = as_bytes_view(into, writable=True)
            if len(view) < self.size:
                raise InvalidArgument(f"buffer of {len(view)} bytes for a payload of {self.size}",
                                      op=self.op, size=self.size, buffer=len(view))
            view = view[:self.size]
        self._consumed = True
        self._conn.fs.recv_into(view)
        if self._crc is not None and crc32(view) != self._crc:
            raise ProtocolError(f"payload checksum mismatch in request {self.rid} ({self.op})",
                                reason="checksum_mismatch", op=self.op, rid=self.rid)
        return view

    def reply(self, payload: Any = None, *, meta: dict[str, Any] | None = None, checksum: bool = False) -> None:
        """Send the response: ``meta`` in the header, ``payload`` sent uncopied.

        ``payload`` is any buffer, a :class:`~.conn.FileRegion` (sent with ``sendfile``), or a
        list/tuple of those sent back to back as one payload.  ``checksum`` needs buffers only.
        """
        if isinstance(payload, list | tuple | FileRegion):
            parts: list[Part] = [p if isinstance(p, FileRegion) else as_bytes_view(p)
                                 for p in (payload if isinstance(payload, list | tuple) else (payload,))]
            crc = None
            if checksum:
                if any(isinstance(p, FileRegion) for p in parts):
                    raise InvalidArgument("a checksum needs the payload in memory, not a file region",
                                          op=self.op, rid=self.rid)
                crc = 0
                for p in parts:
                    crc = crc32(p, crc)
            self._send(Response(rid=self.rid, meta=meta or {}, crc32=crc), parts)
            return
        view = as_bytes_view(payload) if payload is not None else _EMPTY
        header = Response(rid=self.rid, meta=meta or {}, crc32=crc32(view) if checksum else None)
        self._send(header, view)

    def fail(self, err: FireFlyerError) -> None:
        """Reply with an error (what raising it from the handler does, for deferred replies)."""
        self._send(ErrorFrame(rid=self.rid, error=err.to_dict()), _EMPTY)

    def defer(self) -> None:
        """The handler will reply later, from another thread; receive the payload before returning."""
        self._deferred = True

    @property
    def replied(self) -> bool:
        return self._replied

    def _send(self, header: Response | ErrorFrame, view: memoryview | Sequence[Part]) -> None:
        if self._replied:
            raise FailedPrecondition("request was already answered", op=self.op, rid=self.rid)
        self._replied = True
        fs = self._conn.fs
        if fs.broken:
            raise Unavailable(f"connection to {fs.peer} is closed", peer=fs.peer)
        with fs.send_lock:
            if isinstance(view, memoryview):
                fs.send_frame(header, view)
            else:
                fs.send_frame_parts(header, view)


class PayloadBudget:
    """Bytes that request payloads received into server-allocated buffers may hold at once.

    A request leases its payload's size before the buffer is allocated and returns it when
    its handler returns (a handler that ``defer()`` s and keeps the buffer past that is not
    counted any longer: no handler of the storage node defers).  A lease that does not fit waits up
    to ``wait_s`` for others to end, then fails with ``ResourceExhausted``; one lease larger
    than the whole budget is granted when nothing else is held (so any payload the frame
    limits allow can still be served, one at a time).
    """

    def __init__(self, max_bytes: int, *, wait_s: float = 5.0) -> None:
        if max_bytes < 1:
            raise ValueError(f"payload budget must be >= 1 byte, got {max_bytes}")
        self.max_bytes = max_bytes
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self.in_use = 0
        #: the most ever held at once (for tests and metrics)
        self.peak = 0

    def acquire(self, n: int, *, what: str = "") -> None:
        if n <= 0:
            return
        end = time.monotonic() + self.wait_s
        with self._cond:
            while self.in_use and self.in_use + n > self.max_bytes:
                left = end - time.monotonic()
                if left <= 0:
                    raise ResourceExhausted(
                        f"server busy: {self.in_use} of {self.max_bytes} payload bytes in flight, no room for "
                        f"{n} more{' (' + what + ')' if what else ''} within {self.wait_s}s; retry later",
                        reason="payload_budget", size=n, in_use=self.in_use, limit=self.max_bytes)
                self._cond.wait(left)
            self.in_use += n
            self.peak = max(self.peak, self.in_use)

    def release(self, n: int) -> None:
        if n <= 0:
            return
        with self._cond:
            self.in_use -= n
            self._cond.notify_all()


def principal_key(principal: Any) -> str | None:
    """The name connections are counted under for the per-user cap; None: not capped
    (admins and services: the cluster's own peers and operators)."""
    has_role = getattr(principal, "has_role", None)
    if has_role is not None and (has_role("admin") or has_role("service")):
        return None
    return str(getattr(principal, "user", principal))


#: the reasons of an ``Unavailable`` from :class:`FramedSocket` that mean the peer went away
LOST_REASONS = frozenset({"recv_failed", "send_failed", "closed"})


def connection_lost(err: FireFlyerError) -> bool:
    """Whether ``err`` is the connection going away (ECONNRESET, EPIPE, a socket closed under
    us), not a frame the peer got wrong: the first is routine (DEBUG), the second a warning."""
    return isinstance(err, PeerClosed) or (isinstance(err, Unavailable) and not isinstance(err, ProtocolError)
                                           and err.fields.get("reason") in LOST_REASONS)


class _ServerConn:
    """The thread serving one authenticated client connection."""

    def __init__(self, server: WireServer, sock: socket.socket, peer: str, principal: Any, key: str | None,
                 early: bytes | bytearray | memoryview = b"") -> None:
        self.server = server
        tune_socket(sock, io_timeout_s=server.io_timeout_s, buf_bytes=server.buf_bytes)
        if server.frame_timeout_s is not None and server.frame_timeout_s < server.io_timeout_s:
            # no receive may block past a frame's deadline by more than this (see FramedSocket)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(server.frame_timeout_s))
        self.fs = FramedSocket(sock, peer=peer, limits=server.limits, io_timeout_s=server.io_timeout_s,
                               frame_timeout_s=server.frame_timeout_s, min_payload_rate=server.min_payload_rate)
        if early:
            self.fs.preload(early)
        self.principal: Any = principal
        #: the per-user cap's key (None: uncapped)
        self.key = key
        self.leased = 0  # payload budget held by the request being served
        #: re-checks the hello's token before each request (revoked or expired since: refused)
        self.reauth: Reauth | None = None
        self.thread = threading.Thread(target=self._run, name=f"wire-conn-{peer}", daemon=True)

    def lease(self, n: int, *, op: str) -> None:
        budget = self.server.payload_budget
        if budget is not None and n:
            budget.acquire(n, what=f"{op} from {self.fs.peer}")
            self.leased += n

    def unlease(self) -> None:
        if self.leased and self.server.payload_budget is not None:
            self.server.payload_budget.release(self.leased)
        self.leased = 0

    def _run(self) -> None:
        fs = self.fs
        try:
            with fs.send_lock:
                fs.send_frame(Welcome(principal=str(self.principal), server=self.server.name))
            while not self.server._stopping:
                try:
                    header, size = fs.read_header()
                except Idle:
                    continue  # an idle client is fine; the timeout only lets us notice stop()
                if not isinstance(header, Request):
                    raise ProtocolError(f"a client may not send a {type(header).__name__} frame",
                                        reason="unexpected_frame")
                self._serve(header, size)
        except PeerClosed:
            log.debug("wire.conn_closed", peer=fs.peer)
        except FireFlyerError as e:
            if self.server._stopping:
                log.debug("wire.conn_stopped", peer=fs.peer, error=str(e))  # stop() shut it under us
            elif connection_lost(e):  # the client went away (reset, killed): routine, nothing to answer
                log.debug("wire.conn_lost", peer=fs.peer, reason=e.fields.get("reason"), error=str(e))
            else:
                self._reject(e)
        except Exception:  # a bug here must not take the server down, only this connection
            log.exception("wire.conn_failed", peer=fs.peer)
        finally:
            self.unlease()
            fs.close()
            self.server._forget(self)

    def _reject(self, err: FireFlyerError) -> None:
        reason = err.fields.get("reason") or err.kind
        log.warning("wire.frame_rejected", reason=reason, peer=self.fs.peer, error=str(err))
        self.fs.send_error_and_close(ErrorFrame(rid=0, error=err.to_dict()))

    def _serve(self, header: Request, size: int) -> None:
        try:
            self._serve_one(header, size)
        finally:
            self.unlease()

    def _serve_one(self, header: Request, size: int) -> None:
        fs = self.fs
        req = ServerRequest(self, header, size)
        # a token revoked or expired since the hello is refused (the payload is discarded below)
        err: FireFlyerError | None = self.reauth.check() if self.reauth is not None else None
        if err is None:
            if not self.server.trace_requests or not header.trace:
                err = self._call(req)
            else:
                err = self._call_traced(req, header, size)
        if fs.broken:
            # the handler's receive or reply broke the stream (truncated, stalled, reset)
            raise fs.failure or Unavailable(f"connection to {fs.peer} broke", peer=fs.peer)
        if err is not None and not req.replied:
            req.fail(err)
        elif err is not None:
            log.warning("wire.handler_failed_after_reply", op=header.op, peer=fs.peer, error=str(err))
        elif not req.replied and not req._deferred:
            req.reply()
        if not req._consumed:
            fs.discard(size)

    def _call(self, req: ServerRequest) -> FireFlyerError | None:
        try:
            self.server.handler(req)
        except FireFlyerError as e:
            return e
        except Exception as e:
            log.exception("wire.handler_failed", op=req.op, peer=req.peer)
            return Internal(f"wire handler for {req.op!r} failed: {type(e).__name__}: {e}", op=req.op)
        return None

    def _call_traced(self, req: ServerRequest, header: Request, size: int) -> FireFlyerError | None:
        parent = extract(header.trace) if header.trace else None
        with self.server._tracer.start_as_current_span(
            f"wire.{header.op}", context=parent, kind=SpanKind.SERVER,
            attributes={"wire.op": header.op, "wire.payload_bytes": size, "net.peer.name": req.peer},
        ) as span:
            err = self._call(req)
            if err is not None:
                span.set_status(Status(StatusCode.ERROR, str(err)))
                span.set_attribute("error.kind", err.kind)
        return err


class _Pending:
    """An accepted connection before its hello: a socket in the accept thread's selector and
    the bytes read so far; no thread of its own."""

    __slots__ = ("sock", "peer", "buf", "deadline", "closing")

    def __init__(self, sock: socket.socket, peer: str, deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.buf = bytearray()
        self.deadline = deadline
        #: an error frame was sent and our side shut: draining the peer's input until it closes
        #: (closing with unread input makes the kernel reset the connection and can destroy the
        #: error frame before the peer reads it)
        self.closing = False


#: how long a refused or rejected connection is drained before it is closed regardless
_LINGER_S = 0.5
#: refused connections drained at once; past this they are closed at once
_MAX_LINGERING = 256


class WireServer:
    """Accepts data-plane connections and serves each authenticated one in its own thread.

    Until its hello arrives a connection costs no thread: the accept thread reads hellos from
    every new connection in one ``selectors`` loop, with ``handshake_timeout_s`` for the whole
    hello.  Limits (a connection over one gets an ``error`` frame, ``ResourceExhausted`` with a
    ``reason``, and is closed; ``wire.conn_refused`` is logged at INFO):

    - ``max_connections``: connections open at once, before and after their hello (``node_limit``);
    - ``max_connections_per_user``: authenticated connections of one user (``user_limit``;
      principals with the admin or service role are not counted, see :func:`principal_key`);
    - ``payload_budget_bytes``: payload bytes received into buffers the server allocates, all
      requests together (:class:`PayloadBudget`; None: unbounded);
    - ``frame_timeout_s``: a frame that has started must be whole within this (its head), plus
      its payload at ``min_payload_rate`` bytes/s (``frame_timeout``).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        authenticate: Authenticate,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: FrameLimits | None = None,
        io_timeout_s: float = 30.0,
        handshake_timeout_s: float = 5.0,
        frame_timeout_s: float | None = 5.0,
        min_payload_rate: float = 1 << 20,
        max_connections: int = 1024,
        max_connections_per_user: int = 256,
        payload_budget_bytes: int | None = 1 << 30,
        payload_budget_wait_s: float = 5.0,
        buf_bytes: int | None = None,
        name: str = "wire",
        backlog: int = 128,
        trace_requests: bool = True,
    ) -> None:
        if max_connections < 1 or max_connections_per_user < 1:
            raise ValueError("max_connections and max_connections_per_user must be >= 1")
        if frame_timeout_s is not None and frame_timeout_s <= 0:
            raise ValueError(f"frame_timeout_s must be > 0 or None, got {frame_timeout_s}")
        if min_payload_rate <= 0:
            raise ValueError(f"min_payload_rate must be > 0, got {min_payload_rate}")
        self.handler = handler
        self.authenticate = authenticate
        self.host = host
        self._port = port
        self.limits = limits or FrameLimits()
        self.io_timeout_s = io_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.min_payload_rate = min_payload_rate
        self.max_connections = max_connections
        self.max_connections_per_user = max_connections_per_user
        self.payload_budget = (PayloadBudget(payload_budget_bytes, wait_s=payload_budget_wait_s)
                               if payload_budget_bytes is not None else None)
        # a hello is a token and a name: its header needs far less than a request's
        # (its payload length is checked as any frame's, then refused: a hello carries none)
        self._hello_limits = FrameLimits(max_header_bytes=min(self.limits.max_header_bytes, 16 * 1024),
                                         max_payload_bytes=self.limits.max_payload_bytes)
        self._hello_head_max = PREFIX.size + self._hello_limits.max_header_bytes
        self.buf_bytes = buf_bytes
        self.name = name
        self.backlog = backlog
        #: run each handler in a SERVER span (off for very high request rates of tiny requests)
        self.trace_requests = trace_requests
        self._tracer = tracer("fireflyer.wire")
        self._lock = threading.Lock()
        self._conns: set[_ServerConn] = set()
        self._per_user: dict[str, int] = {}
        self._pending = 0  # connections in the accept thread's hands (hello or lingering close)
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopping = False

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self._port

    def connection_count(self) -> int:
        """Open connections: authenticated ones and those still before (or refused at) their hello."""
        with self._lock:
            return len(self._conns) + self._pending

    def thread_count(self) -> int:
        """Connection threads alive (one per authenticated connection)."""
        with self._lock:
            return sum(1 for c in self._conns if c.thread.is_alive())

    def start(self) -> int:
        """Bind and start accepting; returns the bound port (useful with port 0)."""
        if self._listener is not None:
            raise FailedPrecondition("wire server already started", server=self.name)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self._port))
        listener.listen(self.backlog)
        listener.setblocking(False)
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, name=f"wire-accept-{self._port}",
                                               daemon=True)
        self._accept_thread.start()
        log.info("wire.listening", server=self.name, host=self.host, port=self._port)
        return self._port

    # -- the accept thread: new connections up to their hello -----------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        pending: dict[int, _Pending] = {}
        try:
            while not self._stopping:
                now = time.monotonic()
                wait = 0.5  # at least twice a second, so stop() never waits on a quiet listener
                for p in pending.values():
                    wait = min(wait, max(0.0, p.deadline - now))
                for key, _ in sel.select(wait):
                    if key.data is None:
                        self._accept_some(sel, pending)
                        continue
                    try:
                        self._pending_readable(sel, pending, key.data)
                    except Exception:  # a bug costs this connection, not the accept thread
                        log.exception("wire.handshake_failed", peer=key.data.peer, server=self.name)
                        self._drop(sel, pending, key.data)
                now = time.monotonic()
                for p in [p for p in pending.values() if p.deadline <= now]:
                    if p.closing:
                        self._drop(sel, pending, p)
                    else:
                        self._refuse(sel, pending, p, ProtocolError(
                            f"no hello within {self.handshake_timeout_s}s", reason="handshake_timeout"),
                            warn=True)
        except Exception:  # a bug here would stop all accepting: say so loudly
            log.exception("wire.accept_failed", server=self.name)
        finally:
            for p in list(pending.values()):
                self._drop(sel, pending, p)
            sel.close()

    def _accept_some(self, sel: selectors.BaseSelector, pending: dict[int, _Pending]) -> None:
        assert self._listener is not None
        for _ in range(64):  # a burst at a time, then the hellos get their turn
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if not self._stopping:
                    log.warning("wire.accept_failed", server=self.name, error=str(e))
                return
            sock.setblocking(False)
            peer = f"{addr[0]}:{addr[1]}"
            p = _Pending(sock, peer, time.monotonic() + self.handshake_timeout_s)
            pending[sock.fileno()] = p
            sel.register(sock, selectors.EVENT_READ, p)
            with self._lock:
                self._pending += 1
                total = len(self._conns) + self._pending
            if total > self.max_connections:
                log.info("wire.conn_refused", reason="node_limit", peer=peer, server=self.name,
                         limit=self.max_connections)
                self._refuse(sel, pending, p, ResourceExhausted(
                    f"{self.name} has {self.max_connections} connections open, its limit; close idle "
                    f"connections or retry later", reason="node_limit", limit=self.max_connections,
                    server=self.name))

    def _pending_readable(self, sel: selectors.BaseSelector, pending: dict[int, _Pending], p: _Pending) -> None:
        try:
            # never past the largest hello's head: what follows it must fit the connection's read-ahead
            data = p.sock.recv(max(1, self._hello_head_max - len(p.buf)) if not p.closing else 64 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if p.closing:
            if not data:
                self._drop(sel, pending, p)
            return
        if not data:
            log.debug("wire.conn_closed", peer=p.peer, before="hello")
            self._drop(sel, pending, p)
            return
        p.buf += data
        try:
            head = decode_frame_head(p.buf, self._hello_limits)
        except ProtocolError as e:
            self._refuse(sel, pending, p, e, warn=True)
            return
        if head is None:
            return
        header, head_len, payload_len = head
        problem = hello_problem(header, payload_len)
        if problem is not None or not isinstance(header, Hello):
            self._refuse(sel, pending, p, problem or ProtocolError("expected a hello", reason="expected_hello"),
                         warn=True)
            return
        self._welcome(sel, pending, p, header, p.buf[head_len:])

    def _welcome(self, sel: selectors.BaseSelector, pending: dict[int, _Pending], p: _Pending, hello: Hello,
                 early: bytearray) -> None:
        try:
            principal = self.authenticate(hello.token)
        except Unauthenticated as e:  # the authenticator says why (revoked, expired)
            principal, why = None, str(e)
        except Exception as e:  # an authenticator bug rejects, it does not stop the accept thread
            log.exception("wire.auth_failed", peer=p.peer)
            principal, why = None, f"authenticator failed: {type(e).__name__}"
        else:
            why = "invalid or expired token"
        if principal is None:
            # never log the token itself
            log.warning("wire.auth_rejected", reason="bad_token", peer=p.peer, client=hello.client)
            self._refuse(sel, pending, p, Unauthenticated(
                f"data-plane connection rejected by {self.name}: {why}", peer=p.peer, server=self.name))
            return
        key = principal_key(principal)
        with self._lock:  # the slot is taken here, so two hellos at once cannot both pass the cap
            over = key is not None and self._per_user.get(key, 0) >= self.max_connections_per_user
            if not over and key is not None:
                self._per_user[key] = self._per_user.get(key, 0) + 1
        if over:
            log.info("wire.conn_refused", reason="user_limit", peer=p.peer, user=key, server=self.name,
                     limit=self.max_connections_per_user)
            self._refuse(sel, pending, p, ResourceExhausted(
                f"{key} has {self.max_connections_per_user} data-plane connections open to {self.name}, the "
                f"per-user limit; close idle connections or retry later", reason="user_limit",
                user=key, limit=self.max_connections_per_user, server=self.name))
            return
        sel.unregister(p.sock)
        del pending[p.sock.fileno()]
        p.sock.setblocking(True)
        try:
            conn = _ServerConn(self, p.sock, p.peer, principal, key, early)
            conn.reauth = Reauth(self.authenticate, hello.token, server=self.name)
        except BaseException:
            p.sock.close()
            with self._lock:
                self._pending -= 1
                self._unkey(key)
            raise
        with self._lock:
            self._pending -= 1
            if not self._stopping:
                self._conns.add(conn)
                conn.thread.start()  # (under the lock: stop() joins only started threads)
                log.debug("wire.conn_accepted", peer=p.peer, principal=str(principal), client=hello.client)
                return
            self._unkey(key)
        conn.fs.close()

    def _unkey(self, key: str | None) -> None:
        # (with the lock held)
        if key is not None:
            left = self._per_user.get(key, 1) - 1
            if left > 0:
                self._per_user[key] = left
            else:
                self._per_user.pop(key, None)

    def _refuse(self, sel: selectors.BaseSelector, pending: dict[int, _Pending], p: _Pending,
                err: FireFlyerError, *, warn: bool = False) -> None:
        """Send ``err`` as an error frame (best effort, without blocking) and close ``p`` after a
        short drain of its input."""
        if warn:
            log.warning("wire.frame_rejected", reason=err.fields.get("reason") or err.kind, peer=p.peer,
                        error=str(err))
        frame = encode_head(ErrorFrame(rid=0, error=err.to_dict()), 0)
        try:
            p.sock.send(frame)
            p.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(sel, pending, p)
            return
        if sum(1 for q in pending.values() if q.closing) >= _MAX_LINGERING:
            self._drop(sel, pending, p)
            return
        p.closing = True
        p.deadline = time.monotonic() + _LINGER_S

    def _drop(self, sel: selectors.BaseSelector, pending: dict[int, _Pending], p: _Pending) -> None:
        if pending.pop(p.sock.fileno(), None) is not None:
            try:
                sel.unregister(p.sock)
            except (KeyError, ValueError):
                pass
            with self._lock:
                self._pending -= 1
        p.sock.close()

    def _forget(self, conn: _ServerConn) -> None:
        with self._lock:
            if conn in self._conns:
                self._conns.discard(conn)
                self._unkey(conn.key)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, close every connection (their clients see Unavailable), join threads."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            conns = list(self._conns)
        for conn in conns:
            conn.fs.shutdown()
        threads = [c.thread for c in conns]
        if self._accept_thread is not None:
            threads.append(self._accept_thread)
        for t in threads:
            t.join(timeout_s)
        if self._listener is not None:  # (after the accept thread: it selects on it)
            self._listener.close()
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            # a handler blocked in its own code; its socket is shut, its thread is a daemon
            log.warning("wire.stop_left_threads", server=self.name, threads=",".join(stuck))
        log.info("wire.stopped", server=self.name, port=self._port)

    def __enter__(self) -> WireServer:
        if self._listener is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
