"""Meta's storage-side cleanup: chunks of removed files (GC) and of shrunk files (truncate).

3FS moves a removed file's inode to a GC directory and a GC manager deletes its
chunks later (``gc_file_delay`` 5 min, research/3fs.md §2).  Here ``MetaStore``
queues a :class:`~fireflyer.meta.GcItem` when the last link goes, and this worker
deletes the chunks once the item is ``gc_delay_s`` old (the delay is a safety net:
a reader that opened the file just before the unlink can finish), then calls
``gc_done``.  A file's chunk ids are one contiguous range per target
(:func:`fireflyer.storage.chunkid.file_range`), so deletion is one
``stor.remove_range`` to the head of each chain of the layout (the head forwards it
down the chain).  It is idempotent: a crash between removing and ``gc_done`` just
removes nothing the second time.

**Truncate** must be applied *before* the caller writes again, or cleanup would
destroy new data (``open("wb")`` is truncate-then-write).  So a shrinking
``Truncate`` (or ``Open``/``Create`` with O_TRUNC) is applied synchronously, inside
the RPC (:class:`TruncatingServicer`), and the worker only picks up records older
than ``truncate_grace_s`` (left over when a meta replica died mid-RPC).  Applying
a record to length ``n``: every chunk with index ``> n // chunk_size`` is removed
(one range per chain); the chunk holding ``n`` (when ``n`` is not chunk aligned) is
*read, removed and rewritten with its first* ``n % chunk_size`` *bytes*, because
the storage protocol has no op that shortens a chunk.  Crash window: if meta dies
between that remove and the rewrite, up to one chunk of kept data past the last
chunk boundary is lost (3FS has a storage-side ``truncateChunks`` that avoids it;
adding ``stor.truncate`` to the storage service would close the window).  Chunks
are always shortened exactly, so ``stor.query_last`` (the exact length at close)
never resurrects truncated bytes.

Everything here runs the synchronous storage client on worker threads, never on
the event loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from fireflyer.core.errors import FireFlyerError, NotFound
from fireflyer.core.log import get_logger
from fireflyer.meta import GcItem, Layout, MetaStore, TruncateItem
from fireflyer.meta import keys as meta_keys
from fireflyer.storage.chunkid import ChunkId, file_range
from fireflyer.storage.client_min import StorageClient
from fireflyer.storage.errors import RETRY_AFTER_REFRESH
from fireflyer.storage.protocol import OP_REMOVE_RANGE, RemoveRangeMsg, to_meta

from .servicer import MetaServicer

#: what a chunk removal waits out (until the storage client's retry deadline): a routing change,
#: a head that is not serving yet (NotServing is an Unavailable, in RETRY_AFTER_REFRESH), and a
#: chain with no head or not in the routing seen so far (NotFound).  Anything else -- a bad
#: request, a refused token -- fails at once: truncation runs inside the caller's RPC, which
#: must not sit out the deadline on an error that stays.
_REMOVE_RETRY: tuple[type[FireFlyerError], ...] = (*RETRY_AFTER_REFRESH, NotFound)

__all__ = ["GcSettings", "StorageCleaner", "GcWorker", "TruncatingServicer"]

log = get_logger(__name__)
_trunc_dec = msgspec.msgpack.Decoder(TruncateItem)


class GcSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    #: how long a removed file's chunks are kept (3FS gc_file_delay: 5 min)
    gc_delay_s: float = 300.0
    #: how often the worker looks at the queues
    interval_s: float = 5.0
    #: truncate records older than this were not applied by their RPC (a replica died): apply them
    truncate_grace_s: float = 30.0
    #: items handled per round
    batch: int = 64


class StorageCleaner:
    """The storage operations of GC and truncation (synchronous; meta's service credential)."""

    def __init__(self, make_storage: Callable[[], StorageClient]) -> None:
        self._make = make_storage
        self._storage: StorageClient | None = None
        self._lock = threading.Lock()

    @property
    def storage(self) -> StorageClient:
        """Made on first use: mgmtd may not be up (or have chains) when meta starts."""
        with self._lock:
            if self._storage is None:
                self._storage = self._make()
            return self._storage

    def close(self) -> None:
        if self._storage is not None:
            self._storage.close()

    def _remove(self, chain_id: int, begin: ChunkId, end: ChunkId) -> int:
        """``stor.remove_range`` at the chain head, retried over routing changes."""
        deadline = time.monotonic() + self.storage.retry_deadline_s
        attempt = 0
        while True:
            try:
                chain = self.storage.chain(chain_id)
                if chain.head is None:
                    raise NotFound(f"chain {chain_id} has no head", chain=chain_id)
                _, addr = self.storage.address(chain.head)
                msg = RemoveRangeMsg(target=chain.head, chain_id=chain_id, chain_ver=chain.version,
                                     begin=begin, end=end)
                reply = self.storage._call(addr, OP_REMOVE_RANGE, meta=to_meta(msg))
                return int(reply.meta.get("removed", 0))
            except _REMOVE_RETRY as e:
                self.storage._backoff(attempt, deadline, e)  # raises when the deadline is near
                attempt += 1

    def remove_file(self, inode_id: int, layout: Layout | None) -> int:
        """Delete every chunk of a file on every chain of its layout."""
        if layout is None:
            return 0
        begin, end = file_range(inode_id)
        return sum(self._remove(c, begin, end) for c in dict.fromkeys(layout.chains))

    def truncate_file(self, inode_id: int, layout: Layout | None, length: int) -> int:
        """Cut a file's chunks to ``length`` bytes (see the module doc); returns chunks removed."""
        if layout is None:
            return 0
        cs = layout.chunk_size
        keep_last, rem = divmod(length, cs)  # chunks [0, keep_last) stay whole
        first_gone = keep_last + (1 if rem else 0)
        removed = 0
        _, end = file_range(inode_id)
        for c in dict.fromkeys(layout.chains):
            removed += self._remove(c, ChunkId(inode_id, 0, first_gone), end)
        if rem:
            chain = layout.chain_of(keep_last)
            cid = ChunkId(inode_id, 0, keep_last)
            res = self.storage.batch_read([_read_io(chain, cid)])[0]
            if res.error is None and len(res.data) > rem:
                prefix = res.data[:rem]
                removed += self._remove(chain, cid, ChunkId(inode_id, 0, keep_last + 1))
                self.storage.write(chain, cid, 0, prefix, cs)
            elif res.error is not None and not isinstance(res.error, NotFound):
                raise res.error
        return removed


def _read_io(chain: int, cid: ChunkId) -> Any:
    from fireflyer.storage.client_min import ReadIo

    return ReadIo(chain_id=chain, chunk_id=cid, offset=0, length=-1)


class GcWorker:
    """Background loop: delayed GC of removed files, leftover truncate records."""

    def __init__(self, store: MetaStore, cleaner: StorageCleaner, settings: GcSettings,
                 pool: ThreadPoolExecutor, clock: Callable[[], float] = time.time) -> None:
        self.store, self.cleaner, self.settings, self.pool, self.clock = store, cleaner, settings, pool, clock
        self.collected = 0
        self.truncated = 0

    def run_once(self) -> tuple[int, int]:
        """One round (synchronous): returns (files collected, truncations applied)."""
        now = self.clock()
        due: list[GcItem] = [g for g in self.store.gc_pending(self.settings.batch)
                             if now - g.removed_at >= self.settings.gc_delay_s]
        done: list[int] = []
        for item in due:
            try:
                n = self.cleaner.remove_file(item.inode_id, item.layout)
            except FireFlyerError as e:
                log.warning("meta.gc_failed", inode=item.inode_id, error=str(e))
                continue
            log.info("meta.gc_collected", inode=item.inode_id, chunks=n)
            done.append(item.inode_id)
        if done:
            self.store.gc_done(done)
        applied: list[TruncateItem] = []
        for t in self.store.truncate_pending(self.settings.batch):
            if now - t.at < self.settings.truncate_grace_s:
                continue
            try:
                self.cleaner.truncate_file(t.inode_id, t.layout, t.length)
            except FireFlyerError as e:
                log.warning("meta.truncate_failed", inode=t.inode_id, error=str(e))
                continue
            applied.append(t)
        if applied:
            self.store.truncate_done(applied)
        self.collected += len(done)
        self.truncated += len(applied)
        return len(done), len(applied)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(self.pool, self.run_once)
            except FireFlyerError as e:  # KV or storage trouble: try again next round
                log.warning("meta.gc_round_failed", error=str(e))
            await asyncio.sleep(self.settings.interval_s)


def pending_truncate(store: MetaStore, inode_id: int) -> TruncateItem | None:
    """The truncate record of one inode, if any (read straight from the KV)."""
    raw = store.kv.run(lambda txn: txn.get(meta_keys.trunc_key(inode_id), snapshot=True), idempotent=True)
    return None if raw is None else _trunc_dec.decode(raw)


class TruncatingServicer(MetaServicer):
    """The meta servicer, with shrinking truncates applied to storage before the RPC returns."""

    def __init__(self, *args: Any, cleaner: StorageCleaner, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.cleaner = cleaner

    def _apply_now(self, inode_id: int) -> None:
        item = pending_truncate(self.store, inode_id)
        if item is None:
            return
        self.cleaner.truncate_file(item.inode_id, item.layout, item.length)
        self.store.truncate_done([item])

    async def _after(self, reply: Any) -> Any:
        await self._run(self._apply_now, reply.inode.id)
        return reply

    async def Truncate(self, request: Any, context: Any) -> Any:
        return await self._after(await super().Truncate(request, context))

    async def Open(self, request: Any, context: Any) -> Any:
        reply = await super().Open(request, context)
        return await self._after(reply) if request.flags & os.O_TRUNC else reply

    async def Create(self, request: Any, context: Any) -> Any:
        reply = await super().Create(request, context)
        return await self._after(reply) if request.flags & os.O_TRUNC else reply
