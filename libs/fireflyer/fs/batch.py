"""File byte ranges -> chunk I/Os, grouped by chain and storage node, run concurrently.

Reads: every range is cut into per-chunk pieces (chunk ``i`` on ``chains[i % stripe]``,
pieces no larger than one storage batch's byte limit) and all pieces of all ranges go
to :meth:`StorageClient.batch_read` at once, which picks a serving replica per piece,
groups pieces by node into ``stor.batch_read`` batches (128 I/Os / 4 MiB), runs the
batches in parallel under the request-to-send limiter and fails over to another
replica after an error or timeout, until its deadline.  A chunk that does not exist,
or is shorter than asked, reads as zeros (a hole) up to the file length.
:func:`read_pieces_into` receives every piece straight into its slice of the caller's
buffer (one kernel copy from the socket, no bytes objects, no joins).

Writes: pieces are grouped by the head of their chain's *node* and sent as
``stor.batch_write`` batches in parallel.  A piece larger than one batch's byte limit
(a whole chunk of a large-chunk file: checkpoints use 64 MiB chunks) goes alone as one
``stor.write``, so a chunk is written once instead of once per 4 MiB slice -- each
slice of a chunk would otherwise make a new copy-on-write version of it, with its own
fsyncs.  Piece data may be memoryviews of the caller's buffers: a batch of one piece
is sent straight from it; several are joined into one payload (the wire takes one).  Every piece gets its own update channel
with seq 1, kept across retries, so the head's (client, channel, seq) dedupe applies
a retried piece once even when the first reply was lost.  Pieces that fail with a
retryable error (chain version moved, not the head, node unreachable, timeout) are
re-grouped with fresh routing and retried with backoff until ``retry_deadline_s``;
others end with their error.  Results are per piece, so the caller can say which
I/O failed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import msgspec

from fireflyer.core.errors import FireFlyerError, NotFound, Unavailable
from fireflyer.meta import Layout
from fireflyer.storage.capability import WRITE
from fireflyer.storage.checksum import crc32c
from fireflyer.storage.chunkid import ChunkId, split_range
from fireflyer.storage.client_min import ReadIo, StorageClient
from fireflyer.storage.craq import WriteAck, WriteReq
from fireflyer.storage.errors import RETRY_AFTER_REFRESH, NotServing
from fireflyer.storage.protocol import (
    OP_BATCH_WRITE,
    OP_WRITE,
    BatchWriteMsg,
    BatchWriteReply,
    WriteMsg,
    error_of,
    to_meta,
)

__all__ = ["Piece", "WritePiece", "pieces_of", "read_pieces_into", "write_pieces"]

Buffer = bytes | bytearray | memoryview


class Piece(msgspec.Struct, frozen=True):
    """One chunk-sized (or smaller) part of a file range: ``at`` is its offset in the range."""

    chain_id: int
    chunk_id: ChunkId
    offset: int
    length: int
    at: int


class WritePiece(msgspec.Struct, frozen=True):
    chain_id: int
    chunk_id: ChunkId
    offset: int
    chunk_size: int
    #: bytes-like; a memoryview of the caller's buffer is sent without a copy
    data: Buffer


def pieces_of(inode_id: int, layout: Layout, offset: int, length: int, max_piece: int) -> list[Piece]:
    out: list[Piece] = []
    for index, inner, n, at in split_range(offset, length, layout.chunk_size):
        chain = layout.chain_of(index)
        for k in range(0, n, max_piece):
            out.append(Piece(chain, ChunkId(inode_id, 0, index), inner + k, min(max_piece, n - k), at + k))
    return out


def read_pieces_into(storage: StorageClient, pieces: Sequence[Piece],
                     dests: Sequence[memoryview]) -> list[FireFlyerError | None]:
    """Read each piece into its ``dests`` buffer (``len == piece.length``); None = read.

    Holes and bytes past a short chunk's end are zeroed here (the buffer may hold a failed
    attempt's partial bytes, so "fresh buffers are zero" is not enough)."""
    ios = [ReadIo(chain_id=p.chain_id, chunk_id=p.chunk_id, offset=p.offset, length=p.length) for p in pieces]
    out: list[FireFlyerError | None] = []
    for p, dest, r in zip(pieces, dests, storage.batch_read(ios, into=dests) if ios else [], strict=True):
        if r.error is not None and not isinstance(r.error, NotFound):
            out.append(r.error)
            continue
        n = 0 if r.error is not None else len(r.data)
        if n < p.length:
            dest[n:] = bytes(p.length - n)
        out.append(None)
    return out


def write_pieces(storage: StorageClient, pool: ThreadPoolExecutor, pieces: Sequence[WritePiece],
                 deadline_s: float) -> list[FireFlyerError | None]:
    """Write pieces through their chain heads, batched per node; None = written."""
    channels = [next(storage._channels) for _ in pieces]  # one channel per piece, seq 1: retry-safe dedupe
    crcs = [crc32c(p.data) for p in pieces]
    results: list[FireFlyerError | None | bool] = [False] * len(pieces)  # False: not done yet
    todo = list(range(len(pieces)))
    deadline = time.monotonic() + deadline_s
    for attempt in itertools.count():
        by_node: dict[str, list[tuple[int, int]]] = {}
        retry: list[int] = []
        last: FireFlyerError | None = None
        for i in todo:
            try:
                chain = storage.chain(pieces[i].chain_id)
                if chain.head is None:
                    raise NotServing(f"chain {chain.chain_id} has no serving head", chain=chain.chain_id)
                _, addr = storage.address(chain.head)
            except FireFlyerError as e:
                results[i] = e
                if isinstance(e, RETRY_AFTER_REFRESH):  # e.g. a chain newer than our routing: refresh and retry
                    retry.append(i)
                    last = e
                continue
            by_node.setdefault(addr, []).append((i, chain.head))
        batches = []
        for addr, items in by_node.items():
            cur: list[tuple[int, int]] = []
            size = 0
            for i, head in items:
                n = len(pieces[i].data)
                if n > storage.limits.max_bytes:  # a whole large chunk: a stor.write of its own
                    batches.append((addr, [(i, head)]))
                    continue
                if cur and (len(cur) >= storage.limits.max_ios or size + n > storage.limits.max_bytes):
                    batches.append((addr, cur))
                    cur, size = [], 0
                cur.append((i, head))
                size += n
            if cur:
                batches.append((addr, cur))

        def send(batch: tuple[str, list[tuple[int, int]]]) -> list[tuple[int, FireFlyerError | None]]:
            addr, items = batch
            try:  # meta's capabilities for the batch's files (renewed here when near expiry)
                caps = storage.caps_for((pieces[i].chunk_id.inode for i, _ in items), WRITE)
            except FireFlyerError as e:
                return [(i, e) for i, _ in items]
            msgs = []
            for i, head in items:
                p = pieces[i]
                ver = storage.chain(p.chain_id).version
                msgs.append(WriteMsg(target=head, req=WriteReq(
                    chain_id=p.chain_id, chain_ver=ver, chunk_id=p.chunk_id, offset=p.offset, length=len(p.data),
                    chunk_size=p.chunk_size, payload_crc=crcs[i], client_id=storage.client_id,
                    channel=channels[i], seq=1)))
            if len(msgs) == 1 and msgs[0].req.length > storage.limits.max_bytes:
                try:
                    reply = storage._call(addr, OP_WRITE, pieces[items[0][0]].data,
                                          meta=to_meta(msgspec.structs.replace(msgs[0], caps=caps)))
                    msgspec.convert(reply.meta, WriteAck)
                except FireFlyerError as e:
                    return [(items[0][0], e)]
                return [(items[0][0], None)]
            # one piece goes as it is (a view of the caller's buffer); several are joined (one copy)
            payload = pieces[items[0][0]].data if len(items) == 1 else b"".join(pieces[i].data for i, _ in items)
            try:
                reply = storage._call(addr, OP_BATCH_WRITE, payload or None, meta=to_meta(BatchWriteMsg(ios=msgs, caps=caps)))
            except FireFlyerError as e:
                return [(i, e) for i, _ in items]
            res = msgspec.convert(reply.meta, BatchWriteReply).results
            return [(i, error_of(r)) for (i, _), r in zip(items, res, strict=True)]

        for fut in [pool.submit(send, b) for b in batches]:
            for i, err in fut.result():
                results[i] = err
                if not attempt and storage.expired(err, pieces[i].chunk_id.inode):
                    retry.append(i)  # renewed on the next try
                    last = err
                elif isinstance(err, RETRY_AFTER_REFRESH):
                    retry.append(i)
                    last = err
        if not retry:
            break
        todo = retry
        try:
            storage._backoff(attempt, deadline, last or Unavailable("write retries exhausted"))
        except FireFlyerError:
            break
    return [r if isinstance(r, FireFlyerError) else None for r in results]
