"""The data-plane server: a thread per connection, a handler per request.

    def handle(req: ServerRequest) -> None:
        data = req.recv_payload(into=my_buffer)       # zero copy into the handler's own buffer
        req.reply(result_view, meta={"version": 3})   # header + payload, sent zero copy
        req.reply([head_view, FileRegion(fd, 0, n)])  # or several parts: buffers and file regions

    server = WireServer(handle, authenticate=tokens.lookup)   # lookup(token) -> principal | None
    port = server.start()
    ...
    server.stop()

Connection life: the client's first frame must be ``hello`` with a bearer token, which
``authenticate`` maps to a principal (anything; ``None`` rejects).  A rejected client gets an
``error`` frame (Unauthenticated) and the connection is closed.  After that every frame is a
``req``; the connection's thread reads its header and calls the handler, which may receive the
payload into a buffer of its choosing (``recv_payload``) and reply (``reply``).

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

import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from fireflyer.core.errors import (
    FailedPrecondition,
    FireFlyerError,
    Internal,
    InvalidArgument,
    ProtocolError,
    Unauthenticated,
    Unavailable,
)
from fireflyer.core.log import get_logger
from fireflyer.telemetry import extract, tracer

from .conn import FileRegion, FramedSocket, Idle, Part, PeerClosed, as_bytes_view, set_io_timeout, tune_socket
from .frame import ErrorFrame, FrameLimits, Hello, Request, Response, Welcome, crc32
from .reauth import Reauth

__all__ = ["WireServer", "ServerRequest", "Handler", "Authenticate"]

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


#: the reasons of an ``Unavailable`` from :class:`FramedSocket` that mean the peer went away
LOST_REASONS = frozenset({"recv_failed", "send_failed", "closed"})


def connection_lost(err: FireFlyerError) -> bool:
    """Whether ``err`` is the connection going away (ECONNRESET, EPIPE, a socket closed under
    us), not a frame the peer got wrong: the first is routine (DEBUG), the second a warning."""
    return isinstance(err, PeerClosed) or (isinstance(err, Unavailable) and not isinstance(err, ProtocolError)
                                           and err.fields.get("reason") in LOST_REASONS)


class _ServerConn:
    """The thread serving one client connection."""

    def __init__(self, server: WireServer, sock: socket.socket, peer: str) -> None:
        self.server = server
        tune_socket(sock, io_timeout_s=server.io_timeout_s, buf_bytes=server.buf_bytes)
        self.fs = FramedSocket(sock, peer=peer, limits=server.limits, io_timeout_s=server.io_timeout_s)
        self.principal: Any = None
        self.reauth: Reauth | None = None
        self.thread = threading.Thread(target=self._run, name=f"wire-conn-{peer}", daemon=True)

    def _run(self) -> None:
        fs = self.fs
        try:
            if not self._handshake():
                return
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
            fs.close()
            self.server._forget(self)

    def _reject(self, err: FireFlyerError) -> None:
        reason = err.fields.get("reason") or err.kind
        log.warning("wire.frame_rejected", reason=reason, peer=self.fs.peer, error=str(err))
        self.fs.send_error_and_close(ErrorFrame(rid=0, error=err.to_dict()))

    def _handshake(self) -> bool:
        fs, server = self.fs, self.server
        set_io_timeout(fs.sock, server.handshake_timeout_s)
        try:
            header, size = fs.read_header()
        except Idle:
            raise ProtocolError(f"no hello within {server.handshake_timeout_s}s",
                                reason="handshake_timeout") from None
        if not isinstance(header, Hello) or size:
            raise ProtocolError(f"the first frame must be a hello, got {type(header).__name__}",
                                reason="expected_hello")
        try:
            principal = server.authenticate(header.token)
        except Unauthenticated as e:  # the authenticator says why (revoked, expired)
            principal, why = None, str(e)
        except Exception as e:  # an authenticator bug rejects, it does not crash the thread
            log.exception("wire.auth_failed", peer=fs.peer)
            principal, why = None, f"authenticator failed: {type(e).__name__}"
        else:
            why = "invalid or expired token"
        if principal is None:
            # never log the token itself
            log.warning("wire.auth_rejected", reason="bad_token", peer=fs.peer, client=header.client)
            err = Unauthenticated(f"data-plane connection rejected by {server.name}: {why}",
                                  peer=fs.peer, server=server.name)
            fs.send_error_and_close(ErrorFrame(rid=0, error=err.to_dict()))
            return False
        self.principal = principal
        self.reauth = Reauth(server.authenticate, header.token, server=server.name)
        with fs.send_lock:
            fs.send_frame(Welcome(principal=str(principal), server=server.name))
        set_io_timeout(fs.sock, server.io_timeout_s)
        log.debug("wire.conn_accepted", peer=fs.peer, principal=str(principal), client=header.client)
        return True

    def _serve(self, header: Request, size: int) -> None:
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


class WireServer:
    """Accepts data-plane connections and serves each in its own thread."""

    def __init__(
        self,
        handler: Handler,
        *,
        authenticate: Authenticate,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: FrameLimits | None = None,
        io_timeout_s: float = 30.0,
        handshake_timeout_s: float = 10.0,
        buf_bytes: int | None = None,
        name: str = "wire",
        backlog: int = 128,
        trace_requests: bool = True,
    ) -> None:
        self.handler = handler
        self.authenticate = authenticate
        self.host = host
        self._port = port
        self.limits = limits or FrameLimits()
        self.io_timeout_s = io_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self.buf_bytes = buf_bytes
        self.name = name
        self.backlog = backlog
        #: run each handler in a SERVER span (off for very high request rates of tiny requests)
        self.trace_requests = trace_requests
        self._tracer = tracer("fireflyer.wire")
        self._lock = threading.Lock()
        self._conns: set[_ServerConn] = set()
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
        with self._lock:
            return len(self._conns)

    def start(self) -> int:
        """Bind and start accepting; returns the bound port (useful with port 0)."""
        if self._listener is not None:
            raise FailedPrecondition("wire server already started", server=self.name)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self._port))
        listener.listen(self.backlog)
        # accept() wakes at least twice a second so stop() never waits on a quiet listener
        listener.settimeout(0.5)
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, name=f"wire-accept-{self._port}",
                                               daemon=True)
        self._accept_thread.start()
        log.info("wire.listening", server=self.name, host=self.host, port=self._port)
        return self._port

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping:
            try:
                sock, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping:
                    break
                log.exception("wire.accept_failed", server=self.name)
                continue
            peer = f"{addr[0]}:{addr[1]}"
            conn = _ServerConn(self, sock, peer)
            with self._lock:
                if self._stopping:
                    conn.fs.close()
                    break
                self._conns.add(conn)
            conn.thread.start()

    def _forget(self, conn: _ServerConn) -> None:
        with self._lock:
            self._conns.discard(conn)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, close every connection (their clients see Unavailable), join threads."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            conns = list(self._conns)
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        for conn in conns:
            conn.fs.shutdown()
        threads = [c.thread for c in conns]
        if self._accept_thread is not None:
            threads.append(self._accept_thread)
        for t in threads:
            t.join(timeout_s)
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
