"""One framed, blocking TCP connection: the I/O under both client and server.

Hot-path choices, and why:

- **Blocking sockets in threads**, never asyncio: a blocked ``sendmsg``/``recv_into`` releases the
  GIL, and each call moves megabytes, so Python's per-call overhead disappears into the copy the
  kernel does anyway.
- **Timeouts without Python timeouts.**  ``socket.settimeout`` makes CPython poll() before every
  call.  Instead the socket stays in blocking mode and the kernel enforces ``SO_RCVTIMEO`` /
  ``SO_SNDTIMEO`` (``io_timeout_s``): a call that makes no progress for that long fails with
  ``EAGAIN``.  At a frame boundary a receive timeout only means "idle" (:class:`Idle`); inside a
  frame it means the peer stalled, and the connection is given up.
- **Zero copy.**  ``sendmsg([prefix+header, payload])`` hands the caller's buffer to the kernel
  with the small head in the same call; payloads are received with ``recv_into`` straight into
  the caller's buffer with ``MSG_WAITALL`` (one system call per chunk instead of one per
  socket-buffer's worth).  Large payloads move in ``CHUNK`` pieces so ``io_timeout_s`` bounds the
  time without progress, not the time for the whole payload.
- **Payloads in parts.**  A reply may be several buffers (``sendmsg`` with them all: a batch of
  I/Os needs no join copy) and :class:`FileRegion` s, sent with ``os.sendfile`` straight from the
  page cache to the socket (no copy into user memory); the receiver may scatter a payload over
  several buffers.  The framing is the same: one prefix, one header, ``payload_len`` bytes.
- **Idle waits in poll(), not recv.**  A thread asleep in ``recv`` is woken whenever the socket's
  send buffer drains (each ACK of what another thread sends on it), finds nothing and sleeps
  again: ~1.5 wake-ups per 512 KiB sent, and a ring link's reader, which never receives, woke
  ~2,000 times a second.  ``poll(POLLIN)`` sleeps through those, so a reader waiting for the next
  frame first tries without waiting, then sleeps in ``poll`` with the socket's ``SO_RCVTIMEO``.
- **Small read-ahead** for prefix and header (one ``recv_into`` usually gets both, and the next
  frame's start when requests are small); whatever payload bytes it caught are copied out first,
  at most one read-ahead buffer per frame.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import socket
import struct
import termios
import threading
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from fireflyer.core.errors import (
    DeadlineExceeded,
    FireFlyerError,
    InvalidArgument,
    ProtocolError,
    Unavailable,
)

from .frame import PREFIX, FrameLimits, Header, decode_header, encode_head, parse_prefix

__all__ = ["FramedSocket", "FileRegion", "Idle", "PeerClosed", "as_bytes_view", "tune_socket", "set_congestion",
           "congestion_of", "CHUNK"]

#: largest single sendmsg/recv_into; a few MiB keeps per-call overhead negligible
CHUNK = 8 << 20
_READAHEAD = 64 * 1024
_LINGER_S = 0.5  # per read, when draining a rejected peer's input before closing
_LINGER_READS = 64
_EMPTY = memoryview(b"")
#: buffers per sendmsg call (the kernel's IOV_MAX is 1024)
_IOV_BATCH = 512
_ZEROS = memoryview(bytes(1 << 16))


class FileRegion:
    """``length`` bytes of an open file at ``offset``, to be sent with ``os.sendfile``.

    The caller owns ``fd`` and keeps it open until the frame is sent.  If the file turns out
    shorter than ``length`` when it is sent, the rest is sent as zeros (the frame's length was
    already promised) and ``short`` says by how many bytes: payload checksums are what catch
    that, the wire layer cannot.
    """

    __slots__ = ("fd", "offset", "length", "short")

    def __init__(self, fd: int, offset: int, length: int) -> None:
        if offset < 0 or length < 0:
            raise InvalidArgument(f"bad file region offset={offset} length={length}", offset=offset, length=length)
        self.fd, self.offset, self.length = fd, offset, length
        self.short = 0

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, offset={self.offset}, length={self.length})"


Part = memoryview | FileRegion


class Idle(Exception):
    """No frame started within ``io_timeout_s`` (not an error: the caller decides)."""


class PeerClosed(Unavailable):
    """The peer closed the connection cleanly between frames."""


def as_bytes_view(buf: Any, *, writable: bool = False) -> memoryview:
    """A flat unsigned-byte view of any buffer (bytes, bytearray, memoryview, numpy array)."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if writable and view.readonly:
        raise InvalidArgument("receive buffer is read-only", type=type(buf).__name__)
    if not view.c_contiguous:
        raise InvalidArgument("buffer must be C-contiguous", type=type(buf).__name__)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _timeval(seconds: float | None) -> bytes:
    # struct timeval; all zero means "wait forever"
    us = max(1, round(seconds * 1e6)) if seconds and seconds > 0 else 0
    return struct.pack("ll", us // 1_000_000, us % 1_000_000)


def tune_socket(sock: socket.socket, *, io_timeout_s: float | None, buf_bytes: int | None = None,
                congestion: Sequence[str] = (), send_buf_bytes: int | None = None) -> None:
    """Blocking mode, no Nagle, kernel-side I/O timeouts, optional fixed socket buffers and
    congestion control (:func:`set_congestion`; empty: the system default).

    ``buf_bytes`` None keeps Linux's buffer auto-tuning, which usually beats a fixed size
    (a fixed SO_RCVBUF is capped by ``net.core.rmem_max`` and turns auto-tuning off).
    ``send_buf_bytes`` (used when ``buf_bytes`` is None) fixes SO_SNDBUF alone: the kernel
    keeps twice that for the unacknowledged bytes of the connection, and the receive side
    keeps its auto-tuning.  HFReduce's links use it on loopback (``ff launch``): a sender that
    runs megabytes ahead leaves its receiver copying from memory instead of the cache (see
    :attr:`fireflyer.hfreduce.settings.WorkerSettings.send_buf_size`).
    """
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if congestion:
        set_congestion(sock, congestion)
    if buf_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buf_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buf_bytes)
    elif send_buf_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buf_bytes)
    set_io_timeout(sock, io_timeout_s)


_TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", None)  # Linux only
#: why a congestion control cannot be set: not built or loadable (ENOENT), not in
#: ``net.ipv4.tcp_allowed_congestion_control`` for an unprivileged process (EPERM)
_CC_REFUSED = (errno.ENOENT, errno.EPERM, errno.EACCES, errno.EINVAL)


def set_congestion(sock: socket.socket, prefs: Sequence[str]) -> str | None:
    """Give ``sock`` the first congestion control of ``prefs`` the kernel lets this process
    set (``TCP_CONGESTION``); the name chosen, or None (none could be: the system default stays).

    Why a data-plane link picks its own: a host's default may be BBR, which paces every
    connection to its bandwidth estimate with timers -- on loopback and short fabric links
    that costs CPU per byte and caps throughput (measured on the CI VM: a 64 MiB exchange
    took ~1.4x as long as with cubic, ~1.6x as long as with reno).  Unprivileged processes may set only what
    ``net.ipv4.tcp_allowed_congestion_control`` lists (reno and the default, at least).
    """
    if _TCP_CONGESTION is None:
        return None
    for name in prefs:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_CONGESTION, name.encode())
        except OSError as e:
            if e.errno in _CC_REFUSED:
                continue
            raise
        return name
    return None


def congestion_of(sock: socket.socket) -> str | None:
    """The congestion control ``sock`` uses (None where the platform cannot say)."""
    if _TCP_CONGESTION is None:
        return None
    return sock.getsockopt(socket.IPPROTO_TCP, _TCP_CONGESTION, 16).split(b"\0", 1)[0].decode()


def set_io_timeout(sock: socket.socket, seconds: float | None) -> None:
    tv = _timeval(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _is_timeout(e: OSError) -> bool:
    return isinstance(e, BlockingIOError | TimeoutError) or e.errno in (errno.EAGAIN, errno.EWOULDBLOCK)


class FramedSocket:
    """Frames over one connected socket.  Sends are thread-safe; receives belong to one thread."""

    def __init__(self, sock: socket.socket, *, peer: str, limits: FrameLimits,
                 io_timeout_s: float | None, frame_timeout_s: float | None = None,
                 min_payload_rate: float = 1 << 20) -> None:
        self.sock = sock
        self.peer = peer
        self.limits = limits
        self.io_timeout_s = io_timeout_s
        self.send_lock = threading.Lock()
        self._rbuf = bytearray(max(_READAHEAD, PREFIX.size + limits.max_header_bytes))
        self._rview = memoryview(self._rbuf)
        self._rpos = 0  # next unread byte of the read-ahead buffer
        self._rend = 0  # end of valid bytes in it
        self.broken = False
        self._send_broken = False  # the outgoing stream may still be fine when the incoming one is not
        #: why the connection broke (the error raised when it did), for whoever closes it
        self.failure: FireFlyerError | None = None
        self._closed = False
        self._poller: select.poll | None = None  # (POLLIN on this socket, made on first use)
        #: a frame that has started must be whole within this many seconds (its head), plus
        #: its payload at ``min_payload_rate`` bytes/s; None: only ``io_timeout_s`` (no
        #: progress for that long) bounds it.  Servers set it: a peer that starts a frame and
        #: stalls (or trickles) would otherwise hold the connection and what it allocated.
        self.frame_timeout_s = frame_timeout_s
        self.min_payload_rate = min_payload_rate
        self._deadline: float | None = None  # when the current frame must be complete

    def preload(self, data: bytes | bytearray | memoryview) -> None:
        """Put bytes already read from the socket (by a handshake reader) in front of the stream."""
        n = len(data)
        if n > len(self._rbuf) - self._rend:
            raise InvalidArgument(f"{n} preloaded bytes do not fit the read-ahead buffer", size=n)
        self._rview[self._rend:self._rend + n] = data
        self._rend += n

    # ------------------------------------------------------------------ sending

    def send_frame(self, header: Header, payload: memoryview = _EMPTY) -> None:
        """Send one frame; the caller holds ``send_lock`` when other threads may send too.

        Any failure leaves the stream in an unknown state, so it marks the connection broken.
        """
        n = len(payload)
        head = encode_head(header, n)
        try:
            self._sendmsg(memoryview(head), payload[:CHUNK] if n else _EMPTY)
            for off in range(CHUNK, n, CHUNK):
                self._sendmsg(_EMPTY, payload[off:off + CHUNK])
        except OSError as e:
            self._send_broken = True
            if _is_timeout(e):
                raise self._break(DeadlineExceeded(
                    f"sending to {self.peer} made no progress for {self.io_timeout_s}s",
                    peer=self.peer, reason="stalled")) from None
            raise self._break(Unavailable(f"connection to {self.peer} failed while sending: {e}",
                                          peer=self.peer, reason="send_failed")) from None

    def send_head(self, header: Header, payload_len: int) -> None:
        """Send a frame's prefix and header only: the caller sends exactly ``payload_len``
        payload bytes on the socket itself next, still holding ``send_lock`` (HFReduce's
        streamed chunks produce their payload block by block)."""
        try:
            self._sendmsg(memoryview(encode_head(header, payload_len)), _EMPTY)
        except OSError as e:
            self._send_broken = True
            raise self._break(Unavailable(f"connection to {self.peer} failed while sending: {e}",
                                          peer=self.peer, reason="send_failed")) from None

    def send_frame_parts(self, header: Header, parts: Sequence[Part]) -> None:
        """Send one frame whose payload is ``parts`` in order (byte views and file regions);
        same locking and failure rules as :meth:`send_frame`."""
        n = sum(len(p) for p in parts)
        head = memoryview(encode_head(header, n))
        try:
            bufs: list[memoryview] = [head]
            for p in parts:
                if isinstance(p, FileRegion):
                    # MSG_MORE: the kernel holds the small head back to fill a segment with file data
                    self._sendmsg_all(bufs, socket.MSG_MORE)
                    bufs = []
                    self._sendfile(p)
                elif len(p):
                    bufs.append(p)
            self._sendmsg_all(bufs, 0)
        except OSError as e:
            self._send_broken = True
            if _is_timeout(e):
                raise self._break(DeadlineExceeded(
                    f"sending to {self.peer} made no progress for {self.io_timeout_s}s",
                    peer=self.peer, reason="stalled")) from None
            raise self._break(Unavailable(f"connection to {self.peer} failed while sending: {e}",
                                          peer=self.peer, reason="send_failed")) from None

    def _sendmsg_all(self, bufs: list[memoryview], flags: int) -> None:
        # several buffers per call; a partial send resumes inside the buffer where it stopped
        i = 0
        while i < len(bufs):
            batch = bufs[i:i + _IOV_BATCH]
            total = sum(len(b) for b in batch)
            sent = self.sock.sendmsg(batch, (), flags) if total else 0
            if sent == total:
                i += len(batch)
                continue
            while sent >= len(bufs[i]):
                sent -= len(bufs[i])
                i += 1
            bufs[i] = bufs[i][sent:]

    def _sendfile(self, region: FileRegion) -> None:
        out = self.sock.fileno()
        off, left = region.offset, region.length
        while left:
            sent = os.sendfile(out, region.fd, off, min(left, CHUNK))
            if sent == 0:  # the file ended early: keep the frame's promised length
                region.short = left
                while left:
                    k = min(left, len(_ZEROS))
                    self._sendmsg(_EMPTY, _ZEROS[:k])
                    left -= k
                return
            off += sent
            left -= sent

    def _sendmsg(self, head: memoryview, body: memoryview) -> None:
        # sendmsg may send part (kernel timeout, signal); resume where it stopped
        while head or body:
            sent = self.sock.sendmsg([head, body] if head and body else [head or body])
            if sent >= len(head):
                body = body[sent - len(head):]
                head = _EMPTY
            else:
                head = head[sent:]

    # ---------------------------------------------------------------- receiving

    def read_header(self) -> tuple[Header, int]:
        """Wait for the next frame's prefix and header; return (header, payload_len).

        Raises :class:`Idle` if nothing arrived within the I/O timeout, :class:`PeerClosed` on a
        clean close between frames, :class:`ProtocolError` (``reason``) on a bad or truncated
        frame, :class:`DeadlineExceeded` if the peer stalled inside the frame.
        """
        self._deadline = None
        if self._rend > self._rpos:
            self._start_frame()  # (the frame's first bytes came with the previous read)
        if self._rend - self._rpos < PREFIX.size:
            self._fill(PREFIX.size, at_boundary=True)
        self._start_frame()
        try:
            header_len, payload_len = parse_prefix(self._rview[self._rpos:self._rpos + PREFIX.size],
                                                   self.limits)
            self._rpos += PREFIX.size
            if self._rend - self._rpos < header_len:
                self._fill(header_len, at_boundary=False)
            header = decode_header(self._rview[self._rpos:self._rpos + header_len])
        except ProtocolError as e:
            raise self._break(e) from None
        self._rpos += header_len
        if self._deadline is not None and payload_len:
            self._deadline += payload_len / self.min_payload_rate
        return header, payload_len

    def _start_frame(self) -> None:
        if self.frame_timeout_s is not None and self._deadline is None:
            self._deadline = time.monotonic() + self.frame_timeout_s

    def _check_deadline(self, wait: bool) -> None:
        """Raise ``frame_timeout`` if the current frame is past its deadline; with ``wait``,
        first wait (at most until the deadline) for bytes to read."""
        deadline = self._deadline
        if deadline is None:
            return
        left = deadline - time.monotonic()
        if left > 0 and wait:
            try:
                ready = self._pollin().poll(max(1, int(left * 1000) + 1))
            except OSError as e:
                self._recv_failed(e, idle=False)
            if ready:
                return
            left = deadline - time.monotonic()
        if left <= 0:
            raise self._break(DeadlineExceeded(
                f"{self.peer} did not complete a frame within its deadline ({self.frame_timeout_s}s for the "
                f"head, plus the payload at {self.min_payload_rate:.0f} bytes/s)",
                peer=self.peer, reason="frame_timeout", timeout_s=self.frame_timeout_s))

    def wait_payload(self) -> None:
        """Return once a payload byte is buffered or readable (a receiver allocates for a payload
        only then, not on the frame's word): ``frame_timeout`` / ``stalled`` if none comes."""
        if self._rend > self._rpos:
            return
        if self._deadline is not None and self.frame_timeout_s is not None:
            # the first byte must come within frame_timeout_s (and the frame's deadline): a
            # payload's size buys time to send it, not to start sending it
            end = min(self._deadline, time.monotonic() + self.frame_timeout_s)
            while True:
                left = end - time.monotonic()
                try:
                    if left > 0 and self._pollin().poll(max(1, int(left * 1000) + 1)):
                        return
                except InterruptedError:
                    continue
                except OSError as e:
                    self._recv_failed(e, idle=False)
                if time.monotonic() >= end:
                    raise self._break(DeadlineExceeded(
                        f"{self.peer} sent no byte of a payload it announced within {self.frame_timeout_s}s",
                        peer=self.peer, reason="frame_timeout", timeout_s=self.frame_timeout_s))
        try:
            self._wait_readable()
        except Idle:
            raise self._break(DeadlineExceeded(f"{self.peer} stalled inside a frame for {self.io_timeout_s}s",
                                               peer=self.peer, reason="stalled")) from None

    def poll_for(self, budget_s: float) -> bool:
        """Wait up to ``budget_s`` for the next bytes *without sleeping*: poll the socket,
        yielding the CPU between polls, and return whether bytes (or the peer's close) are
        there.  For a reader that expects a frame within microseconds: on a VM, waking a
        thread whose vCPU halted while it slept can cost tens of microseconds, more than
        the wait itself.  Other runnable threads on this CPU still run (``sched_yield``)."""
        if self._rend > self._rpos:
            return True
        poller = self._pollin()
        end = time.perf_counter() + budget_s
        while True:
            if poller.poll(0):
                return True
            if time.perf_counter() >= end:
                return False
            os.sched_yield()

    def _pollin(self) -> select.poll:
        poller = self._poller
        if poller is None:
            poller = self._poller = select.poll()
            poller.register(self.sock.fileno(), select.POLLIN)
        return poller

    def _wait_readable(self) -> None:
        """Sleep until bytes or the peer's close arrive; :class:`Idle` after ``SO_RCVTIMEO`` without.

        (Not a blocking ``recv``: see "Idle waits" in the module docstring.)"""
        sec, usec = struct.unpack("ll", self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16))
        wait_ms = sec * 1000 + -(-usec // 1000) if sec or usec else None  # (all zero: no timeout)
        try:
            ready = self._pollin().poll(wait_ms)
        except OSError as e:
            self._recv_failed(e, idle=True)
        if not ready:
            raise Idle()

    def _fill(self, need: int, *, at_boundary: bool) -> None:
        """Read until ``need`` unread bytes are buffered (taking whatever more is available)."""
        have = self._rend - self._rpos
        if self._rpos:
            # compact: the unread tail moves to the front (a few bytes, usually none); through
            # bytes() because source and target overlap
            self._rbuf[:have] = bytes(self._rview[self._rpos:self._rend])
            self._rpos, self._rend = 0, have
        while self._rend < need:
            idle = at_boundary and self._rend == 0
            if not idle:
                self._start_frame()
                self._check_deadline(wait=True)
            try:
                # between frames: take what is there, else sleep in poll() until something is
                got = self.sock.recv_into(self._rview[self._rend:], 0, socket.MSG_DONTWAIT if idle else 0)
            except BlockingIOError as e:
                if not idle:  # (SO_RCVTIMEO ran out inside a frame)
                    self._recv_failed(e, idle=False)
                self._wait_readable()
                continue
            except OSError as e:
                self._recv_failed(e, idle=idle)
            if got == 0:
                if at_boundary and self._rend == 0:
                    raise PeerClosed(f"{self.peer} closed the connection", peer=self.peer)
                raise self._break(ProtocolError(f"{self.peer} closed the connection inside a frame",
                                                reason="truncated", peer=self.peer))
            self._rend += got

    def recv_into(self, dest: memoryview) -> None:
        """Receive exactly ``len(dest)`` payload bytes into ``dest``."""
        off = min(self._rend - self._rpos, len(dest))
        if off:
            dest[:off] = self._rview[self._rpos:self._rpos + off]
            self._rpos += off
        n = len(dest)
        while off < n:
            if self._deadline is not None:
                # between chunks; a chunk's own wait is bounded by SO_RCVTIMEO, which a
                # server with a frame deadline keeps no longer than it
                self._check_deadline(wait=False)
            try:
                got = self.sock.recv_into(dest[off:off + CHUNK], 0, socket.MSG_WAITALL)
            except OSError as e:
                self._recv_failed(e, idle=False)
            if got == 0:
                raise self._break(ProtocolError(f"{self.peer} closed the connection inside a payload "
                                                f"({off} of {n} bytes received)",
                                                reason="truncated", peer=self.peer))
            off += got

    def take_buffered(self, limit: int) -> memoryview:
        """Up to ``limit`` payload bytes that arrived with the header (the read-ahead), consumed:
        for a caller that receives the rest of the payload on the socket itself."""
        k = min(self._rend - self._rpos, limit)
        view = self._rview[self._rpos:self._rpos + k]
        self._rpos += k
        return view

    def recv_into_parts(self, dests: Sequence[memoryview]) -> None:
        """Receive a payload scattered over ``dests`` in order (each filled before the next)."""
        for d in dests:
            if len(d):
                self.recv_into(d)

    def discard(self, n: int) -> None:
        """Skip ``n`` payload bytes nobody wants (unknown request id, unread by a handler)."""
        scratch = memoryview(bytearray(min(n, 1 << 20)))
        while n:
            k = min(n, len(scratch))
            self.recv_into(scratch[:k])
            n -= k

    def _recv_failed(self, e: OSError, *, idle: bool) -> NoReturn:
        if _is_timeout(e):
            if idle:
                raise Idle() from None
            self._check_deadline(wait=False)  # (a frame past its deadline says so)
            raise self._break(DeadlineExceeded(f"{self.peer} stalled inside a frame for {self.io_timeout_s}s",
                                               peer=self.peer, reason="stalled")) from None
        if self._closed:
            raise self._break(Unavailable(f"connection to {self.peer} was closed",
                                          peer=self.peer, reason="closed")) from None
        raise self._break(Unavailable(f"connection to {self.peer} failed: {e}",
                                      peer=self.peer, reason="recv_failed")) from None

    def _break(self, err: FireFlyerError) -> FireFlyerError:
        # the stream position is now unknown: nothing more can be framed on this connection
        self.broken = True
        if self.failure is None:
            self.failure = err
        return err

    # ------------------------------------------------------------------ closing

    def unacked_bytes(self) -> int:
        """Bytes we sent that the peer has not acknowledged yet (Linux ``SIOCOUTQ``); 0 once
        the socket is closed or reset.  Closing a socket whose input holds unread bytes makes
        the kernel reset the connection and drop these, so a closer that must be heard waits
        for this to reach 0 first; what the peer acknowledged stays readable there."""
        try:
            out = fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
        except (OSError, ValueError):  # closed: nothing of ours can arrive any more
            return 0
        return int.from_bytes(out, "little", signed=True)

    def shutdown(self) -> None:
        """Wake any thread blocked on this socket (close alone does not, on Linux)."""
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.shutdown()
        self.sock.close()

    def send_error_and_close(self, header: Header) -> None:
        """Best effort: tell the peer why, then close (used on rejected connections)."""
        try:
            if not self._send_broken:
                with self.send_lock:
                    self.send_frame(header)
                self.sock.shutdown(socket.SHUT_WR)
                # lingering close: closing with unread input makes the kernel send a reset, which
                # can destroy the error frame before the peer reads it; drain a little first
                set_io_timeout(self.sock, _LINGER_S)
                scratch = self._rview
                for _ in range(_LINGER_READS):
                    if not self.sock.recv_into(scratch):
                        break
        except (OSError, FireFlyerError):
            pass
        self.close()
