"""Reads received straight into caller buffers: same bytes as plain reads, corruption still caught."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from stor_svc_harness import CHUNK, StorageCluster

from fireflyer.storage import ChunkCorrupted, ChunkId
from fireflyer.storage.client_min import ReadIo


async def test_batch_read_into_matches_plain_reads(cluster: StorageCluster) -> None:
    client = cluster.data_client()
    blobs = {i: os.urandom(CHUNK if i % 3 == 0 else 1000 + 37 * i) for i in range(12)}
    for i, b in blobs.items():
        await asyncio.to_thread(client.write, 1 + i % 2, ChunkId(21, 0, i), 0, b, CHUNK)

    def read_both() -> tuple[list[bytes], list[bytes], list[bytearray]]:
        # whole chunks (one I/O per batch: received in place) and small ones (shared batches: copied)
        ios = [ReadIo(chain_id=1 + i % 2, chunk_id=ChunkId(21, 0, i), length=CHUNK) for i in blobs]
        plain = [bytes(r.data) for r in client.batch_read(ios)]
        bufs = [bytearray(b"\xee" * CHUNK) for _ in ios]  # garbage first: short reads leave the tail
        res = client.batch_read(ios, into=[memoryview(b) for b in bufs])
        assert all(r.error is None for r in res), [r.error for r in res if r.error]
        return plain, [bytes(r.data) for r in res], bufs

    plain, into, bufs = await asyncio.to_thread(read_both)
    want = [blobs[i] for i in blobs]
    assert plain == want and into == want
    for b, w in zip(bufs, want, strict=True):
        assert b[:len(w)] == w and b[len(w):] == b"\xee" * (CHUNK - len(w))
    # read_range (which reads into one buffer) across chunk boundaries, odd length
    data = os.urandom(3 * CHUNK + 777)
    await asyncio.to_thread(client.write_range, 22, 100, data, CHUNK, chain_of=lambda i: 1 + i % 2)
    got = await asyncio.to_thread(client.read_range, 22, 100, len(data), CHUNK, chain_of=lambda i: 1 + i % 2)
    assert got == data


async def test_read_into_a_flipped_replica_is_caught(cluster: StorageCluster) -> None:
    client = cluster.data_client()
    cid = ChunkId(23, 0, 0)
    data = os.urandom(CHUNK)
    await asyncio.to_thread(client.write, 1, cid, 0, data, CHUNK)
    routing = await cluster.routing()
    chain = next(c for c in routing.chains if c.chain_id == 1)
    bad = chain.target_ids[2]
    node = next(t.node_id for t in routing.targets if t.target_id == bad)
    tdir = cluster.tmp / "storage" / node / str(bad) / "chunks"

    def flip_bit() -> None:
        files = [p for p in tdir.rglob("*") if p.is_file() and cid.hex in p.name]
        assert len(files) == 1
        raw = bytearray(files[0].read_bytes())
        raw[777] ^= 0x01
        Path(files[0]).write_bytes(raw)

    await asyncio.to_thread(flip_bit)

    def from_bad() -> object:
        buf = bytearray(CHUNK)
        ios = [ReadIo(chain_id=1, chunk_id=cid, length=CHUNK)]
        node_id, addr = client.address(bad)
        [(_, res)] = client._one_batch((node_id, addr, [(0, bad)]), ios, [memoryview(buf)])
        return res.error

    assert isinstance(await asyncio.to_thread(from_bad), ChunkCorrupted)  # the replica's CRC check
    buf = bytearray(CHUNK)
    res = await asyncio.to_thread(client.batch_read, [ReadIo(chain_id=1, chunk_id=cid, length=CHUNK)],
                                  [memoryview(buf)])
    assert res[0].error is None and buf == data  # served by (or retried on) a good replica


async def test_a_chain_newer_than_the_clients_routing_is_retried_after_a_refresh(cluster: StorageCluster) -> None:
    """A client whose routing predates a chain (connected before the chain table was made)
    refreshes and retries reads and batch writes instead of failing them at once."""
    import msgspec

    from fireflyer.fs.batch import WritePiece, write_pieces
    from fireflyer.storage.client_min import SendLimiter, StorageClient

    real = cluster.routing_src.get  # type: ignore[union-attr]
    first = real()
    calls = {"n": 0}

    def routing() -> object:
        calls["n"] += 1
        if calls["n"] == 1:  # the snapshot at connect: no chains yet
            return msgspec.structs.replace(first, version=first.version - 1, chains=[])
        return real()

    client = StorageClient(routing, token=cluster.user, limiter=SendLimiter(), request_timeout_s=1.0,
                           capabilities=cluster.grants())
    cluster.clients.append(client)
    assert client.routing.chains == []
    cid = ChunkId(23, 0, 0)
    piece = WritePiece(chain_id=1, chunk_id=cid, offset=0, data=memoryview(b"fresh chain"), chunk_size=CHUNK)

    def go() -> tuple[list[object], list[ReadIo]]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:
            errs = write_pieces(client, pool, [piece], 10.0)
        client.routing = msgspec.structs.replace(first, version=first.version - 1, chains=[])  # stale again
        return errs, client.batch_read([ReadIo(chain_id=1, chunk_id=cid, length=CHUNK)])

    errs, res = await asyncio.to_thread(go)
    assert errs == [None] and res[0].error is None and bytes(res[0].data) == b"fresh chain"
    assert calls["n"] >= 3  # refreshed for the write and again for the read
