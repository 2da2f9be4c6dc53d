"""A minimal synchronous data-path client of the storage service (:mod:`.protocol`).

    routing = MgmtdRouting(["127.0.0.1:7001"], token=token)        # or any () -> RoutingInfo
    client = StorageClient(routing.get, token=token)
    client.write(chain_id=1, chunk_id=ChunkId(inode, 0, 0), offset=0, data=b"...", chunk_size=1 << 20)
    data = client.read(1, ChunkId(inode, 0, 0))
    results = client.batch_read([ReadIo(chain_id=1, chunk_id=..., offset=0, length=4096), ...])
    client.write_range(inode, offset, data, chunk_size, chain_of=lambda index: chains[index % len(chains)])

What it does, and no more (the fs client builds layouts, sessions and caching on top):

- **Routing**: ``routing()`` returns the newest :class:`~fireflyer.mgmt.model.RoutingInfo`;
  the client calls it again after any error that says its view may be old
  (ChainVersionMismatch, NotHead, NotServing, a dead node).  Addresses come from the
  storage nodes' ``wire=host:port`` heartbeat tags.
- **Writes** go to the chain head, carrying the chain version and a (client, channel,
  seq) triple; a retry reuses the triple, so the head applies a retried write once.
  Channels are per thread (one request at a time per channel, as the head requires).
- **Reads** go to a random serving replica (load balance); on failure (timeout, dead
  node, NotServing, ChunkCorrupted) the next try excludes that replica, and a node
  that timed out is avoided for ``avoid_s``.  NotCommitted backs off and retries, or
  is read as is with ``relaxed=True``.
- **Request-to-send**: every read is a ``stor.batch_read`` (statuses) followed, for the
  bytes, by ``stor.rts_grant`` taken under a :class:`SendLimiter` token, so at most
  ``total`` servers (``per_server`` per server) send to this client at once.
- **Into the caller's buffers**: ``batch_read(ios, into=views)`` receives each I/O's bytes
  straight into its view (the fs client's file and batch reads), checking the CRC there; a
  batch of several I/Os is scattered over their views (no scratch buffer, no copy).
- **Integrity**: every I/O's bytes are checked against the CRC32C the server sent (for a whole
  chunk, the one recorded at write time: the server sends those bytes from disk unhashed).  A
  mismatch is retried on another replica and reported to the replica that sent it.
- **Batches** are split by :class:`~.protocol.BatchLimits` (128 I/Os / 4 MiB) per node.
- **Short-circuit local reads** (:mod:`.localread`; ``local_reads=``, default
  ``FF_FS_LOCAL_READS``, on): when a chain has a serving replica on a storage node of this
  host (its ``local=`` tag names this host's identity) that replica is preferred, and the
  batch is one round trip on the node's Unix socket, which returns the chunks' version files
  as descriptors; the bytes are ``preadv``-ed into the caller's buffers and whole chunks
  checked against their recorded CRC (a mismatch is retried elsewhere and reported, as
  above).  Per-I/O errors are the network path's; a transport failure of the local path
  (no socket, refused, reset, garbled) runs that batch over the network instead, once, and a
  node whose socket does not connect is read over the network for ``avoid_s``.
  :attr:`StorageClient.read_stats` counts I/Os per path.

Every call is bounded by ``retry_deadline_s``; requests by ``request_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from fireflyer.core.errors import (
    DeadlineExceeded,
    FireFlyerError,
    ResourceExhausted,
    Unavailable,
    error_from_dict,
)
from fireflyer.core.log import get_logger
from fireflyer.mgmt.model import Chain, RoutingInfo
from fireflyer.wire import Connection, Reply

from .capability import READ, WRITE, CapabilityCache, CapabilityDenied
from .checksum import crc32c
from .chunkid import ChunkId, split_range
from .craq import ReadReq, WriteAck, WriteReq
from .errors import (
    RETRY_AFTER_REFRESH,
    BadRequest,
    ChunkCorrupted,
    NotCommitted,
    NotServing,
    StorageError,
)
from .localread import MAX_IOS as LOCAL_MAX_IOS
from .localread import LocalIo, LocalPathBroken, LocalReadClient, local_reads_default, local_socket
from .protocol import (
    OP_BATCH_READ,
    OP_REPORT_CORRUPT,
    OP_RTS_GRANT,
    OP_WRITE,
    BatchLimits,
    BatchReadMsg,
    BatchReadReady,
    CorruptReport,
    IoResult,
    ReadMsg,
    RtsGrant,
    WriteMsg,
    error_of,
    split_address,
    to_meta,
    trusted_peer,
    wire_address,
)

__all__ = ["SendLimiter", "ConnectionPool", "ReadIo", "ReadResult", "ReadStats", "StorageClient", "MgmtdRouting"]

log = get_logger(__name__)

Buffer = bytes | bytearray | memoryview


class SendLimiter:
    """Request-to-send tokens: ``total`` grants in flight at most, ``per_server`` per server (3FS: 64, 8)."""

    def __init__(self, total: int = 64, per_server: int = 8) -> None:
        self.total, self.per_server = total, per_server
        self._cond = threading.Condition()
        self._by_server: dict[str, int] = {}
        self.inflight = 0
        self.max_inflight = 0
        self.max_per_server = 0

    @contextlib.contextmanager
    def token(self, server: str, timeout_s: float = 60.0) -> Iterator[None]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.inflight >= self.total or self._by_server.get(server, 0) >= self.per_server:
                if not self._cond.wait(deadline - time.monotonic()):
                    raise DeadlineExceeded(f"no send token for {server} within {timeout_s}s", server=server)
            self.inflight += 1
            n = self._by_server[server] = self._by_server.get(server, 0) + 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            self.max_per_server = max(self.max_per_server, n)
        try:
            yield
        finally:
            with self._cond:
                self.inflight -= 1
                self._by_server[server] -= 1
                self._cond.notify_all()


class ConnectionPool:
    """Idle authenticated wire connections per ``(host, port)``; each call holds one exclusively
    (a wire server answers one connection's requests in order).  Thread safe."""

    def __init__(self, *, token: str, name: str, connect_timeout_s: float = 2.0,
                 request_timeout_s: float = 5.0, io_timeout_s: float = 5.0, max_per_peer: int = 64) -> None:
        self.token, self.name = token, name
        self.connect_timeout_s, self.request_timeout_s = connect_timeout_s, request_timeout_s
        self.io_timeout_s, self.max_per_peer = io_timeout_s, max_per_peer
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        self._busy: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _take(self, peer: tuple[str, int]) -> Connection:
        where = f"{peer[0]}:{peer[1]}"
        with self._lock:
            if self._closed:
                raise Unavailable(f"{self.name}: connection pool is closed", peer=where)
            idle = self._idle.setdefault(peer, [])
            while idle:
                conn = idle.pop()
                if not conn.closed:
                    self._busy[peer] = self._busy.get(peer, 0) + 1
                    return conn
            if self._busy.get(peer, 0) >= self.max_per_peer:
                raise ResourceExhausted(f"{self.name}: {self.max_per_peer} calls to {where} in flight", peer=where)
            self._busy[peer] = self._busy.get(peer, 0) + 1
        try:
            return Connection.connect(peer[0], peer[1], token=self.token, timeout_s=self.connect_timeout_s,
                                      io_timeout_s=self.io_timeout_s, request_timeout_s=self.request_timeout_s,
                                      client_name=self.name)
        except BaseException:
            self._give(peer, None)
            raise

    def _give(self, peer: tuple[str, int], conn: Connection | None) -> None:
        with self._lock:
            self._busy[peer] -= 1
            if conn is not None and not conn.closed and not self._closed:
                self._idle.setdefault(peer, []).append(conn)
                return
        if conn is not None:
            conn.close()

    def call(self, peer: tuple[str, int], op: str, payload: Any = None, *, meta: dict[str, Any],
             into: Any = None, timeout_s: float | None = None) -> Reply:
        """One request; a broken or timed-out connection is closed, never reused."""
        conn = self._take(peer)
        keep = True
        try:
            return conn.request(op, payload, meta=meta, into=into, timeout_s=timeout_s)
        except (Unavailable, DeadlineExceeded) as e:
            # NotServing/NotCommitted are the peer's typed answers: the stream is fine
            keep = not conn.closed and isinstance(e, StorageError)
            raise
        finally:
            self._give(peer, conn if keep else None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for c in conns:
            c.close()


class ReadIo(msgspec.Struct, frozen=True, kw_only=True):
    chain_id: int
    chunk_id: ChunkId
    offset: int = 0
    length: int = -1  # to the chunk's end (then the I/O counts as a whole batch's bytes)
    relaxed: bool = False


class ReadResult(msgspec.Struct, frozen=True, kw_only=True):
    """One read I/O: ``data`` is ``bytes``, or a view of the caller's buffer for reads ``into`` one."""

    data: Buffer = b""
    error: FireFlyerError | None = None
    version: int = 0
    target: int = 0
    uncommitted: bool = False


class ReadStats:
    """Read I/Os (and their bytes) per path: short-circuit local or network; ``local_fallbacks``
    counts local batches that went over the network after a transport failure of the local path."""

    __slots__ = ("local_ios", "local_bytes", "network_ios", "network_bytes", "local_fallbacks", "_lock")

    def __init__(self) -> None:
        self.local_ios = self.local_bytes = self.network_ios = self.network_bytes = self.local_fallbacks = 0
        self._lock = threading.Lock()

    def add(self, *, local_ios: int = 0, local_bytes: int = 0, network_ios: int = 0, network_bytes: int = 0,
            local_fallbacks: int = 0) -> None:
        with self._lock:
            self.local_ios += local_ios
            self.local_bytes += local_bytes
            self.network_ios += network_ios
            self.network_bytes += network_bytes
            self.local_fallbacks += local_fallbacks

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {k: getattr(self, k) for k in self.__slots__ if k != "_lock"}

    def __repr__(self) -> str:
        return f"ReadStats({self.snapshot()})"


class StorageClient:
    def __init__(self, routing: Callable[[], RoutingInfo], *, token: str, client_id: str = "",
                 limiter: SendLimiter | None = None, limits: BatchLimits = BatchLimits(),
                 request_timeout_s: float = 5.0, connect_timeout_s: float = 2.0, retry_deadline_s: float = 20.0,
                 avoid_s: float = 2.0, max_parallel: int = 32, local_reads: bool | None = None,
                 capabilities: CapabilityCache | None = None) -> None:
        self._routing_fn = routing
        #: meta's capabilities for the files this client touches, attached to every chunk op
        #: (None: none sent; only a service principal's ops are then served)
        self.capabilities = capabilities
        self.routing = routing()
        self.client_id = client_id or f"client-{uuid.uuid4().hex[:12]}"
        self.limiter = limiter or SendLimiter()
        self.limits = limits
        self.retry_deadline_s = retry_deadline_s
        self.avoid_s = avoid_s
        self.pool = ConnectionPool(token=token, name=self.client_id, connect_timeout_s=connect_timeout_s,
                                   request_timeout_s=request_timeout_s, io_timeout_s=request_timeout_s)
        self._exec = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="storage-client")
        self._channels = itertools.count(1)
        self._local = threading.local()
        self._avoid: dict[str, float] = {}
        self._rng = random.Random()
        #: short-circuit local reads (None: ``FF_FS_LOCAL_READS``, default on)
        self.local_reads = local_reads_default() if local_reads is None else local_reads
        self.read_stats = ReadStats()
        self._shortcut = LocalReadClient(token, timeout_s=request_timeout_s) if self.local_reads else None
        self._local_view: tuple[int, dict[str, str]] = (-1, {})  # (routing version, node -> socket path)
        self._local_off: dict[str, float] = {}  # node -> monotonic time until which its socket is not tried

    def close(self) -> None:
        self._exec.shutdown(wait=False, cancel_futures=True)
        self.pool.close()
        if self._shortcut is not None:
            self._shortcut.close()

    def __enter__(self) -> StorageClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- routing --------------------------------------------------------------------------

    def refresh(self) -> None:
        new = self._routing_fn()
        if new.version >= self.routing.version:
            self.routing = new

    def chain(self, chain_id: int) -> Chain:
        for c in self.routing.chains:
            if c.chain_id == chain_id:
                return c
        raise NotServing(f"chain {chain_id} is not in routing v{self.routing.version}", chain=chain_id)

    def address(self, target_id: int) -> tuple[str, str]:
        """(node id, host:port) of a target."""
        t = next((t for t in self.routing.targets if t.target_id == target_id), None)
        n = next((n for n in self.routing.nodes if t is not None and n.node_id == t.node_id), None)
        # only a storage node a service registered gets our token (protocol.trusted_peer)
        addr = wire_address(n.tags) if n is not None and trusted_peer(n) else None
        if t is None or n is None or addr is None:
            raise NotServing(f"no data-plane address for target {target_id} (its node is not a storage node "
                             "registered by a service in routing)", target=target_id)
        return n.node_id, addr

    def _call(self, address: str, op: str, payload: Any = None, *, meta: dict[str, Any], into: Any = None) -> Reply:
        try:
            return self.pool.call(split_address(address), op, payload, meta=meta, into=into)
        except (Unavailable, DeadlineExceeded) as e:
            if not isinstance(e, StorageError):
                self._avoid[address] = time.monotonic() + self.avoid_s
            raise

    def _backoff(self, attempt: int, deadline: float, err: Exception) -> None:
        delay = min(0.02 * (2**attempt), 0.5) * (0.5 + self._rng.random() / 2)
        if time.monotonic() + delay > deadline:
            raise err
        time.sleep(delay)
        with contextlib.suppress(FireFlyerError):
            self.refresh()

    def caps_for(self, inodes: Iterable[int], mode: int) -> list[bytes]:
        """The encoded capabilities to send with a request touching ``inodes`` (renewed as needed)."""
        if self.capabilities is None:
            return []
        return self.capabilities.for_inodes(inodes, mode)

    def expired(self, err: BaseException | None, inode: int) -> bool:
        """Whether ``err`` is a storage node's "capability expired": then it is renewed on next use."""
        if isinstance(err, CapabilityDenied) and err.fields.get("reason") == "expired" and self.capabilities:
            self.capabilities.stale(inode)
            return True
        return False

    # -- writes ---------------------------------------------------------------------------

    def _channel(self) -> int:
        ch = getattr(self._local, "channel", None)
        if ch is None:
            ch = self._local.channel = next(self._channels)
            self._local.seq = 0
        return ch

    def write(self, chain_id: int, chunk_id: ChunkId, offset: int, data: Buffer, chunk_size: int) -> WriteAck:
        """Write ``data`` at ``offset`` of a chunk through the chain head; retried writes apply once."""
        channel = self._channel()
        self._local.seq += 1
        seq = self._local.seq
        crc = crc32c(data)
        deadline = time.monotonic() + self.retry_deadline_s
        for attempt in itertools.count():
            try:
                chain = self.chain(chain_id)
                if chain.head is None:
                    raise NotServing(f"chain {chain_id} has no serving target", chain=chain_id)
                req = WriteReq(chain_id=chain_id, chain_ver=chain.version, chunk_id=chunk_id, offset=offset,
                               length=len(data), chunk_size=chunk_size, payload_crc=crc, client_id=self.client_id,
                               channel=channel, seq=seq)
                _, addr = self.address(chain.head)
                caps = self.caps_for((chunk_id.inode,), WRITE)
                reply = self._call(addr, OP_WRITE, data if len(data) else None,
                                   meta=to_meta(WriteMsg(target=chain.head, req=req, caps=caps)))
                return msgspec.convert(reply.meta, WriteAck)
            except RETRY_AFTER_REFRESH as e:
                self._backoff(attempt, deadline, e)
            except CapabilityDenied as e:
                if not self.expired(e, chunk_id.inode) or attempt:
                    raise
        raise AssertionError("unreachable")

    def write_range(self, inode: int, offset: int, data: Buffer, chunk_size: int, *,
                    chain_of: Callable[[int], int], track: int = 0) -> list[WriteAck]:
        """Write a file byte range, chunk by chunk (chunk ``i`` on chain ``chain_of(i)``), in parallel."""
        view = memoryview(data)
        futs = [self._exec.submit(self.write, chain_of(idx), ChunkId(inode, track, idx), inner,
                                  view[at:at + n], chunk_size)
                for idx, inner, n, at in split_range(offset, len(view), chunk_size)]
        return [f.result() for f in futs]

    # -- reads ----------------------------------------------------------------------------

    def read(self, chain_id: int, chunk_id: ChunkId, offset: int = 0, length: int = -1,
             relaxed: bool = False) -> bytes:
        res = self.batch_read([ReadIo(chain_id=chain_id, chunk_id=chunk_id, offset=offset, length=length,
                                      relaxed=relaxed)])[0]
        if res.error is not None:
            raise res.error
        return res.data

    def read_range(self, inode: int, offset: int, length: int, chunk_size: int, *,
                   chain_of: Callable[[int], int], track: int = 0) -> bytes:
        pieces = list(split_range(offset, length, chunk_size))
        ios = [ReadIo(chain_id=chain_of(i), chunk_id=ChunkId(inode, track, i), offset=inner, length=n)
               for i, inner, n, _ in pieces]
        out = bytearray(length)  # zeros: a chunk shorter than asked reads as a hole
        view = memoryview(out)
        for r in self.batch_read(ios, into=[view[at:at + n] for _, _, n, at in pieces]):
            if r.error is not None:
                raise r.error
        return bytes(out)

    def batch_read(self, ios: Sequence[ReadIo], into: Sequence[memoryview] | None = None) -> list[ReadResult]:
        """Read many I/Os; each result holds data or the error that ended its retries.

        Every batch (per node, see :class:`~.protocol.BatchLimits`) runs in parallel on the
        client's threads, so a long list keeps many requests in flight (request-to-send still
        bounds the servers sending at once).  ``into``: one writable byte buffer per I/O, at least
        as long as the I/O; the payload is then received straight into it (no intermediate copy
        when the I/O is alone in its batch, as every chunk-sized piece is) and a result's ``data``
        is a view of its first bytes, shorter than the buffer at a chunk's end (the rest is left
        as it was).  Without ``into``, ``data`` is ``bytes``."""
        if into is not None and len(into) != len(ios):
            raise ValueError(f"batch_read: {len(into)} buffers for {len(ios)} I/Os")
        results: list[ReadResult | None] = [None] * len(ios)
        tried: list[set[int]] = [set() for _ in ios]
        todo = list(range(len(ios)))
        deadline = time.monotonic() + self.retry_deadline_s
        retryable = (*RETRY_AFTER_REFRESH, ChunkCorrupted)  # a corrupted replica: read another
        for attempt in itertools.count():
            retry: list[int] = []
            last: FireFlyerError | None = None
            for i in todo:
                results[i] = None
            batches = self._plan(ios, todo, tried, results)
            for i in todo:  # not planned: e.g. a chain newer than our routing (NotServing): refresh, retry
                r = results[i]
                if r is not None and r.target == 0 and isinstance(r.error, retryable):
                    retry.append(i)
                    last = r.error
            # the last batch runs in this thread (which would only wait otherwise): one thread
            # hand-off less per call, none at all for the common single-batch read
            futs = [self._exec.submit(self._run_batch, b, ios, into) for b in batches[:-1]]
            here = self._run_batch(batches[-1], ios, into) if batches else []
            for done in [*(f.result() for f in futs), here]:
                for i, res in done:
                    if not attempt and self.expired(res.error, ios[i].chunk_id.inode):
                        results[i], last = res, res.error  # renewed on the next try
                        retry.append(i)
                    elif res.error is not None and isinstance(res.error, retryable):
                        if not isinstance(res.error, NotCommitted):
                            tried[i].add(res.target)
                        results[i], last = res, res.error
                        retry.append(i)
                    else:
                        results[i] = res
            if not retry:
                break
            todo = retry
            try:
                self._backoff(attempt, deadline, last or Unavailable("read retries exhausted"))
            except FireFlyerError:
                break
        return [r or ReadResult(error=Unavailable("not read")) for r in results]

    def _plan(self, ios: Sequence[ReadIo], todo: list[int], tried: list[set[int]],
              results: list[ReadResult | None]) -> list[tuple[str, str, list[tuple[int, int]]]]:
        """Pick a replica per I/O, group by node, cut into batches: [(node, address, [(io, target)])]."""
        now = time.monotonic()
        by_node: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for i in todo:
            try:
                chain = self.chain(ios[i].chain_id)
                serving = list(chain.serving())
                fresh = [t for t in serving if t not in tried[i]] or serving  # all tried: start over
                good = [t for t in fresh if self._avoid.get(self.address(t)[1], 0) < now] or fresh
                if not good:
                    raise NotServing(f"chain {chain.chain_id} has no serving replica", chain=chain.chain_id)
                # a replica on this host is read through its node's Unix socket: prefer it
                local = [t for t in good if self._local_socket(self.address(t)[0]) is not None]
                target = self._rng.choice(local or good)
                node, addr = self.address(target)
            except FireFlyerError as e:
                results[i] = ReadResult(error=e)
                continue
            by_node.setdefault((node, addr), []).append((i, target))
        out = []
        for (node, addr), items in by_node.items():
            batch: list[tuple[int, int]] = []
            size = 0
            # a local batch's descriptors travel in one datagram: fewer I/Os per batch
            max_ios = self.limits.max_ios if self._local_socket(node) is None else min(self.limits.max_ios,
                                                                                      LOCAL_MAX_IOS)
            for i, t in items:
                n = ios[i].length if ios[i].length >= 0 else self.limits.max_bytes
                if batch and (len(batch) >= max_ios or size + n > self.limits.max_bytes):
                    out.append((node, addr, batch))
                    batch, size = [], 0
                batch.append((i, t))
                size += n
            out.append((node, addr, batch))
        return out

    # -- short-circuit local reads ------------------------------------------------------

    def _local_socket(self, node: str) -> str | None:
        """The Unix socket of ``node`` if it is a storage node on this host whose socket is
        not being avoided (and local reads are on), else None."""
        if self._shortcut is None:
            return None
        routing = self.routing
        ver, paths = self._local_view
        if ver != routing.version:
            paths = {n.node_id: p for n in routing.nodes
                     if trusted_peer(n) and (p := local_socket(n.tags)) is not None}
            self._local_view = (routing.version, paths)
        path = paths.get(node)
        if path is None or self._local_off.get(node, 0.0) > time.monotonic():
            return None
        return path

    def _read_msgs(self, items: list[tuple[int, int]], ios: Sequence[ReadIo]) -> list[ReadMsg]:
        msgs = []
        for i, t in items:
            io = ios[i]
            ver = self.chain(io.chain_id).version
            msgs.append(ReadMsg(target=t, req=ReadReq(chain_id=io.chain_id, chain_ver=ver, chunk_id=io.chunk_id,
                                                      offset=io.offset, length=io.length, relaxed=io.relaxed)))
        return msgs

    def _run_batch(self, batch: tuple[str, str, list[tuple[int, int]]], ios: Sequence[ReadIo],
                   into: Sequence[memoryview] | None) -> list[tuple[int, ReadResult]]:
        path = self._local_socket(batch[0])
        if path is not None:
            return self._local_batch(path, batch, ios, into)
        return self._one_batch(batch, ios, into)

    def _local_batch(self, path: str, batch: tuple[str, str, list[tuple[int, int]]], ios: Sequence[ReadIo],
                     into: Sequence[memoryview] | None) -> list[tuple[int, ReadResult]]:
        """One batch through the node's Unix socket: descriptors, then ``preadv`` into the
        buffers.  A transport failure runs the batch over the network instead (once)."""
        assert self._shortcut is not None
        node, addr, items = batch
        try:
            msgs = self._read_msgs(items, ios)
            caps = self.caps_for((ios[i].chunk_id.inode for i, _ in items), READ)
        except FireFlyerError as e:
            return [(i, ReadResult(error=e, target=t)) for i, t in items]
        try:
            reply, fds = self._shortcut.open(path, msgs, caps)
        except LocalPathBroken as e:
            if e.fields.get("connect"):  # no server there (stopped, not yet up): network for a while
                self._local_off[node] = time.monotonic() + self.avoid_s
            log.info("storage.local_read_fallback", node=node, path=path, reason=str(e))
            self.read_stats.add(local_fallbacks=1)
            return self._one_batch(batch, ios, into)
        except DeadlineExceeded as e:  # the node is slow or stopped, not the path: as a network timeout
            self._avoid[addr] = time.monotonic() + self.avoid_s
            return [(i, ReadResult(error=e, target=t)) for i, t in items]
        try:
            if reply.error is not None or len(reply.results) != len(items):
                err = (error_from_dict(reply.error) if reply.error is not None else
                       Unavailable(f"local read socket {path}: {len(reply.results)} results for {len(items)} I/Os"))
                return [(i, ReadResult(error=err, target=t)) for i, t in items]
            out = []
            nbytes = 0
            with self.limiter.token(node):  # as many nodes' chunks copied at once as would be sent
                for (i, t), r in zip(items, reply.results, strict=True):
                    res = self._local_result(r, t, fds, None if into is None else into[i])
                    if isinstance(res.error, ChunkCorrupted) and r.error is None:
                        self._report_corrupt(addr, t, ios[i].chunk_id, r.version, caps)
                    nbytes += len(res.data)
                    out.append((i, res))
            self.read_stats.add(local_ios=len(items), local_bytes=nbytes)
            return out
        finally:
            for fd in fds:
                os.close(fd)

    @staticmethod
    def _local_result(r: LocalIo, target: int, fds: list[int], dest: memoryview | None) -> ReadResult:
        """Read one I/O's bytes from its descriptor; a whole version is checked against its
        recorded CRC32C (as the network path checks what the server sent)."""
        if r.error is not None:
            return ReadResult(error=error_from_dict(r.error), target=target)
        n = r.length
        if dest is not None and n > len(dest):
            return ReadResult(error=BadRequest(f"target {target} has {n} bytes for a {len(dest)}-byte buffer",
                                               target=target, length=n, buffer=len(dest)), target=target)
        view = memoryview(b"")
        got = 0
        if n:
            fd = fds[r.fd] if r.fd >= 0 else -1
            try:
                if dest is None:
                    view = memoryview(os.pread(fd, n, r.offset))  # one copy, into a new bytes
                    got = len(view)
                else:
                    view = dest[:n]
                    while got < n:  # straight into the caller's buffer
                        k = os.preadv(fd, [view[got:]], r.offset + got)
                        if k <= 0:
                            break
                        got += k
            except OSError as e:
                return ReadResult(error=Unavailable(f"local read of target {target}: {e}", target=target),
                                  target=target)
        err: FireFlyerError | None = None
        if got < n:
            err = ChunkCorrupted(f"chunk file of target {target} ends {n - got} bytes early (truncated on disk); "
                                 "reading another replica", target=target, version=r.version)
        elif r.whole and crc32c(view) != r.crc:
            err = ChunkCorrupted(f"read data from target {target} fails its CRC32C (corrupted on disk); "
                                 "reading another replica", target=target, version=r.version)
        if err is not None:
            return ReadResult(error=err, target=target)
        data: Buffer = view if dest is not None else view.obj  # type: ignore[assignment]
        return ReadResult(data=data, version=r.version, target=target, uncommitted=r.uncommitted)

    # -- network reads ----------------------------------------------------------------------

    def _one_batch(self, batch: tuple[str, str, list[tuple[int, int]]], ios: Sequence[ReadIo],
                   into: Sequence[memoryview] | None) -> list[tuple[int, ReadResult]]:
        out = self._net_batch(batch, ios, into)
        self.read_stats.add(network_ios=len(batch[2]), network_bytes=sum(len(r.data) for _, r in out))
        return out

    def _net_batch(self, batch: tuple[str, str, list[tuple[int, int]]], ios: Sequence[ReadIo],
                   into: Sequence[memoryview] | None) -> list[tuple[int, ReadResult]]:
        node, addr, items = batch
        try:
            msgs = self._read_msgs(items, ios)
            caps = self.caps_for((ios[i].chunk_id.inode for i, _ in items), READ)
        except FireFlyerError as e:
            return [(i, ReadResult(error=e, target=t)) for i, t in items]
        if into is not None and len(items) == 1:
            return self._one_read(node, addr, items[0], msgs, caps, into[items[0][0]])
        try:
            ready = msgspec.convert(
                self._call(addr, OP_BATCH_READ, meta=to_meta(BatchReadMsg(ios=msgs, caps=caps))).meta, BatchReadReady)
            lengths = [r.length if r.error is None else 0 for r in ready.results]
            # the payload lands in the caller's buffers: one I/O straight into its buffer, several
            # scattered over theirs (the server sends them back to back); a scratch buffer only
            # when a reply claims more bytes than an I/O's buffer holds
            direct = (into is not None and len(lengths) == len(items)
                      and all(n <= len(into[i]) for (i, _), n in zip(items, lengths, strict=True)))
            datas: list[memoryview] = [memoryview(b"")] * len(items)
            if ready.xfer:
                with self.limiter.token(node):  # request-to-send: the server sends only now
                    grant = to_meta(RtsGrant(xfer=ready.xfer))
                    if direct:
                        assert into is not None
                        datas = [into[i][:n] for (i, _), n in zip(items, lengths, strict=True)]
                        self._call(addr, OP_RTS_GRANT, meta=grant, into=datas)
                    else:
                        buf = memoryview(bytearray(ready.total))
                        self._call(addr, OP_RTS_GRANT, meta=grant, into=buf)
                        off = 0
                        for k, r in enumerate(ready.results):
                            datas[k] = buf[off:off + r.length]
                            off += r.length
        except FireFlyerError as e:
            return [(i, ReadResult(error=e, target=t)) for i, t in items]
        out = []
        for k, ((i, t), r) in enumerate(zip(items, ready.results, strict=True)):
            dest = None if into is None else into[i]
            res = self._result(r, t, datas[k], dest, direct)
            if isinstance(res.error, ChunkCorrupted) and r.error is None:
                self._report_corrupt(addr, t, ios[i].chunk_id, r.version, caps)
            out.append((i, res))
        return out

    def _one_read(self, node: str, addr: str, item: tuple[int, int], msgs: list[ReadMsg], caps: list[bytes],
                  dest: memoryview) -> list[tuple[int, ReadResult]]:
        """A batch of one I/O into its buffer: the send token is taken first and goes with the
        request (``send=True``), so the data comes with the statuses: one round trip, not two."""
        i, t = item
        try:
            with self.limiter.token(node):
                reply = self._call(addr, OP_BATCH_READ, meta=to_meta(BatchReadMsg(ios=msgs, send=True, caps=caps)),
                                   into=[dest])
                ready = msgspec.convert(reply.meta, BatchReadReady)
                if ready.xfer:  # a server from before ``send``: it held the data; grant as always
                    reply = self._call(addr, OP_RTS_GRANT, meta=to_meta(RtsGrant(xfer=ready.xfer)), into=[dest])
        except FireFlyerError as e:
            return [(i, ReadResult(error=e, target=t))]
        [r] = ready.results
        res = self._result(r, t, reply.parts[0], dest, True)
        if isinstance(res.error, ChunkCorrupted) and r.error is None:
            self._report_corrupt(addr, t, msgs[0].req.chunk_id, r.version, caps)
        return [(i, res)]

    def _report_corrupt(self, address: str, target: int, chunk_id: ChunkId, version: int,
                        caps: list[bytes]) -> None:
        """Tell the replica its bytes failed their CRC here (it verifies the chunk before acting):
        whole-chunk reads are sent from disk unhashed, so the reader is who finds a bad copy."""
        with contextlib.suppress(FireFlyerError):
            self._call(address, OP_REPORT_CORRUPT,
                       meta=to_meta(CorruptReport(target=target, chunk_id=chunk_id, version=version, caps=caps)))

    @staticmethod
    def _result(r: IoResult, target: int, data: memoryview, dest: memoryview | None, landed: bool) -> ReadResult:
        """Check one I/O's bytes against the CRC the server sent (recorded with the chunk for a
        whole-chunk read, else computed over the range: corruption on disk or in transit) and
        hand them over: as ``bytes``, or in ``dest`` (already there when ``landed``)."""
        err = error_of(r)
        if err is None and crc32c(data) != r.crc:
            err = ChunkCorrupted(f"read data from target {target} fails its CRC32C (corrupted on disk or in "
                                 "transit); reading another replica", target=target, version=r.version)
        if err is None and dest is not None and len(data) > len(dest):
            err = BadRequest(f"target {target} returned {len(data)} bytes for a {len(dest)}-byte buffer",
                             target=target, length=len(data), buffer=len(dest))
        if err is not None:
            return ReadResult(error=err, target=target)
        if dest is None:
            got: Buffer = bytes(data)
        elif landed:
            got = data
        else:
            dest[:len(data)] = data
            got = dest[:len(data)]
        return ReadResult(data=got, version=r.version, target=target, uncommitted=r.uncommitted)


class MgmtdRouting:
    """Routing info for synchronous code: an :class:`~fireflyer.mgmt.client.MgmtdClient` on a
    private event-loop thread; :meth:`get` pulls the newest version (cheap when unchanged)."""

    def __init__(self, addresses: str | Sequence[str], *, token: str, timeout_s: float = 5.0) -> None:
        from fireflyer.mgmt.client import MgmtdClient

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mgmtd-routing", daemon=True)
        self._thread.start()
        self.timeout_s = timeout_s
        self._client = MgmtdClient(addresses, token=token, call_timeout_s=timeout_s)
        self._routing: RoutingInfo | None = None
        self._lock = threading.Lock()

    def get(self) -> RoutingInfo:
        with self._lock:
            known = self._routing.version if self._routing is not None else 0
            fut = asyncio.run_coroutine_threadsafe(self._client.get_routing(known), self._loop)
            new = fut.result(self.timeout_s * 2)
            if new is not None:
                self._routing = new
            assert self._routing is not None
            return self._routing

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(self.timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.timeout_s)
