"""The data-plane client: one authenticated connection, many requests in flight.

    conn = Connection.connect("10.0.0.7", 9000, token=os.environ["FF_TOKEN"])
    reply = conn.request("read", meta={"chunk": 42}, into=buf)   # payload lands in buf, uncopied
    reply = conn.request("read2", into=[buf_a, buf_b])   # scattered: buf_a filled first, then buf_b
    pending = [conn.submit("write", payload=view) for view in views]   # several outstanding
    for p in pending:
        p.result()
    conn.close()

Multiplexing: any thread may call :meth:`Connection.submit` / :meth:`Connection.request`.  Each
request gets a fresh request id and registers the buffer its response payload must land in; a
single reader thread reads every incoming frame and receives each response's payload straight
into the buffer registered under its id, then wakes the waiting thread.  Sends are serialised by
a lock (one frame at a time on the stream), so a large request payload delays other senders but
never interleaves with them.

Timeouts and failures:

- ``connect`` fails with DeadlineExceeded (no TCP connection or welcome in ``timeout_s``),
  Unavailable (refused, reset) or whatever the server rejected with (Unauthenticated).
- a request not answered within its ``timeout_s`` raises DeadlineExceeded and is forgotten; a
  late answer is read and dropped.  If its answer has already started arriving, the call waits for
  it to finish instead (bounded by ``io_timeout_s``), so that the caller's buffer is never written
  after the call returned.
- when the connection drops (peer gone, reset, bad frame, :meth:`close`), every outstanding
  request fails with Unavailable naming the peer, and so does every later call.
- errors the server's handler raised arrive as the same FireFlyerError subclass, same fields.

The current trace context (W3C ``traceparent``) travels in each request header; the server runs
its handler in a span under it.  The client makes no span of its own: the caller's span already
covers the request, and the wire adds no work worth a second one.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from typing import Any

from fireflyer.core.errors import (
    DeadlineExceeded,
    FireFlyerError,
    ProtocolError,
    ResourceExhausted,
    Unavailable,
    error_from_dict,
)
from fireflyer.core.log import get_logger
from fireflyer.telemetry import inject

from .conn import FramedSocket, Idle, as_bytes_view, set_io_timeout, tune_socket
from .frame import ErrorFrame, FrameLimits, Hello, Request, Response, Welcome, crc32

__all__ = ["Connection", "PendingRequest", "Reply", "connect"]

log = get_logger(__name__)
_EMPTY = memoryview(b"")


class Reply:
    """A response: the server's ``meta`` and a view of the payload (in the caller's buffer if given).

    A payload scattered over several buffers (``into`` a list) is ``parts``, one view per buffer
    (the bytes that landed in it); ``payload`` is then the first of them."""

    __slots__ = ("meta", "payload", "parts")

    def __init__(self, meta: dict[str, Any], payload: memoryview, parts: tuple[memoryview, ...] | None = None) -> None:
        self.meta = meta
        self.payload = payload
        self.parts = (payload,) if parts is None else parts

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.parts)

    def __repr__(self) -> str:
        return f"Reply(meta={self.meta!r}, size={self.size})"


class PendingRequest:
    """A request sent and not yet answered; :meth:`result` waits for the answer."""

    __slots__ = ("rid", "op", "into", "deadline", "_conn", "_event", "_reply", "_error", "_claimed")

    def __init__(self, conn: Connection, rid: int, op: str, into: memoryview | list[memoryview] | None,
                 deadline: float) -> None:
        self.rid = rid
        self.op = op
        self.into = into
        self.deadline = deadline
        self._conn = conn
        self._event = threading.Event()
        self._reply: Reply | None = None
        self._error: FireFlyerError | None = None
        self._claimed = False  # the reader took it and may be writing into ``into``

    def done(self) -> bool:
        return self._event.is_set()

    def result(self, timeout_s: float | None = None) -> Reply:
        """The reply, or the request's error raised; ``timeout_s`` defaults to the request's own."""
        wait = self.deadline - time.monotonic() if timeout_s is None else timeout_s
        if not self._event.wait(max(0.0, wait)):
            if self._conn._abandon(self):
                # later calls raise the same: the request is over, its late answer will be dropped
                self._finish(error=DeadlineExceeded(
                    f"no response to {self.op!r} (request {self.rid}) from {self._conn.peer} in time",
                    op=self.op, rid=self.rid, peer=self._conn.peer))
            else:
                # the answer is landing in our buffer right now: let it finish (io_timeout_s bounds
                # that; the reader finishes every request it takes, also when it fails)
                self._event.wait()
        if self._error is not None:
            raise self._error
        assert self._reply is not None
        return self._reply

    def _finish(self, reply: Reply | None = None, error: FireFlyerError | None = None) -> None:
        self._reply, self._error = reply, error
        self._event.set()


class Connection:
    """An authenticated data-plane connection (use :meth:`connect`)."""

    def __init__(self, fs: FramedSocket, *, principal: str, server: str, request_timeout_s: float) -> None:
        self._fs = fs
        self.principal = principal
        self.server = server
        self.request_timeout_s = request_timeout_s
        self._rids = itertools.count(1)  # 0 is reserved for connection-level errors
        self._lock = threading.Lock()
        self._pending: dict[int, PendingRequest] = {}
        self._failure: FireFlyerError | None = None
        self._closing = False
        self._reader = threading.Thread(target=self._read_loop, name=f"wire-client-{fs.peer}", daemon=True)
        self._reader.start()

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        *,
        token: str,
        timeout_s: float = 10.0,
        io_timeout_s: float = 30.0,
        request_timeout_s: float = 60.0,
        limits: FrameLimits | None = None,
        buf_bytes: int | None = None,
        client_name: str = "",
    ) -> Connection:
        """Connect, authenticate with ``token`` and start the reader thread."""
        peer = f"{host}:{port}"
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except TimeoutError:
            raise DeadlineExceeded(f"connecting to {peer} timed out after {timeout_s}s", peer=peer) from None
        except OSError as e:
            raise Unavailable(f"cannot connect to {peer}: {e.strerror or e}", peer=peer) from None
        # the handshake runs under the connect timeout, requests under io_timeout_s
        tune_socket(sock, io_timeout_s=timeout_s, buf_bytes=buf_bytes)
        fs = FramedSocket(sock, peer=peer, limits=limits or FrameLimits(), io_timeout_s=io_timeout_s)
        try:
            fs.send_frame(Hello(token=token, client=client_name))
            try:
                header, size = fs.read_header()
            except Idle:
                raise DeadlineExceeded(f"no answer to hello from {peer} within {timeout_s}s", peer=peer) from None
            if isinstance(header, ErrorFrame):
                raise error_from_dict(header.error)
            if not isinstance(header, Welcome) or size:
                raise ProtocolError(f"expected a welcome from {peer}, got {type(header).__name__}",
                                    reason="expected_welcome", peer=peer)
            set_io_timeout(sock, io_timeout_s)
        except BaseException:
            fs.close()
            raise
        return cls(fs, principal=header.principal, server=header.server, request_timeout_s=request_timeout_s)

    @property
    def peer(self) -> str:
        return self._fs.peer

    @property
    def closed(self) -> bool:
        return self._failure is not None

    def outstanding(self) -> int:
        with self._lock:
            return len(self._pending)

    def submit(
        self,
        op: str,
        payload: Any = None,
        *,
        meta: dict[str, Any] | None = None,
        into: Any = None,
        checksum: bool = False,
        timeout_s: float | None = None,
    ) -> PendingRequest:
        """Send a request and return at once; the response payload will be received into ``into``
        (any writable buffer large enough; a list of them to scatter it, each filled before the
        next; a new bytearray when None).  ``checksum`` sends the payload's crc32 for the server
        to verify."""
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        view = as_bytes_view(payload) if payload is not None else _EMPTY
        into_view: memoryview | list[memoryview] | None = None
        if isinstance(into, list | tuple):
            into_view = [as_bytes_view(b, writable=True) for b in into]
        elif into is not None:
            into_view = as_bytes_view(into, writable=True)
        trace: dict[str, str] = {}
        inject(trace)
        rid = next(self._rids)
        header = Request(rid=rid, op=op, meta=meta or {}, crc32=crc32(view) if checksum else None, trace=trace)
        pending = PendingRequest(self, rid, op, into_view, deadline)
        with self._lock:
            self._raise_if_failed()
            self._pending[rid] = pending  # before sending: the answer may beat send_frame's return
        fs = self._fs
        if not fs.send_lock.acquire(timeout=max(0.0, timeout)):
            self._abandon(pending)
            raise DeadlineExceeded(f"could not send {op!r} to {self.peer} within {timeout}s (other sends ahead)",
                                   op=op, peer=self.peer)
        try:
            fs.send_frame(header, view)
        except FireFlyerError as e:
            # a half-sent frame breaks the stream for everyone on this connection
            self._die(e)
            raise
        finally:
            fs.send_lock.release()
        return pending

    def request(
        self,
        op: str,
        payload: Any = None,
        *,
        meta: dict[str, Any] | None = None,
        into: Any = None,
        checksum: bool = False,
        timeout_s: float | None = None,
    ) -> Reply:
        """Send a request and wait for its reply (see :meth:`submit`)."""
        return self.submit(op, payload, meta=meta, into=into, checksum=checksum, timeout_s=timeout_s).result()

    def close(self) -> None:
        """Close; requests still outstanding fail with Unavailable."""
        self._closing = True
        self._fs.shutdown()
        if threading.current_thread() is not self._reader:
            self._reader.join(self._fs.io_timeout_s or None)
        self._die(Unavailable(f"connection to {self.peer} was closed by this client", peer=self.peer,
                              reason="closed"))
        self._fs.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- internals

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise Unavailable(f"connection to {self.peer} is down: {self._failure}", peer=self.peer,
                              reason=self._failure.fields.get("reason") or self._failure.kind)

    def _abandon(self, pending: PendingRequest) -> bool:
        """Forget a request that timed out; False if the reader already took its answer."""
        with self._lock:
            return self._pending.pop(pending.rid, None) is not None

    def _die(self, cause: FireFlyerError) -> None:
        """The connection is unusable: fail everything outstanding, refuse what comes later."""
        with self._lock:
            first = self._failure is None
            if first:
                self._failure = cause
            pending, self._pending = list(self._pending.values()), {}
        if first and not self._closing:
            level = log.warning if isinstance(cause, ProtocolError) else log.info
            level("wire.conn_lost", peer=self.peer, reason=cause.fields.get("reason") or cause.kind,
                  error=str(cause), outstanding=len(pending))
        self._fs.shutdown()
        for p in pending:
            p._finish(error=Unavailable(f"connection to {self.peer} lost: {cause}", peer=self.peer,
                                        op=p.op, rid=p.rid, reason=cause.fields.get("reason") or cause.kind))

    def _read_loop(self) -> None:
        fs = self._fs
        try:
            while True:
                try:
                    header, size = fs.read_header()
                except Idle:
                    continue  # nothing outstanding, or a slow server: the requests' deadlines decide
                if isinstance(header, ErrorFrame) and header.rid == 0:
                    raise error_from_dict(header.error)  # the server gave up on this connection
                if not isinstance(header, Response | ErrorFrame):
                    raise ProtocolError(f"a server may not send a {type(header).__name__} frame",
                                        reason="unexpected_frame", peer=fs.peer)
                with self._lock:
                    pending = self._pending.pop(header.rid, None)
                    if pending is not None:
                        pending._claimed = True
                if pending is None:
                    fs.discard(size)  # its caller timed out and left
                    log.debug("wire.late_response", rid=header.rid, peer=fs.peer)
                    continue
                try:
                    self._complete(pending, header, size)
                except Exception as e:
                    pending._finish(error=Unavailable(f"connection to {self.peer} lost: {e}", peer=self.peer,
                                                      op=pending.op, rid=pending.rid))
                    raise
                # it holds views of the caller's buffers: waiting for the next frame must not pin
                # them (a view keeps a bytearray from being resized)
                pending = None
        except FireFlyerError as e:
            self._die(e)
        except Exception as e:  # a bug: still fail the waiters rather than hang them
            log.exception("wire.reader_failed", peer=fs.peer)
            self._die(Unavailable(f"reader of {self.peer} failed: {e}", peer=self.peer))

    def _complete(self, pending: PendingRequest, header: Response | ErrorFrame, size: int) -> None:
        fs = self._fs
        if isinstance(header, ErrorFrame):
            fs.discard(size)
            pending._finish(error=error_from_dict(header.error))
            return
        if isinstance(pending.into, list):
            self._complete_scattered(pending, header, size, pending.into)
            return
        if size == 0:
            view = _EMPTY
        elif pending.into is None:
            fs.wait_payload()  # a size alone allocates nothing: only a payload that is arriving
            view = memoryview(bytearray(size))
        elif len(pending.into) < size:
            fs.discard(size)
            pending._finish(error=ResourceExhausted(
                f"response to {pending.op!r} has {size} bytes, the buffer only {len(pending.into)}",
                op=pending.op, size=size, buffer=len(pending.into)))
            return
        else:
            view = pending.into[:size]
        fs.recv_into(view)
        if header.crc32 is not None and crc32(view) != header.crc32:
            pending._finish(error=ProtocolError(f"response payload checksum mismatch for {pending.op!r}",
                                                reason="checksum_mismatch", op=pending.op, peer=fs.peer))
            return
        pending._finish(Reply(header.meta, view))

    def _complete_scattered(self, pending: PendingRequest, header: Response, size: int,
                            dests: list[memoryview]) -> None:
        fs = self._fs
        room = sum(len(d) for d in dests)
        if room < size:
            fs.discard(size)
            pending._finish(error=ResourceExhausted(
                f"response to {pending.op!r} has {size} bytes, the buffers only {room}",
                op=pending.op, size=size, buffer=room))
            return
        parts, left = [], size
        for d in dests:
            parts.append(d[:min(left, len(d))])
            left -= len(parts[-1])
        fs.recv_into_parts(parts)
        if header.crc32 is not None:
            crc = 0
            for p in parts:
                crc = crc32(p, crc)
            if crc != header.crc32:
                pending._finish(error=ProtocolError(f"response payload checksum mismatch for {pending.op!r}",
                                                    reason="checksum_mismatch", op=pending.op, peer=fs.peer))
                return
        pending._finish(Reply(header.meta, parts[0] if parts else _EMPTY, tuple(parts)))


def connect(host: str, port: int, *, token: str, **kw: Any) -> Connection:
    """Shorthand for :meth:`Connection.connect`."""
    return Connection.connect(host, port, token=token, **kw)
