"""Retried writes apply once; bad input gets a clear typed error and writes nothing."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from stor_svc_harness import CHUNK, StorageCluster

from fireflyer.core.errors import PermissionDenied, Unauthenticated
from fireflyer.storage import (
    BadRequest,
    ChainVersionMismatch,
    ChunkId,
    ChunkNotFound,
    NotHead,
    NotServing,
    ReadReq,
    WriteAck,
    WriteReq,
    crc32c,
)
from fireflyer.storage.capability import WRITE
from fireflyer.storage.protocol import (
    OP_BATCH_READ,
    OP_DUMP_META,
    OP_READ,
    OP_REMOVE_RANGE,
    OP_SYNC_DONE,
    OP_SYNC_REPLACE,
    OP_UPDATE,
    OP_WRITE,
    BatchReadMsg,
    ReadMsg,
    WriteMsg,
    split_address,
    to_meta,
    wire_address,
)
from fireflyer.wire import Connection


def _head_conn(cluster: StorageCluster, routing, chain_id: int, token: str) -> tuple[Connection, int, int]:
    chain = next(c for c in routing.chains if c.chain_id == chain_id)
    head = chain.head
    t = next(t for t in routing.targets if t.target_id == head)
    node = next(n for n in routing.nodes if n.node_id == t.node_id)
    host, port = split_address(wire_address(node.tags) or "")
    return Connection.connect(host, port, token=token, timeout_s=2.0, request_timeout_s=5.0), head, chain.version


def _write(conn: Connection, caps: list[bytes], head: int, ver: int, cid: ChunkId, data: bytes, *, offset: int = 0,
           seq: int = 1, chain_id: int = 1, chunk_size: int = CHUNK, length: int | None = None) -> WriteAck:
    req = WriteReq(chain_id=chain_id, chain_ver=ver, chunk_id=cid, offset=offset,
                   length=len(data) if length is None else length, chunk_size=chunk_size, payload_crc=crc32c(data),
                   client_id="test-client", channel=1, seq=seq)
    reply = conn.request(OP_WRITE, data, meta=to_meta(WriteMsg(target=head, req=req, caps=caps)))
    return msgspec.convert(reply.meta, WriteAck)


async def test_retried_write_is_applied_once(cluster: StorageCluster) -> None:
    routing = await cluster.routing()
    conn, head, ver = _head_conn(cluster, routing, 1, cluster.user)
    cid = ChunkId(21, 0, 0)
    caps = [cluster.grants().get(cid.inode, WRITE)]  # what meta grants alice on open
    with conn:
        first = await asyncio.to_thread(_write, conn, caps, head, ver, cid, b"a" * 100, seq=1)
        again = await asyncio.to_thread(_write, conn, caps, head, ver, cid, b"a" * 100, seq=1)  # the client's retry
        assert (first.commit_ver, first.duplicate) == (1, False)
        assert (again.commit_ver, again.duplicate) == (1, True)
        nxt = await asyncio.to_thread(_write, conn, caps, head, ver, cid, b"b" * 10, offset=100, seq=2)
        assert nxt.commit_ver == 2
    # every replica has version 2 and the same bytes: the retry made no version of its own
    for t in next(c for c in routing.chains if c.chain_id == 1).target_ids:
        rep, data = await asyncio.to_thread(cluster.read_target, routing, 1, t, cid)
        assert (rep.version, data) == (2, b"a" * 100 + b"b" * 10)


async def test_bad_input_gets_clear_errors_and_writes_nothing(cluster: StorageCluster) -> None:
    routing = await cluster.routing()
    conn, head, ver = _head_conn(cluster, routing, 1, cluster.user)
    cid = ChunkId(22, 0, 0)
    caps = [cluster.grants().get(cid.inode, WRITE)]  # what meta grants alice on open
    with conn:
        with pytest.raises(BadRequest, match="out of bounds"):  # offset beyond the chunk
            await asyncio.to_thread(_write, conn, caps, head, ver, cid, b"x" * 10, offset=CHUNK - 5)
        with pytest.raises(BadRequest, match="out of bounds"):  # negative length
            await asyncio.to_thread(_write, conn, caps, head, ver, cid, b"", length=-1)
        with pytest.raises(BadRequest, match="out of bounds"):  # absurd chunk size
            await asyncio.to_thread(_write, conn, caps, head, ver, cid, b"x", chunk_size=1 << 40)
        with pytest.raises(ChainVersionMismatch) as e:  # wrong chain version
            await asyncio.to_thread(_write, conn, caps, head, ver + 5, cid, b"x" * 10)
        assert e.value.fields["expected"] == ver
        with pytest.raises(NotServing, match="unknown"):  # unknown chain
            await asyncio.to_thread(_write, conn, caps, head, ver, cid, b"x" * 10, chain_id=999)
        with pytest.raises(BadRequest, match="outside the limits"):  # oversized batch: 129 I/Os
            msg = BatchReadMsg(ios=[ReadMsg(target=head, req=ReadReq(chain_id=1, chain_ver=ver,
                                                                     chunk_id=ChunkId(22, 0, i)))
                                    for i in range(129)])
            await asyncio.to_thread(conn.request, OP_BATCH_READ, meta=to_meta(msg))
        with pytest.raises(BadRequest, match="malformed"):  # garbage header
            await asyncio.to_thread(conn.request, OP_READ, meta={"target": "x"})
        with pytest.raises(ChunkNotFound):  # unknown chunk: nothing above wrote it
            await asyncio.to_thread(conn.request, OP_READ, meta=to_meta(
                ReadMsg(target=head, req=ReadReq(chain_id=1, chain_ver=ver, chunk_id=cid), caps=caps)))
        with pytest.raises(PermissionDenied):  # chain-internal ops are not for users
            await asyncio.to_thread(conn.request, OP_UPDATE, meta={})
    # a write to a non-head replica is refused
    chain = next(c for c in routing.chains if c.chain_id == 1)
    mid = chain.target_ids[1]
    t = next(t for t in routing.targets if t.target_id == mid)
    host, port = cluster.node_address(routing, t.node_id)
    with Connection.connect(host, port, token=cluster.user, timeout_s=2.0) as c2:
        with pytest.raises(NotHead):
            await asyncio.to_thread(_write, c2, caps, mid, ver, cid, b"x" * 10)
    # a bad token never gets a connection
    with pytest.raises(Unauthenticated):
        Connection.connect(host, port, token="not-a-token", timeout_s=2.0)
    for tid in chain.target_ids:  # nothing was written anywhere
        with pytest.raises(ChunkNotFound):
            await asyncio.to_thread(cluster.read_target, routing, 1, tid, cid)


async def test_chain_ops_are_for_service_credentials_only(cluster: StorageCluster) -> None:
    """Forwarding, resync and remove ops (issue 48 point 2): a user's and an admin's token are
    refused; the storage service's credential gets past the role check (and then fails only on
    the empty header)."""
    routing = await cluster.routing()
    ops = (OP_UPDATE, OP_DUMP_META, OP_SYNC_REPLACE, OP_SYNC_DONE, OP_REMOVE_RANGE)
    for token in (cluster.user, cluster.admin):
        conn, _, _ = _head_conn(cluster, routing, 1, token)
        with conn:
            for op in ops:
                with pytest.raises(PermissionDenied, match="role service"):
                    await asyncio.to_thread(conn.request, op, meta={})
    conn, _, _ = _head_conn(cluster, routing, 1, cluster.service)
    with conn:
        for op in ops:
            with pytest.raises(BadRequest, match="malformed"):
                await asyncio.to_thread(conn.request, op, meta={})
