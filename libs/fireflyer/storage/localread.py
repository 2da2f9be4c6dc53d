"""Short-circuit local reads: chunk files handed over a Unix socket as open descriptors.

A client on the same machine as a storage node need not pull chunk bytes through TCP
loopback (the node ``sendfile`` s them, the client ``recv`` s them: two copies and a socket
stack).  Instead it asks the node, over a Unix-domain ``SOCK_SEQPACKET`` socket, to *open*
the committed version files of a batch of chunks and pass the descriptors back
(``SCM_RIGHTS``), with each chunk's version, the byte count to read and the CRC32C recorded
at write time; the client then ``preadv`` s the bytes straight into its own buffers (one
copy, from the page cache) and checks them as the network path does:

- a **whole** version (offset 0, to its end) against the CRC recorded at write time, so a
  copy damaged on disk is caught by the reader, retried on another replica and reported
  to the node (``stor.report_corrupt``, over the network: the node then verifies the chunk);
- a **partial** read has no recorded CRC covering its range.  The network path checks it
  against a CRC the server computes over the bytes it read from the same file, which guards
  only the transfer; a local read has no transfer, so there is nothing to compare (the
  store's ``verify_reads`` mode, which re-checks every read, disables local reads).

Version files are immutable (copy-on-write), and an open one stays readable after a
commit unlinks it, so the bytes read through a descriptor are exactly the version named.

**Messages.**  Request: :class:`LocalReadRequest` (the caller's bearer token, then the same
:class:`~.protocol.ReadMsg` s a ``stor.batch_read`` carries), msgpack in one datagram.
Reply: :class:`LocalReadReply` (a request-level error, or one :class:`LocalIo` per I/O,
each naming the index of its descriptor in the datagram's ``SCM_RIGHTS`` array; I/Os of one
chunk share one descriptor).  A request whose token the node rejects gets an error and no
descriptors; every I/O passes the checks of a network read (chain version, serving state,
known-corrupted copies, pending versions -> ``NotCommitted`` unless ``relaxed``, a missing
chunk -> ``ChunkNotFound``).

**Discovery.**  A node advertises ``local=<host identity>|<socket path>`` in its heartbeat
tags (beside ``wire=host:port``); :func:`host_identity` is the host name plus the kernel's
boot id, so a client uses the socket only on the same machine (and boot), and only when it
connects.  Paths longer than ``sun_path`` allows are bound and reached through
``/proc/self/fd/<dir fd>/<name>``.
"""

from __future__ import annotations

import contextlib
import errno as E
import os
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.core.errors import DeadlineExceeded, FailedPrecondition, Unavailable

from .protocol import ReadMsg

__all__ = [
    "LOCAL_TAG",
    "MAX_IOS",
    "LocalReadRequest",
    "LocalIo",
    "LocalReadReply",
    "LocalPathBroken",
    "LocalReadClient",
    "host_identity",
    "local_tag",
    "local_socket",
    "local_reads_default",
    "bind_unix",
    "encode",
    "decode_request",
]

LOCAL_TAG = "local="
#: I/Os (and so at most this many descriptors) per request
MAX_IOS = 64
#: one datagram's bytes (requests and replies are a few KiB)
MAX_MESSAGE = 256 * 1024
_SUN_PATH_MAX = 107


class LocalReadRequest(msgspec.Struct, frozen=True, kw_only=True):
    token: str
    ios: list[ReadMsg]
    #: capabilities covering every I/O's chunk (:mod:`.capability`), as in ``stor.batch_read``
    caps: list[bytes] = []


class LocalIo(msgspec.Struct, frozen=True, kw_only=True):
    """One I/O: ``error`` (``FireFlyerError.to_dict``), or where its bytes are: ``length``
    bytes at ``offset`` of descriptor number ``fd`` of the reply; ``whole``: the range is
    the whole version and ``crc`` its recorded CRC32C (else ``crc`` is 0, nothing to check)."""

    error: dict[str, Any] | None = None
    fd: int = -1
    offset: int = 0
    length: int = 0
    version: int = 0
    crc: int = 0
    whole: bool = False
    target: int = 0
    uncommitted: bool = False


class LocalReadReply(msgspec.Struct, frozen=True, kw_only=True):
    error: dict[str, Any] | None = None
    results: list[LocalIo] = msgspec.field(default_factory=list)


_enc = msgspec.msgpack.Encoder()
_req_dec = msgspec.msgpack.Decoder(LocalReadRequest)
_reply_dec = msgspec.msgpack.Decoder(LocalReadReply)


def encode(msg: msgspec.Struct) -> bytes:
    return _enc.encode(msg)


def decode_request(data: bytes) -> LocalReadRequest:
    return _req_dec.decode(data)


class LocalPathBroken(Unavailable):
    """The local path failed as a transport (no socket, refused, reset, a garbled reply):
    the read goes over the network instead.  ``connect``: it failed before a connection."""


# -- discovery ----------------------------------------------------------------------------


@cache
def host_identity() -> str:
    """This machine and boot: ``<hostname>/<boot id>`` (a reboot or another host differs)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def local_tag(path: str | os.PathLike[str], host: str | None = None) -> str:
    return f"{LOCAL_TAG}{host or host_identity()}|{os.fspath(path)}"


def local_socket(tags: Sequence[str], host: str | None = None) -> str | None:
    """The socket path a node's tags advertise for clients on ``host`` (default: this one)."""
    me = host or host_identity()
    for t in tags:
        if t.startswith(LOCAL_TAG):
            who, sep, path = t[len(LOCAL_TAG):].partition("|")
            if sep and who == me and path:
                return path
    return None


def local_reads_default(env: Mapping[str, str] | None = None) -> bool:
    """``FF_FS_LOCAL_READS`` (default on; ``0``/``false``/``no``/``off`` turn it off)."""
    raw = (os.environ if env is None else env).get("FF_FS_LOCAL_READS", "")
    return raw.strip().lower() not in ("0", "false", "no", "off")


@contextlib.contextmanager
def _sun_path(path: str) -> Iterator[str]:
    """``path`` as a socket address; a long one through ``/proc/self/fd`` of its directory."""
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        yield path
        return
    parent, name = os.path.split(path)
    dfd = os.open(parent or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{dfd}/{name}"
    finally:
        os.close(dfd)


def bind_unix(path: str | os.PathLike[str], mode: int) -> socket.socket:
    """A listening ``SOCK_SEQPACKET`` socket at ``path``: a stale one there (nobody listening)
    is replaced; one that another process serves raises :class:`FailedPrecondition`."""
    p = os.fspath(path)
    os.makedirs(os.path.dirname(p) or ".", mode=0o755, exist_ok=True)
    if os.path.lexists(p):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        probe.settimeout(1.0)
        try:
            with _sun_path(p) as addr:
                probe.connect(addr)
        except OSError:
            pass  # refused (or not a socket): stale, replace it
        else:
            raise FailedPrecondition(f"{p} is served by another live process; give each storage node its own "
                                     "socket (storage.local_socket)", path=p)
        finally:
            probe.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        with _sun_path(p) as addr:
            sock.bind(addr)
        os.chmod(p, mode)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


# -- client -------------------------------------------------------------------------------


class LocalReadClient:
    """Connections to local storage nodes' sockets (idle ones pooled per path).  Thread safe."""

    def __init__(self, token: str, *, timeout_s: float = 5.0, max_idle: int = 64) -> None:
        self.token = token
        self.timeout_s = timeout_s
        self.max_idle = max_idle
        self._idle: dict[str, list[socket.socket]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _connect(self, path: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.settimeout(self.timeout_s)
        try:
            with _sun_path(path) as addr:
                sock.connect(addr)
        except OSError as e:
            sock.close()
            err = LocalPathBroken(f"local read socket {path}: {e.strerror or e}", path=path, errno=e.errno or 0)
            err.fields["connect"] = True
            raise err from None
        return sock

    def _take(self, path: str) -> tuple[socket.socket, bool]:
        with self._lock:
            if self._closed:
                raise LocalPathBroken("local read client is closed", path=path)
            idle = self._idle.get(path)
            if idle:
                return idle.pop(), True
        return self._connect(path), False

    def _give(self, path: str, sock: socket.socket) -> None:
        with self._lock:
            idle = self._idle.setdefault(path, [])
            if not self._closed and len(idle) < self.max_idle:
                idle.append(sock)
                return
        sock.close()

    def forget(self, path: str) -> None:
        """Drop the idle connections to ``path`` (its server went away or was replaced)."""
        with self._lock:
            socks = self._idle.pop(path, [])
        for s in socks:
            s.close()

    def open(self, path: str, ios: Sequence[ReadMsg], caps: Sequence[bytes] = ()) -> tuple[LocalReadReply, list[int]]:
        """One round trip: the reply and the descriptors it carried (the caller closes them).

        Raises :class:`LocalPathBroken` for transport failures (after retrying once on a
        fresh connection when a pooled one turned out dead), :class:`DeadlineExceeded`
        when the node does not answer in ``timeout_s``."""
        data = encode(LocalReadRequest(token=self.token, ios=list(ios), caps=list(caps)))
        for attempt in (0, 1):
            sock, pooled = self._take(path)
            try:
                got = self._round_trip(sock, data, path)
            except LocalPathBroken:
                sock.close()
                if pooled and attempt == 0:
                    self.forget(path)  # the server was replaced or restarted: reconnect once
                    continue
                raise
            except BaseException:
                sock.close()
                raise
            self._give(path, sock)
            return got
        raise AssertionError("unreachable")

    def _round_trip(self, sock: socket.socket, data: bytes, path: str) -> tuple[LocalReadReply, list[int]]:
        try:
            sock.sendall(data)
            msg, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_IOS)
        except TimeoutError:
            raise DeadlineExceeded(f"local read socket {path}: no reply within {self.timeout_s}s",
                                   path=path, timeout_s=self.timeout_s) from None
        except OSError as e:
            raise LocalPathBroken(f"local read socket {path}: {e.strerror or e}", path=path,
                                  errno=e.errno or 0) from None
        try:
            if not msg:
                raise LocalPathBroken(f"local read socket {path}: closed by the storage node", path=path,
                                      errno=E.ECONNRESET)
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                # e.g. out of descriptors here (RLIMIT_NOFILE): the kernel dropped some
                raise LocalPathBroken(f"local read socket {path}: reply truncated (flags {flags:#x})", path=path)
            try:
                reply = _reply_dec.decode(msg)
            except msgspec.DecodeError as e:
                raise LocalPathBroken(f"local read socket {path}: bad reply ({e})", path=path) from None
            if any(r.fd >= len(fds) for r in reply.results):
                raise LocalPathBroken(f"local read socket {path}: reply names a missing descriptor", path=path)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return reply, fds

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
        for s in socks:
            s.close()
