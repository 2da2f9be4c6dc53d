"""Connections of the HFReduce node engine: one authenticated TCP link per tree edge.

**Topology.**  For every tree ``t`` and every edge (parent, child) of ``t`` there is
exactly one connection, dialled by the child to the parent's listener.  Two nodes
adjacent in both trees therefore hold two connections: each carries one tree's
traffic only, so the frames on a link form a single ordered stream per direction
(child -> parent: the up chunks, parent -> child: the down chunks) and a reader
always knows what the next data frame must be.

**Handshake** (``fireflyer.wire`` frames): the child sends ``hello`` with the bearer
token and ``client = "hfreduce/<node>/<tree>/<nnodes>/<chunk_bytes>-<inline_bytes>"``; the parent
checks the token (constant time), that the node is its child in that tree and that
both sides cut buffers into the same chunks, and answers ``welcome`` or an
``error`` frame (rid 0) saying why, then closes.

**After the handshake** sockets are blocking with no I/O timeout: the engine
enforces deadlines itself (it knows which peer, tree and chunk it waits for) and
wakes blocked threads with ``shutdown`` on abort or close.
"""

from __future__ import annotations

import hmac
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fireflyer.core.errors import FireFlyerError, ProtocolError, Unauthenticated
from fireflyer.core.log import get_logger
from fireflyer.wire.conn import FramedSocket, set_io_timeout, tune_socket
from fireflyer.wire.frame import ErrorFrame, FrameLimits, Hello, Request, Welcome

__all__ = ["Link", "PARENT", "CHILD", "parse_address", "dial", "Acceptor", "hello_name"]

_log = get_logger("fireflyer.hfreduce.links")

#: the peer's role relative to us on a link
PARENT = "parent"
CHILD = "child"
_HANDSHAKE_S = 5.0


def parse_address(addr: str) -> tuple[str, int]:
    """``"host:port"`` (``"[v6]:port"`` too) -> (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"engine address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


def hello_name(node: int, tree: int, nnodes: int, layout: str) -> str:
    """``layout`` is ``"<chunk_bytes>-<inline_bytes>"``: both decide how buffers are cut into frames."""
    return f"hfreduce/{node}/{tree}/{nnodes}/{layout}"


@dataclass(eq=False)
class Link:
    """One connection of this node in one tree, with the state its threads share.

    ``peer``'s role is ``PARENT`` or ``CHILD`` relative to us.  Ring state (only on
    child links, which receive up chunks into ``slots``): ``arrived`` counts up
    frames received into the ring, ``consumed`` those the tree's up thread has
    reduced; frame ``i`` lives in ``slots[i % len(slots)]`` with its header in
    ``meta[i % len(slots)]``.  All counters change under the engine lock.
    """

    peer: int
    tree: int
    role: str
    addr: str
    fs: FramedSocket
    slots: list[memoryview] = field(default_factory=list)
    meta: list[tuple[int, int, int, object, float]] = field(default_factory=list)
    arrived: int = 0
    consumed: int = 0
    #: highest op number seen from the peer on this link (data or status frame); -1: none
    seen_op: int = -1
    #: frames of the current op the down writer has sent (child links)
    sent: int = 0
    cv: threading.Condition | None = None
    #: child links: the up frame of a threaded op whose header the reader has read and whose
    #: payload it leaves on the socket for the tree's up thread (``_streamed.Parked``)
    park: Any = None
    #: the thread that reads this link (set when the engine starts it)
    reader: threading.Thread | None = None

    def name(self) -> str:
        return f"node {self.peer} ({self.addr}) tree {self.tree}"

    def send(self, header: Request, payload: memoryview | None = None) -> float:
        """Send one frame under the link's send lock; return seconds spent in the socket call."""
        t0 = time.perf_counter()
        with self.fs.send_lock:
            if payload is None:
                self.fs.send_frame(header)
            else:
                self.fs.send_frame(header, payload)
        return time.perf_counter() - t0

    def try_send(self, header: Request, lock_timeout_s: float) -> bool:
        """Best effort for control frames: skip when a data frame holds the link that long."""
        if not self.fs.send_lock.acquire(timeout=lock_timeout_s):
            return False
        try:
            if self.fs.broken:
                return False
            self.fs.send_frame(header)
            return True
        except (OSError, FireFlyerError):
            return False
        finally:
            self.fs.send_lock.release()


def dial(addr: str, *, me: int, tree: int, nnodes: int, layout: str, token: str,
         limits: FrameLimits, buf_bytes: int | None, timeout_s: float,
         congestion: Sequence[str] = (), send_buf_bytes: int | None = None) -> FramedSocket:
    """Connect to a parent and authenticate; raises OSError (retry) or FireFlyerError (don't).

    ``congestion``: the TCP congestion controls to try, in order (each end sets its own:
    it governs what that end sends; empty: the system default).  ``buf_bytes`` /
    ``send_buf_bytes``: :func:`~fireflyer.wire.conn.tune_socket`'s."""
    host, port = parse_address(addr)
    sock = socket.create_connection((host, port), timeout=max(0.05, timeout_s))
    try:
        tune_socket(sock, io_timeout_s=min(_HANDSHAKE_S, max(0.05, timeout_s)), buf_bytes=buf_bytes,
                    congestion=congestion, send_buf_bytes=send_buf_bytes)
        fs = FramedSocket(sock, peer=addr, limits=limits, io_timeout_s=_HANDSHAKE_S)
        fs.send_frame(Hello(token=token, client=hello_name(me, tree, nnodes, layout)))
        header, size = fs.read_header()
        if isinstance(header, ErrorFrame):
            err = header.error
            raise Unauthenticated(f"node at {addr} refused our tree-{tree} link: {err.get('message')}",
                                  peer=addr, tree=tree)
        if not isinstance(header, Welcome) or size:
            raise ProtocolError(f"node at {addr} answered the hello with {type(header).__name__}",
                                reason="expected_welcome", peer=addr)
        set_io_timeout(sock, None)
        fs.io_timeout_s = None
        return fs
    except BaseException:
        sock.close()
        raise


class Acceptor:
    """Accepts the children's links on the listener until all expected ones arrived.

    ``expected`` is the set of (child node, tree) pairs; ``on_link(node, tree, fs)``
    gets each authenticated connection (a re-dial replaces an earlier one).
    """

    def __init__(self, listener: socket.socket, *, me: int, nnodes: int, layout: str, token: str,
                 expected: set[tuple[int, int]], limits: FrameLimits, buf_bytes: int | None,
                 on_link: Callable[[int, int, FramedSocket], None], congestion: Sequence[str] = (),
                 send_buf_bytes: int | None = None) -> None:
        self.listener = listener
        self.me, self.nnodes, self.layout, self.token = me, nnodes, layout, token
        self.expected = set(expected)
        self.got: set[tuple[int, int]] = set()
        self.limits, self.buf_bytes, self.on_link = limits, buf_bytes, on_link
        self.congestion = tuple(congestion)
        self.send_buf_bytes = send_buf_bytes
        self.stop = threading.Event()
        # set here, not in the thread: an engine that fails at once closes the listener, maybe
        # before the thread first runs (settimeout on a closed socket raises EBADF there)
        listener.settimeout(0.1)
        self.thread = threading.Thread(target=self._run, name=f"hfr-accept-{me}", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set() and self.got != self.expected:
            try:
                sock, peer_addr = self.listener.accept()
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                return  # listener closed
            try:
                self._handshake(sock, f"{peer_addr[0]}:{peer_addr[1]}")
            except (OSError, FireFlyerError) as e:
                _log.warning("hfreduce link rejected", node=self.me, peer=f"{peer_addr[0]}:{peer_addr[1]}",
                             error=str(e))
                sock.close()

    def _handshake(self, sock: socket.socket, peer: str) -> None:
        sock.settimeout(None)
        tune_socket(sock, io_timeout_s=_HANDSHAKE_S, buf_bytes=self.buf_bytes, congestion=self.congestion,
                    send_buf_bytes=self.send_buf_bytes)
        fs = FramedSocket(sock, peer=peer, limits=self.limits, io_timeout_s=_HANDSHAKE_S)
        header, size = fs.read_header()
        why = ""
        node = tree = -1
        if not isinstance(header, Hello) or size:
            why = f"the first frame must be a hello, got {type(header).__name__}"
        elif not hmac.compare_digest(header.token.encode(), self.token.encode()):
            why = "bad token"
        else:
            parts = header.client.split("/")
            if len(parts) != 5 or parts[0] != "hfreduce" or not all(p.isdigit() for p in parts[1:4]):
                why = f"not an hfreduce engine: {header.client!r}"
            else:
                node, tree, nnodes = (int(p) for p in parts[1:4])
                if nnodes != self.nnodes or parts[4] != self.layout:
                    why = (f"configuration differs: peer has {nnodes} nodes and chunk-inline bytes {parts[4]}, "
                           f"we have {self.nnodes} and {self.layout}")
                elif (node, tree) not in self.expected:
                    why = f"node {node} is not our child in tree {tree}"
        if why:
            err = Unauthenticated(why) if why == "bad token" else ProtocolError(why, reason="bad_hello")
            fs.send_error_and_close(ErrorFrame(rid=0, error=err.to_dict()))
            raise err
        fs.send_frame(Welcome(principal=f"node {node}", server=f"hfreduce/{self.me}"))
        set_io_timeout(sock, None)
        fs.io_timeout_s = None
        self.got.add((node, tree))
        self.on_link(node, tree, fs)
