"""The storage node's data-plane handler: every ``stor.*`` op of :mod:`fireflyer.storage.protocol`.

Runs in the :class:`~fireflyer.wire.WireServer` connection threads (DESIGN.md §1: the hot
path is threads and blocking sockets, never the event loop).  CRAQ itself is
:class:`~fireflyer.storage.craq.Replica`; this module validates input before anything is
touched (sizes, offsets, batch limits, roles), routes each I/O to its local target, holds
batch-read data until the client's request-to-send grant, and reports corrupted chunks.

Batch reads are prepared with :func:`~fireflyer.storage.chunkread.read_for_send`: a whole-chunk
read holds the open version file and is sent with ``sendfile`` under the CRC recorded at write
time, so this node neither copies it into memory nor hashes it; the client checks the bytes and
reports a mismatch (``stor.report_corrupt``), which this node confirms by verifying the chunk
before it marks it corrupted (a report alone, e.g. of bytes damaged in flight, changes nothing).
The single ``stor.read`` keeps the plain path: read, hash, compare with the record here.

:meth:`DataPlane.open_local` answers short-circuit local reads (:mod:`.localserver`): the
same authorization and per-I/O checks as ``stor.batch_read``, but the open version files
go to the client as descriptors and it reads and checks the bytes itself.
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import msgspec

from fireflyer.core.errors import FireFlyerError, Internal, NotFound, PermissionDenied, ResourceExhausted
from fireflyer.core.log import get_logger
from fireflyer.mgmt.model import Chain, PublicState
from fireflyer.storage import (
    BadRequest,
    ChainVersionMismatch,
    ChunkCorrupted,
    ChunkId,
    ChunkNotFound,
    NotServing,
    ReadReply,
    crc32c,
    successor_of,
)
from fireflyer.storage.capability import READ, WRITE, Keyring, exempt, verify_all
from fireflyer.storage.chunkread import ChunkRead, read_for_send
from fireflyer.storage.craq import WRITE_STATES
from fireflyer.storage.localread import LocalIo, LocalReadReply
from fireflyer.storage.protocol import (
    CLIENT_OPS,
    OP_BATCH_READ,
    OP_BATCH_WRITE,
    OP_DUMP_META,
    OP_QUERY_LAST,
    OP_READ,
    OP_REMOVE_RANGE,
    OP_REPORT_CORRUPT,
    OP_RTS_CANCEL,
    OP_RTS_GRANT,
    OP_SPACE,
    OP_SYNC_DONE,
    OP_SYNC_REMOVE,
    OP_SYNC_REPLACE,
    OP_UPDATE,
    OP_WRITE,
    BatchLimits,
    BatchReadMsg,
    BatchReadReady,
    BatchWriteMsg,
    BatchWriteReply,
    CorruptReport,
    IoResult,
    LastChunk,
    QueryLastMsg,
    ReadMsg,
    RemoveRangeMsg,
    RtsGrant,
    SpaceReply,
    SyncDoneMsg,
    SyncRemoveMsg,
    SyncReplaceMsg,
    TargetMsg,
    TargetSpace,
    UpdateMsg,
    WriteMsg,
    from_meta,
    to_meta,
)
from fireflyer.wire import ServerRequest

from .forwarder import Forwarder
from .metrics import WRITE_OPS, StorageMetrics
from .node import StorageNode, TargetRuntime

__all__ = ["DataPlane", "HeldTransfers"]

log = get_logger(__name__)

OnCorrupt = Callable[[TargetRuntime, ChunkId, ChunkCorrupted], None]


class Transfer:
    """The prepared reads of one batch, sent back to back as one payload; holds open files."""

    __slots__ = ("reads",)

    def __init__(self, reads: list[ChunkRead]) -> None:
        self.reads = reads

    def __len__(self) -> int:
        return sum(r.length for r in self.reads)

    def parts(self) -> list[object]:
        return [r.part() for r in self.reads]

    def close(self) -> None:
        for r in self.reads:
            r.close()


class HeldTransfers:
    """Batch-read data waiting for its ``stor.rts_grant``: bounded in bytes, expiring (an
    expired or cancelled :class:`Transfer` is closed: its files are not held open either)."""

    def __init__(self, *, hold_s: float, max_bytes: int) -> None:
        self.hold_s = hold_s
        self.max_bytes = max_bytes
        self._ids = itertools.count(1)
        self._held: dict[int, tuple[float, str, Transfer]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.inflight = 0
        self.max_inflight = 0
        self.served = 0

    def put(self, owner: str, data: Transfer) -> int:
        now = time.monotonic()
        expired = []
        with self._lock:
            for xid in [x for x, (exp, _, _) in self._held.items() if exp < now]:
                expired.append(self._held.pop(xid)[2])
                self._bytes -= len(expired[-1])
        for t in expired:
            t.close()
        with self._lock:
            if self._bytes + len(data) > self.max_bytes:
                raise ResourceExhausted(f"storage node holds {self._bytes} bytes of read data awaiting grants "
                                        f"(limit {self.max_bytes}); retry after a back-off",
                                        held=self._bytes, limit=self.max_bytes)
            xid = next(self._ids)
            self._held[xid] = (now + self.hold_s, owner, data)
            self._bytes += len(data)
            return xid

    def take(self, xfer: int, owner: str) -> Transfer:
        with self._lock:
            entry = self._held.get(xfer)
            if entry is None or entry[1] != owner:
                raise NotFound(f"no read transfer {xfer} held for {owner} (expired after {self.hold_s}s, "
                               "or already sent); read again", xfer=xfer)
            del self._held[xfer]
            self._bytes -= len(entry[2])
            return entry[2]

    def grant_started(self) -> None:
        with self._lock:
            self.inflight += 1
            self.served += 1
            self.max_inflight = max(self.max_inflight, self.inflight)

    def grant_finished(self) -> None:
        with self._lock:
            self.inflight -= 1


def _user(req: ServerRequest) -> str:
    p = req.principal
    return str(getattr(p, "user", p))


def _result_of(err: FireFlyerError) -> IoResult:
    return IoResult(error=err.to_dict())


class DataPlane:
    """The :data:`~fireflyer.wire.Handler` of a storage node."""

    def __init__(self, node: StorageNode, forwarder: Forwarder, *, limits: BatchLimits, max_chunk_size: int,
                 held: HeldTransfers, workers: int, on_corrupt: OnCorrupt, keys: Keyring,
                 clock: Callable[[], float] = time.time, metrics: StorageMetrics | None = None) -> None:
        self.node = node
        #: bytes in and out (Prometheus); None: not counted
        self.metrics = metrics
        #: the key shared with meta: checks the capabilities of client chunk ops (:meth:`permit`)
        self.keys = keys
        self.clock = clock
        self.forwarder = forwarder
        self.limits = limits
        self.max_chunk_size = max_chunk_size
        self.held = held
        self.on_corrupt = on_corrupt
        #: short-circuit local read batches answered (descriptors handed out)
        self.local_served = 0
        self._local_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="storage-io")
        self._ops: dict[str, Callable[[ServerRequest], None]] = {
            OP_WRITE: self._write, OP_BATCH_WRITE: self._batch_write, OP_UPDATE: self._update,
            OP_READ: self._read, OP_BATCH_READ: self._batch_read, OP_RTS_GRANT: self._rts_grant,
            OP_RTS_CANCEL: self._rts_cancel, OP_QUERY_LAST: self._query_last, OP_REMOVE_RANGE: self._remove_range,
            OP_DUMP_META: self._dump_meta, OP_SYNC_REPLACE: self._sync_replace, OP_SYNC_REMOVE: self._sync_remove,
            OP_SYNC_DONE: self._sync_done, OP_SPACE: self._space, OP_REPORT_CORRUPT: self._report_corrupt,
        }  # fmt: skip

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __call__(self, req: ServerRequest) -> None:
        fn = self._ops.get(req.op)
        if fn is None:
            raise BadRequest(f"unknown storage op {req.op!r}", op=req.op)
        self.authorize(req.op, req.principal)
        fn(req)
        if self.metrics is not None and req.op in WRITE_OPS:
            self.metrics.wrote(req.op, req.size)

    @staticmethod
    def authorize(op: str, principal: object) -> None:
        """Whether an authenticated ``principal`` may run ``op`` (wire requests and local reads alike).

        The ops that are not client ops (CRAQ ``update`` forwarding, resync's ``dump_meta`` /
        ``sync_*``, ``remove_range``) are the cluster's own traffic: they need the ``service``
        role.  Admins are refused too: no operator tool sends them, and an operator's token has
        no business changing a replica behind the chain's back."""
        if op not in CLIENT_OPS:
            has_role = getattr(principal, "has_role", None)
            if has_role is not None and not has_role("service"):
                user = str(getattr(principal, "user", principal))
                raise PermissionDenied(f"{op} is for the cluster's services (role service), not user {user}: "
                                       "storage nodes and meta send it with their service credential",
                                       op=op, user=user)

    def permit(self, principal: object, caps: list[bytes], wants: list[tuple[ChunkId, int]]) -> None:
        """The one place storage decides whether a chunk op may touch user data: every
        ``(chunk, READ|WRITE)`` of the request must be covered by a capability meta granted to
        this principal's user (:func:`~fireflyer.storage.capability.verify_all`), else the whole
        request is refused (``CapabilityDenied``, EACCES).  Role ``service`` (meta's cleaner,
        forwarding, resync) is exempt; admins are not (meta grants them capabilities)."""
        if exempt(principal):
            return
        verify_all(self.keys, caps, user=str(getattr(principal, "user", principal)), wants=wants, now=self.clock())

    # -- validation -------------------------------------------------------------------

    def _check_write(self, offset: int, length: int, chunk_size: int, cid: ChunkId) -> None:
        if not 0 < chunk_size <= self.max_chunk_size or offset < 0 or length < 0 or offset + length > chunk_size:
            raise BadRequest(
                f"write [{offset}, {offset}+{length}) of chunk {cid} with chunk size {chunk_size} is out of "
                f"bounds (0 <= offset, 0 <= length, offset+length <= chunk_size <= {self.max_chunk_size})",
                chunk=cid.hex, offset=offset, length=length, chunk_size=chunk_size,
            )  # fmt: skip

    def _check_read(self, offset: int, length: int, cid: ChunkId) -> None:
        if offset < 0 or length < -1 or offset > self.max_chunk_size or length > self.max_chunk_size:
            raise BadRequest(f"read offset {offset} length {length} of chunk {cid} is out of bounds "
                             f"(0 <= offset, -1 <= length, both <= {self.max_chunk_size})",
                             chunk=cid.hex, offset=offset, length=length)

    def _chain_at(self, rt: TargetRuntime, chain_id: int, chain_ver: int, allowed: tuple[PublicState, ...]) -> Chain:
        chain = self.node.chain(chain_id)
        if chain.version != chain_ver:
            raise ChainVersionMismatch(
                f"chain {chain_id} is at v{chain.version} on target {rt.target_id}, request has v{chain_ver}",
                chain=chain_id, target=rt.target_id, expected=chain.version, got=chain_ver,
            )  # fmt: skip
        state = chain.state_of(rt.target_id) if rt.target_id in chain.target_ids else None
        if state not in allowed:
            raise NotServing(f"target {rt.target_id} is {state or 'not a member'} in chain {chain_id} v{chain_ver}",
                             chain=chain_id, target=rt.target_id, state=str(state))
        return chain

    # -- writes -----------------------------------------------------------------------

    def _write_one(self, msg: WriteMsg, payload: memoryview) -> IoResult:
        w = msg.req
        self._check_write(w.offset, w.length, w.chunk_size, w.chunk_id)
        ack = self.node.target(msg.target).replica.handle_write(w, payload)
        return IoResult(length=ack.length, version=ack.commit_ver, crc=ack.crc, target=ack.target_id,
                        duplicate=ack.duplicate)

    def _write(self, req: ServerRequest) -> None:
        msg = from_meta(req.meta, WriteMsg)
        w = msg.req
        self.permit(req.principal, msg.caps, [(w.chunk_id, WRITE)])
        self._check_write(w.offset, w.length, w.chunk_size, w.chunk_id)
        if req.size != w.length:
            raise BadRequest(f"write payload has {req.size} bytes, header says {w.length}", length=w.length)
        rt = self.node.target(msg.target)
        ack = rt.replica.handle_write(w, req.recv_payload())
        req.reply(meta=msgspec.to_builtins(ack))

    def _batch_write(self, req: ServerRequest) -> None:
        msg = from_meta(req.meta, BatchWriteMsg)
        total = sum(max(0, m.req.length) for m in msg.ios)
        self.limits.check(len(msg.ios), req.size, "write")
        self.permit(req.principal, msg.caps, [(m.req.chunk_id, WRITE) for m in msg.ios])
        if total != req.size:
            raise BadRequest(f"batch write payload has {req.size} bytes, headers say {total}", bytes=req.size)
        for m in msg.ios:
            self._check_write(m.req.offset, m.req.length, m.req.chunk_size, m.req.chunk_id)
        data = req.recv_payload()
        views, off = [], 0
        for m in msg.ios:
            views.append(data[off : off + m.req.length])
            off += m.req.length
        # writes of one chunk keep their batch order; different chunks go in parallel
        groups: dict[ChunkId, list[int]] = {}
        for i, m in enumerate(msg.ios):
            groups.setdefault(m.req.chunk_id, []).append(i)
        results: list[IoResult | None] = [None] * len(msg.ios)

        def run(idx: list[int]) -> None:
            for i in idx:
                try:
                    results[i] = self._write_one(msg.ios[i], views[i])
                except FireFlyerError as e:
                    results[i] = _result_of(e)

        for f in [self._pool.submit(run, idx) for idx in groups.values()]:
            f.result()
        req.reply(meta=to_meta(BatchWriteReply(results=[r or _result_of(Internal("lost")) for r in results])))

    def _update(self, req: ServerRequest) -> None:
        msg = from_meta(req.meta, UpdateMsg)
        u = msg.req
        self._check_write(u.offset, u.length, u.chunk_size, u.chunk_id)
        if req.size != u.length:
            raise BadRequest(f"update payload has {req.size} bytes, header says {u.length}", length=u.length)
        ack = self.node.target(msg.target).replica.handle_update(u, req.recv_payload())
        req.reply(meta=msgspec.to_builtins(ack))

    # -- reads ------------------------------------------------------------------------

    def _read_one(self, msg: ReadMsg) -> tuple[ReadReply, bytes]:
        r = msg.req
        self._check_read(r.offset, r.length, r.chunk_id)
        rt = self.node.target(msg.target)
        try:
            if r.chunk_id in rt.corrupted:
                raise ChunkCorrupted(f"chunk {r.chunk_id} on target {rt.target_id} is known corrupted; "
                                     "read another replica", chunk=r.chunk_id.hex, target=rt.target_id)
            reply, data = rt.replica.handle_read(r)
            if not reply.uncommitted and r.offset == 0:
                # a whole-chunk read checks the recorded CRC for free (we computed the data's CRC anyway)
                meta = rt.store.meta(r.chunk_id)
                if (meta is not None and meta.committed_ver == reply.version and meta.length == reply.length
                        and meta.crc != reply.crc):
                    raise ChunkCorrupted(
                        f"chunk {r.chunk_id} v{reply.version} on target {rt.target_id}: CRC32C {reply.crc:#010x}, "
                        f"recorded {meta.crc:#010x}", chunk=r.chunk_id.hex, target=rt.target_id,
                        version=reply.version, expected=meta.crc, got=reply.crc,
                    )  # fmt: skip
        except ChunkCorrupted as e:
            self.on_corrupt(rt, r.chunk_id, e)
            raise
        return reply, data

    def _read(self, req: ServerRequest) -> None:
        msg = from_meta(req.meta, ReadMsg)
        self.permit(req.principal, msg.caps, [(msg.req.chunk_id, READ)])
        reply, data = self._read_one(msg)
        req.reply(data, meta=msgspec.to_builtins(reply))
        if self.metrics is not None:
            self.metrics.read(OP_READ, len(data))

    def _prepare_one(self, msg: ReadMsg) -> tuple[IoResult, ChunkRead | None]:
        r = msg.req
        try:
            self._check_read(r.offset, r.length, r.chunk_id)
            rt = self.node.target(msg.target)
            rt.replica.check_read(r)
            try:
                if r.chunk_id in rt.corrupted:
                    raise ChunkCorrupted(f"chunk {r.chunk_id} on target {rt.target_id} is known corrupted; "
                                         "read another replica", chunk=r.chunk_id.hex, target=rt.target_id)
                got = read_for_send(rt.store, r.chunk_id, r.offset, r.length, allow_uncommitted=r.relaxed)
            except ChunkCorrupted as e:
                self.on_corrupt(rt, r.chunk_id, e)
                raise
        except FireFlyerError as e:
            return _result_of(e), None
        return IoResult(length=got.length, version=got.version, crc=got.crc, target=rt.target_id,
                        uncommitted=got.uncommitted), got

    def _batch_read(self, req: ServerRequest) -> None:
        msg = from_meta(req.meta, BatchReadMsg)
        self.limits.check(len(msg.ios), 0, "read")
        self.permit(req.principal, msg.caps, [(m.req.chunk_id, READ) for m in msg.ios])
        # partial (and small) reads go to disk here: in parallel when several
        if len(msg.ios) > 1:
            done = list(self._pool.map(self._prepare_one, msg.ios))
        else:
            done = [self._prepare_one(m) for m in msg.ios]
        transfer = Transfer([got for _, got in done if got is not None and got.length])
        for _, got in done:
            if got is not None and not got.length:
                got.close()
        try:
            total = len(transfer)
            # a lone I/O may be a whole chunk larger than the batch limit (bounded by the chunk size)
            if total > self.limits.max_bytes and len(msg.ios) > 1:
                raise BadRequest(f"batch read would return {total} bytes (limit {self.limits.max_bytes}); split it",
                                 bytes=total, max_bytes=self.limits.max_bytes)
            xfer = self.held.put(_user(req), transfer) if total and not msg.send else 0
        except BaseException:
            transfer.close()
            raise
        meta = to_meta(BatchReadReady(xfer=xfer, total=total, results=[r for r, _ in done]))
        if xfer or not total:
            req.reply(meta=meta)
            return
        # the client sent its grant with the request (it holds the send token): data goes now
        self.held.grant_started()
        try:
            req.reply(transfer.parts(), meta=meta)
        finally:
            self.held.grant_finished()
            transfer.close()
        if self.metrics is not None:
            self.metrics.read(OP_BATCH_READ, total)

    def open_local(self, principal: object, msgs: list[ReadMsg],
                   caps: list[bytes]) -> tuple[LocalReadReply, list[BinaryIO]]:
        """A short-circuit local read (:mod:`fireflyer.storage.localread`): authorized as a
        ``stor.batch_read`` (capabilities included) and checked per I/O exactly as one, but
        answered with the open version files (whose descriptors go to the client) instead of
        their bytes."""
        self.authorize(OP_BATCH_READ, principal)
        self.limits.check(len(msgs), 0, "read")
        self.permit(principal, caps, [(m.req.chunk_id, READ) for m in msgs])
        files: list[BinaryIO] = []
        by_chunk: dict[tuple[int, ChunkId, bool], tuple[int, int, int, int, bool]] = {}
        results: list[LocalIo] = []
        try:
            for m in msgs:
                try:
                    results.append(self._open_one(m, files, by_chunk))
                except FireFlyerError as e:
                    results.append(LocalIo(error=e.to_dict()))
        except BaseException:
            for f in files:
                f.close()
            raise
        with self._local_lock:
            self.local_served += 1
        if self.metrics is not None:
            self.metrics.read("local", sum(r.length for r in results if r.fd >= 0))
        return LocalReadReply(results=results), files

    def _open_one(self, msg: ReadMsg, files: list[BinaryIO],
                  by_chunk: dict[tuple[int, ChunkId, bool], tuple[int, int, int, int, bool]]) -> LocalIo:
        r = msg.req
        self._check_read(r.offset, r.length, r.chunk_id)
        rt = self.node.target(msg.target)
        rt.replica.check_read(r)
        key = (rt.target_id, r.chunk_id, r.relaxed)
        got = by_chunk.get(key)
        if got is None:
            try:
                if r.chunk_id in rt.corrupted:
                    raise ChunkCorrupted(f"chunk {r.chunk_id} on target {rt.target_id} is known corrupted; "
                                         "read another replica", chunk=r.chunk_id.hex, target=rt.target_id)
                f, ver, size, crc, pending = rt.store.open_version(r.chunk_id, allow_uncommitted=r.relaxed)
                try:
                    on_disk = os.fstat(f.fileno()).st_size
                    if on_disk != size:
                        raise rt.store.corrupted(r.chunk_id, ver, crc, 0, on_disk, size)
                except BaseException:
                    f.close()
                    raise
            except ChunkCorrupted as e:
                self.on_corrupt(rt, r.chunk_id, e)
                raise
            files.append(f)
            got = by_chunk[key] = (len(files) - 1, ver, size, crc, pending)
        fd, ver, size, crc, pending = got
        n = max(0, size - r.offset) if r.length < 0 else max(0, min(r.length, size - r.offset))
        whole = r.offset == 0 and n == size
        return LocalIo(fd=fd if n else -1, offset=r.offset, length=n, version=ver, crc=crc if whole else 0,
                       whole=whole, target=rt.target_id, uncommitted=pending)

    def _rts_grant(self, req: ServerRequest) -> None:
        transfer = self.held.take(from_meta(req.meta, RtsGrant).xfer, _user(req))
        sent = len(transfer)
        self.held.grant_started()
        try:
            # every I/O's bytes back to back, files by sendfile: no join, no copy into memory
            req.reply(transfer.parts())
        finally:
            self.held.grant_finished()
            transfer.close()
        if self.metrics is not None:
            self.metrics.read(OP_BATCH_READ, sent)

    def _rts_cancel(self, req: ServerRequest) -> None:
        try:
            self.held.take(from_meta(req.meta, RtsGrant).xfer, _user(req)).close()
        except NotFound:
            pass

    def _report_corrupt(self, req: ServerRequest) -> None:
        """A client's bytes failed their CRC: verify the chunk here; only a confirmed bad copy
        is marked corrupted and reported (bytes damaged in flight leave a good copy alone)."""
        msg = from_meta(req.meta, CorruptReport)
        self.permit(req.principal, msg.caps, [(msg.chunk_id, READ)])
        rt = self.node.target(msg.target)
        if msg.chunk_id in rt.corrupted:
            req.reply(meta={"corrupted": True})
            return
        try:
            rt.store.verify(msg.chunk_id)
        except ChunkNotFound:
            req.reply(meta={"corrupted": False})
            return
        except ChunkCorrupted as e:
            self.on_corrupt(rt, msg.chunk_id, e)
            req.reply(meta={"corrupted": True})
            return
        log.warning("storage.corrupt_report_unconfirmed", target=rt.target_id, chunk=str(msg.chunk_id),
                    peer=req.peer, version=msg.version)
        req.reply(meta={"corrupted": False})

    # -- maintenance --------------------------------------------------------------------

    def _query_last(self, req: ServerRequest) -> None:
        msg = from_meta(req.meta, QueryLastMsg)
        # the file's last chunk is its length: reading it needs read access to the file
        self.permit(req.principal, msg.caps, [(ChunkId(msg.inode, 0, 0), READ)])
        rt = self.node.target(msg.target)
        self._chain_at(rt, msg.chain_id, msg.chain_ver, (PublicState.SERVING,))
        got = rt.store.query_last_chunk(msg.inode, msg.track)
        out = LastChunk() if got is None else LastChunk(chunk_id=got[0], length=got[1])
        req.reply(meta=to_meta(out))

    def _remove_range(self, req: ServerRequest) -> None:
        """Remove locally, then down the chain (idempotent: a retry removes nothing twice)."""
        msg = from_meta(req.meta, RemoveRangeMsg)
        if not msg.begin < msg.end:
            raise BadRequest(f"empty or reversed chunk range [{msg.begin}, {msg.end})")
        rt = self.node.target(msg.target)
        chain = self._chain_at(rt, msg.chain_id, msg.chain_ver, WRITE_STATES)
        removed = rt.store.remove_range(msg.begin, msg.end)
        succ = successor_of(chain, rt.target_id)
        if succ is not None:
            fwd = msgspec.structs.replace(msg, target=succ)
            self.forwarder.call(succ, OP_REMOVE_RANGE, meta=to_meta(fwd))
        req.reply(meta={"removed": removed})

    def _syncing(self, msg: TargetMsg | SyncReplaceMsg | SyncRemoveMsg | SyncDoneMsg) -> TargetRuntime:
        rt = self.node.target(msg.target)
        self._chain_at(rt, msg.chain_id, msg.chain_ver, (PublicState.SYNCING,))
        return rt

    def _dump_meta(self, req: ServerRequest) -> None:
        rt = self._syncing(from_meta(req.meta, TargetMsg))
        metas = list(rt.store.all_meta())
        req.reply(msgspec.msgpack.encode(metas), meta={"count": len(metas)})

    def _sync_replace(self, req: ServerRequest) -> None:
        msg = from_meta(req.meta, SyncReplaceMsg)
        if req.size > self.max_chunk_size or msg.version < 1:
            raise BadRequest(f"sync replace of {req.size} bytes v{msg.version}", size=req.size)
        rt = self._syncing(msg)
        data = req.recv_payload()
        if crc32c(data) != msg.crc:
            raise BadRequest(f"sync replace payload of chunk {msg.chunk_id} fails its CRC32C", chunk=msg.chunk_id.hex)
        with rt.store.lock(msg.chunk_id):
            rt.store.replace_full(msg.chunk_id, data, version=msg.version, chain_ver=msg.chunk_chain_ver)

    def _sync_remove(self, req: ServerRequest) -> None:
        msg = from_meta(req.meta, SyncRemoveMsg)
        self._syncing(msg).store.remove(msg.chunk_id)

    def _sync_done(self, req: ServerRequest) -> None:
        msg = from_meta(req.meta, SyncDoneMsg)
        rt = self._syncing(msg)
        rt.sync_done = True
        log.info("storage.sync_done", target=rt.target_id, chain=msg.chain_id, chain_version=msg.chain_ver,
                 sent=msg.sent, removed=msg.removed)

    def _space(self, req: ServerRequest) -> None:
        out = []
        for rt in self.node.targets.values():
            du = shutil.disk_usage(rt.path)
            used = sum(m.length for m in rt.store.all_meta())
            out.append(TargetSpace(target=rt.target_id, chunks=len(rt.store), used_bytes=used, free_bytes=du.free,
                                   total_bytes=du.total, corrupted=sorted(c.hex for c in rt.corrupted),
                                   corrupt_reports=rt.corrupt_reports))
        req.reply(meta=to_meta(SpaceReply(node_id=self.node.node_id, targets=out,
                                          grants_served=self.held.served + self.local_served,
                                          local_served=self.local_served,
                                          max_inflight_grants=self.held.max_inflight)))

