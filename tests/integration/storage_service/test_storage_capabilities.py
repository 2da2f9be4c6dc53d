"""Storage enforces meta's capabilities (issue 48 point 1): a user token alone reads and writes
nothing; a capability must be genuine, unexpired, granted to the caller, for the chunk's inode
and for the access.  Raw wire requests and the StorageClient alike; the service credential
(meta's cleaner, forwarding, resync) needs none, an admin's token does."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest
from stor_svc_harness import CHUNK, StorageCluster

from fireflyer.storage import ChunkId, ChunkNotFound, ReadReq, WriteReq
from fireflyer.storage.capability import READ, WRITE, CapabilityDenied, Grantor, decode, encode, read_key_file
from fireflyer.storage.checksum import crc32c
from fireflyer.storage.client_min import StorageClient
from fireflyer.storage.protocol import (
    OP_BATCH_READ,
    OP_QUERY_LAST,
    OP_READ,
    OP_REMOVE_RANGE,
    OP_WRITE,
    BatchReadMsg,
    QueryLastMsg,
    ReadMsg,
    RemoveRangeMsg,
    WriteMsg,
    split_address,
    to_meta,
    wire_address,
)
from fireflyer.wire import Connection

ALICE_FILE = ChunkId(4242, 0, 0)  # alice's file: written by her client, with her capability
BOB_FILE = 4343


def _conn(cluster: StorageCluster, routing, target: int, token: str) -> Connection:
    t = next(t for t in routing.targets if t.target_id == target)
    node = next(n for n in routing.nodes if n.node_id == t.node_id)
    host, port = split_address(wire_address(node.tags) or "")
    return Connection.connect(host, port, token=token, timeout_s=2.0, request_timeout_s=5.0)


def _grantor(cluster: StorageCluster, **kw: object) -> Grantor:
    return Grantor(read_key_file(cluster.tmp / "capability.key"), **kw)  # type: ignore[arg-type]


def _reason(e: pytest.ExceptionInfo[CapabilityDenied]) -> str:
    return str(e.value.fields["reason"])


async def _alice_wrote(cluster: StorageCluster) -> None:
    alice = cluster.data_client()
    await asyncio.to_thread(alice.write, 1, ALICE_FILE, 0, b"alice's secret" * 10, CHUNK)
    assert (await asyncio.to_thread(alice.read, 1, ALICE_FILE))[:14] == b"alice's secret"


async def test_a_user_token_alone_reads_and_writes_nothing(cluster: StorageCluster) -> None:
    """The probe: bob read and overwrote alice's chunk by id with only his user token."""
    await _alice_wrote(cluster)
    assert cluster.routing_src is not None
    for token in (cluster.bob, cluster.admin):  # admins get capabilities from meta like anyone
        bare = StorageClient(cluster.routing_src.get, token=token, request_timeout_s=1.0, retry_deadline_s=2.0)
        cluster.clients.append(bare)
        with pytest.raises(CapabilityDenied) as e:
            await asyncio.to_thread(bare.read, 1, ALICE_FILE)
        assert _reason(e) == "missing" and e.value.errno == 13
        with pytest.raises(CapabilityDenied):
            await asyncio.to_thread(bare.write, 1, ALICE_FILE, 0, b"bob was here", CHUNK)
    alice = cluster.data_client()
    assert (await asyncio.to_thread(alice.read, 1, ALICE_FILE))[:14] == b"alice's secret"  # unchanged


async def test_every_wrong_capability_is_refused_on_the_wire(cluster: StorageCluster) -> None:
    await _alice_wrote(cluster)
    routing = await cluster.routing()
    chain = next(c for c in routing.chains if c.chain_id == 1)
    g = _grantor(cluster)
    read = ReadReq(chain_id=1, chain_ver=chain.version, chunk_id=ALICE_FILE)

    def read_with(token: str, caps: list[bytes]) -> bytes:
        with _conn(cluster, routing, chain.target_ids[-1], token) as c:
            return bytes(c.request(OP_READ, meta=to_meta(ReadMsg(target=chain.target_ids[-1], req=read,
                                                                 caps=caps))).payload)

    def write_with(token: str, caps: list[bytes], data: bytes = b"overwritten!") -> None:
        req = WriteReq(chain_id=1, chain_ver=chain.version, chunk_id=ALICE_FILE, offset=0, length=len(data),
                       chunk_size=CHUNK, payload_crc=crc32c(data), client_id="rogue", channel=1, seq=int(time.time()))
        with _conn(cluster, routing, chain.head or 0, token) as c:
            c.request(OP_WRITE, data, meta=to_meta(WriteMsg(target=chain.head or 0, req=req, caps=caps)))

    def refused(reason: str, fn, *args) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises(CapabilityDenied) as e:
            fn(*args)
        assert _reason(e) == reason, e.value

    bobs_own = g.grant(inode=BOB_FILE, mode=READ | WRITE, user="bob")
    await asyncio.to_thread(refused, "missing", read_with, cluster.bob, [])
    await asyncio.to_thread(refused, "wrong_inode", read_with, cluster.bob, [bobs_own])  # his cap, her inode
    await asyncio.to_thread(refused, "wrong_inode", write_with, cluster.bob, [bobs_own])
    alices = g.grant(inode=ALICE_FILE.inode, mode=READ | WRITE, user="alice")
    await asyncio.to_thread(refused, "wrong_user", read_with, cluster.bob, [alices])  # a leaked capability
    expired = _grantor(cluster, clock=lambda: time.time() - 3600).grant(inode=ALICE_FILE.inode, mode=READ,
                                                                        user="alice")
    await asyncio.to_thread(refused, "expired", read_with, cluster.user, [expired])
    forged = decode(g.grant(inode=BOB_FILE, mode=READ | WRITE, user="bob"))
    forged = msgspec.structs.replace(forged, inode=ALICE_FILE.inode)  # retargeted: the signature no longer fits
    await asyncio.to_thread(refused, "bad_signature", read_with, cluster.bob, [encode(forged)])
    flipped = decode(alices)
    flipped = msgspec.structs.replace(flipped, sig=bytes([flipped.sig[0] ^ 1]) + flipped.sig[1:])
    await asyncio.to_thread(refused, "bad_signature", read_with, cluster.user, [encode(flipped)])
    read_only = g.grant(inode=ALICE_FILE.inode, mode=READ, user="alice")
    await asyncio.to_thread(refused, "wrong_mode", write_with, cluster.user, [read_only])
    # batch reads and query_last are covered too
    with _conn(cluster, routing, chain.target_ids[-1], cluster.bob) as c:
        with pytest.raises(CapabilityDenied):
            await asyncio.to_thread(c.request, OP_BATCH_READ, meta=to_meta(BatchReadMsg(
                ios=[ReadMsg(target=chain.target_ids[-1], req=read)], caps=[bobs_own])))
        with pytest.raises(CapabilityDenied):
            await asyncio.to_thread(c.request, OP_QUERY_LAST, meta=to_meta(QueryLastMsg(
                target=chain.target_ids[-1], chain_id=1, chain_ver=chain.version, inode=ALICE_FILE.inode)))
    # the right one works, and nothing above changed the chunk
    assert (await asyncio.to_thread(read_with, cluster.user, [read_only]))[:14] == b"alice's secret"


async def test_the_service_credential_needs_no_capability(cluster: StorageCluster) -> None:
    """Meta's cleaner removes a file's chunks with its service credential (truncate, GC)."""
    await _alice_wrote(cluster)
    routing = await cluster.routing()
    chain = next(c for c in routing.chains if c.chain_id == 1)
    msg = RemoveRangeMsg(target=chain.head or 0, chain_id=1, chain_ver=chain.version, begin=ALICE_FILE,
                         end=ChunkId(ALICE_FILE.inode + 1, 0, 0))
    with _conn(cluster, routing, chain.head or 0, cluster.service) as c:
        got = await asyncio.to_thread(c.request, OP_REMOVE_RANGE, meta=to_meta(msg))
    assert got.meta["removed"] >= 1
    for t in chain.target_ids:
        with pytest.raises(ChunkNotFound):
            await asyncio.to_thread(cluster.read_target, routing, 1, t, ALICE_FILE)  # service pool: no caps
