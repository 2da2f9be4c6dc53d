"""The control protocol between local ranks and their node's HFReduce worker (Unix socket).

Only control messages ride this socket; data stays in shared memory (:mod:`.shm`).

**Framing.**  Every message is a 4-byte big-endian unsigned length followed by that
many bytes of msgpack: one tagged msgspec Struct (tag field ``"t"``).  Messages larger
than :data:`MAX_MESSAGE` are a protocol error (the peer is not ours).

**Conversation** (rank -> worker unless marked <-)::

    Hello(comm, rank, ...)                 <- Welcome(generation, chunk_bytes)  or Failed(seq=-1)
    Register(seg, name, nbytes)            <- Registered(seg) or Failed(seq=-1)
        the worker maps /dev/shm/<name> and *unlinks it*; from then on the segment lives only
        as long as the two mappings, so nothing leaks whoever dies (see .shm)
    Submit(seq, kind, op, dtype, count, seg, offset, root, timeout_s[, out_seg, out_offset, out_count])
                                           (many may be in flight)
                                           <- Done(seq, record) or Failed(seq, error)
    Unregister(seg)                        (no reply)
    StatusRequest(req)                     <- StatusReply(req, recent, pending)
    Bye()                                  clean close: the rank leaves the communicator

Ops of one communicator complete in ``seq`` order; replies to one connection are
sent in order.  ``Failed.error`` is :meth:`FireFlyerError.to_dict` output, rebuilt
on the rank with :func:`fireflyer.core.errors.error_from_dict` so the rank raises the
same typed :class:`~fireflyer.hfreduce.errors.HFReduceError` the worker saw.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from typing import Any

import msgspec

from fireflyer.core.errors import ProtocolError

from .telemetry import OpRecord

__all__ = [
    "PROTOCOL_VERSION",
    "MAX_MESSAGE",
    "Hello",
    "Welcome",
    "Register",
    "Registered",
    "Unregister",
    "Submit",
    "Done",
    "Failed",
    "StatusRequest",
    "StatusReply",
    "Bye",
    "Message",
    "encode",
    "decode",
    "Channel",
]

PROTOCOL_VERSION = 1
MAX_MESSAGE = 64 << 20
_LEN = struct.Struct(">I")
_READ_BYTES = 64 << 10


class _Msg(msgspec.Struct, tag_field="t", frozen=True, kw_only=True):
    pass


class Hello(_Msg, tag="hello", kw_only=True):
    """A rank joins communicator ``comm`` (job-scoped name) on this node."""

    comm: str
    job_id: str = ""
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    nnodes: int
    pid: int
    timeout_s: float = 0.0
    version: int = PROTOCOL_VERSION


class Welcome(_Msg, tag="welcome", kw_only=True):
    generation: int
    node_rank: int
    chunk_bytes: int
    worker_pid: int
    timeout_s: float


class Register(_Msg, tag="register", kw_only=True):
    """Map shared-memory segment ``name`` (``nbytes`` long) under the rank-chosen id ``seg``."""

    seg: int
    name: str
    nbytes: int


class Registered(_Msg, tag="registered", kw_only=True):
    seg: int


class Unregister(_Msg, tag="unregister", kw_only=True):
    seg: int


class Submit(_Msg, tag="submit", kw_only=True):
    """Op number ``seq`` of this rank on data at ``offset`` bytes into segment ``seg``.

    ``kind`` is allreduce / reduce / broadcast / barrier / allgather / reduce_scatter; ``root``
    a global rank (reduce, broadcast) or -1; ``seg`` is -1 for barrier and count 0.  allgather
    and reduce_scatter read ``count`` elements at ``seg``/``offset`` (the rank's input, left as it
    is) and write ``out_count`` elements at ``out_seg``/``out_offset`` (its output).
    """

    seq: int
    kind: str
    op: str
    dtype: str
    count: int
    seg: int = -1
    offset: int = 0
    root: int = -1
    timeout_s: float = 0.0
    #: the rank wants the op's :class:`OpRecord` in its ``Done`` (``init(op_records=True)``);
    #: encoding and decoding one costs a small op ~10 us on each side, so only on request
    record: bool = False
    #: allgather / reduce_scatter: the output buffer (the input is ``seg``/``offset``/``count``)
    out_seg: int = -1
    out_offset: int = 0
    out_count: int = 0


class Done(_Msg, tag="done", kw_only=True):
    seq: int
    record: OpRecord | None = None


class Failed(_Msg, tag="failed", kw_only=True):
    """Op ``seq`` failed (or, with seq -1, the request that has no seq)."""

    seq: int
    error: dict[str, Any]


class StatusRequest(_Msg, tag="status", kw_only=True):
    req: int


class StatusReply(_Msg, tag="status_reply", kw_only=True):
    req: int
    recent: list[OpRecord]
    pending: list[OpRecord]
    worker: dict[str, Any] = msgspec.field(default_factory=dict)


class Bye(_Msg, tag="bye", kw_only=True):
    pass


Message = Hello | Welcome | Register | Registered | Unregister | Submit | Done | Failed | StatusRequest \
    | StatusReply | Bye

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: _Msg) -> bytes:
    """Length prefix + msgpack body, ready for ``sendall``."""
    body = _encoder.encode(msg)
    return _LEN.pack(len(body)) + body


def decode(body: bytes | memoryview) -> Message:
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError as e:
        raise ProtocolError(f"bad HFReduce control message: {e}") from e


class Channel:
    """One end of the control socket: framed receive, thread-safe send.

    ``recv`` returns None on a clean or abrupt EOF (a dead peer looks like EOF);
    ``send`` raises OSError once the peer is gone.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self.closed = False
        self._buf = bytearray(_READ_BYTES)
        self._view = memoryview(self._buf)
        self._pos = self._end = 0
        self._poll: select.poll | None = None

    def send(self, msg: _Msg) -> None:
        self.send_encoded(encode(msg))

    def send_encoded(self, data: bytes) -> None:
        """Send a message already :func:`encode` d (one encoding for several channels)."""
        with self._send_lock:
            self.sock.sendall(data)

    def _fill(self, need: int) -> bool:
        """Make ``need`` bytes available from ``_pos``, reading as much as the socket has; False on EOF."""
        if len(self._buf) - self._pos < need:  # compact (and grow for a large message)
            rest = self._buf[self._pos:self._end]
            if len(self._buf) < need:
                self._buf = bytearray(max(need, _READ_BYTES))
                self._view = memoryview(self._buf)
            self._buf[:len(rest)] = rest
            self._pos, self._end = 0, len(rest)
        while self._end - self._pos < need:
            try:
                k = self.sock.recv_into(self._view[self._end:])
            except (ConnectionResetError, OSError):
                return False
            if k == 0:
                return False
            self._end += k
        return True

    def buffered(self) -> bool:
        """A whole message is already read from the socket (``recv`` returns it without a system call)."""
        have = self._end - self._pos
        if have < _LEN.size:
            return False
        (n,) = _LEN.unpack_from(self._buf, self._pos)
        return have >= _LEN.size + n

    def readable(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a message (or EOF) to start arriving; True if ``recv`` won't idle."""
        if self.buffered():
            return True
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        try:
            return bool(self._poll.poll(max(0, int(timeout_s * 1000))))
        except (OSError, ValueError):
            return True  # closed under us: recv reports the EOF

    def recv(self) -> Message | None:
        """The next message, or None on EOF.  One thread at a time.

        Reads whatever the socket has into a reused buffer: a small message costs one
        system call (not two: length, then body), and several queued ones cost one.
        """
        if not self._fill(_LEN.size):
            return None
        (n,) = _LEN.unpack_from(self._buf, self._pos)
        if n > MAX_MESSAGE:
            raise ProtocolError(f"HFReduce control message of {n} bytes exceeds {MAX_MESSAGE}")
        if not self._fill(_LEN.size + n):
            return None
        start = self._pos + _LEN.size
        self._pos = start + n
        return decode(self._view[start:self._pos])  # decoding copies out: the buffer is reused

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
