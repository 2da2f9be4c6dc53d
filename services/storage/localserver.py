"""The storage node's Unix socket for short-circuit local reads (:mod:`fireflyer.storage.localread`).

One listening ``SOCK_SEQPACKET`` socket (default ``<target_root>/local.sock``, mode
``local_socket_mode``), an accept thread and a thread per connection (clients pool their
connections; at most ``max_conns`` at once, more are closed at accept and those clients read
over the network).  Each request datagram is authenticated with the bearer token it
carries (the same lookup the wire server applies at connect), then handed to the data plane
(:meth:`~.dataplane.DataPlane.open_local`), which authorizes it as a ``stor.batch_read`` and
opens each chunk's version file; the reply carries the descriptors (``SCM_RIGHTS``) and
this side closes its copies right after sending.  A rejected token gets an error and no
descriptors.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from fireflyer.core.errors import FireFlyerError, Internal, ProtocolError, Unauthenticated
from fireflyer.core.log import get_logger
from fireflyer.storage.localread import (
    MAX_IOS,
    MAX_MESSAGE,
    LocalReadReply,
    bind_unix,
    decode_request,
    encode,
)
from fireflyer.storage.protocol import ReadMsg

__all__ = ["LocalReadServer"]

log = get_logger(__name__)

#: (principal, I/Os) -> the reply and the open files its descriptors refer to (closed here after sending)
OpenLocal = Callable[[Any, list[ReadMsg], list[bytes]], tuple[LocalReadReply, list[BinaryIO]]]


class LocalReadServer:
    def __init__(self, path: Path, open_local: OpenLocal, *, authenticate: Callable[[str], Any],
                 mode: int = 0o666, max_conns: int = 256, name: str = "storage") -> None:
        self.path = path
        self.open_local = open_local
        self.authenticate = authenticate
        self.mode = mode
        self.max_conns = max_conns
        self.name = name
        self.requests = 0
        self.rejected = 0
        self._sock: socket.socket | None = None
        self._ino: tuple[int, int] | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def start(self) -> None:
        self._sock = bind_unix(self.path, self.mode)
        st = os.stat(self.path)
        self._ino = (st.st_dev, st.st_ino)
        self._thread = threading.Thread(target=self._accept_loop, name=f"{self.name}-local-accept", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with contextlib.suppress(OSError):  # only our own socket file (a successor may have bound the path)
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._ino:
                os.unlink(self.path)
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(2.0)

    def _accept_loop(self) -> None:
        while not self._stopping:
            sock = self._sock
            if sock is None:
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                if self._stopping:
                    return
                continue
            with self._lock:
                full = len(self._conns) >= self.max_conns
                if not full:
                    self._conns.add(conn)
            if full:
                log.warning("storage.local_reads_conn_limit", limit=self.max_conns)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name=f"{self.name}-local", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while not self._stopping:
                try:
                    data = conn.recv(MAX_MESSAGE)
                except OSError:
                    return
                if not data:
                    return
                reply, files = self._handle(data)
                try:
                    payload = encode(reply)
                    fds = [f.fileno() for f in files]
                    if fds:
                        socket.send_fds(conn, [payload], fds)
                    else:
                        conn.sendall(payload)
                except OSError:
                    return
                finally:
                    for f in files:
                        f.close()
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _handle(self, data: bytes) -> tuple[LocalReadReply, list[BinaryIO]]:
        self.requests += 1
        try:
            try:
                req = decode_request(data)
            except msgspec.DecodeError as e:
                raise ProtocolError(f"bad local read request: {e}") from None
            if len(req.ios) > MAX_IOS:
                raise ProtocolError(f"local read request has {len(req.ios)} I/Os (limit {MAX_IOS})",
                                    ios=len(req.ios), limit=MAX_IOS)
            try:
                principal = self.authenticate(req.token)
            except Exception:  # an authenticator bug rejects, it does not crash the thread
                log.exception("storage.local_reads_auth_failed")
                principal = None
            if principal is None:
                self.rejected += 1
                # never log the token itself
                log.warning("storage.local_reads_rejected", reason="bad_token")
                raise Unauthenticated(f"local read request rejected by {self.name}: invalid or expired token")
            return self.open_local(principal, req.ios, req.caps)
        except FireFlyerError as e:
            return LocalReadReply(error=e.to_dict()), []
        except Exception as e:  # answer, never kill the connection thread
            log.exception("storage.local_reads_failed")
            return LocalReadReply(error=Internal(f"local read failed: {type(e).__name__}: {e}").to_dict()), []
