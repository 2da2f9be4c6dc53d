"""Batch reads sent from the chunk files (sendfile, recorded CRC) and from memory (range CRC):
the same bytes either way, and a bad copy on disk is still caught, by the reader, and reported."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgspec
from stor_svc_harness import CHUNK, StorageCluster

from fireflyer.storage import ChunkCorrupted, ChunkId
from fireflyer.storage.capability import READ
from fireflyer.storage.client_min import ReadIo
from fireflyer.storage.protocol import OP_REPORT_CORRUPT, OP_SPACE, CorruptReport, SpaceReply, to_meta
from fireflyer.testing.poll import wait_for

BIG = 1 << 20  # chunk size of the large chunks: whole reads of them go by sendfile


def _corrupted_on(cluster: StorageCluster, routing: object, target: int) -> list[str]:
    node = next(t.node_id for t in routing.targets if t.target_id == target)  # type: ignore[attr-defined]
    reply = cluster.pool.call(cluster.node_address(routing, node), OP_SPACE, meta={})  # type: ignore[arg-type]
    space = msgspec.convert(reply.meta, SpaceReply)
    return next(t.corrupted for t in space.targets if t.target == target)


async def test_whole_partial_short_and_odd_reads_return_the_written_bytes(cluster: StorageCluster) -> None:
    client = cluster.data_client()
    sizes = [BIG, BIG - 1, 3 * CHUNK + 7, CHUNK, CHUNK - 1, 1, 4097]
    blobs = {i: os.urandom(n) for i, n in enumerate(sizes)}
    for i, b in blobs.items():
        await asyncio.to_thread(client.write, 1 + i % 2, ChunkId(31, 0, i), 0, b, BIG)

    cases: list[tuple[int, int, int]] = []  # (chunk, offset, length)
    for i, b in blobs.items():
        n = len(b)
        cases += [(i, 0, -1), (i, 0, n), (i, 0, BIG), (i, 0, n + 12345)]  # whole (and asked for more)
        cases += [(i, 1, -1), (i, n // 3, max(1, n // 2)), (i, n - 1, 1), (i, 0, max(1, n - 1))]  # partial

    def want(i: int, off: int, length: int) -> bytes:
        b = blobs[i]
        return b[off:] if length < 0 else b[off:off + length]

    ios = [ReadIo(chain_id=1 + i % 2, chunk_id=ChunkId(31, 0, i), offset=off, length=length)
           for i, off, length in cases]

    def read_all() -> tuple[list[bytes], list[bytes]]:
        plain = client.batch_read(ios)
        assert all(r.error is None for r in plain), [r.error for r in plain if r.error]
        bufs = [bytearray(b"\xee" * (BIG + 20000)) for _ in ios]
        into = client.batch_read(ios, into=[memoryview(b) for b in bufs])
        assert all(r.error is None for r in into), [r.error for r in into if r.error]
        return [bytes(r.data) for r in plain], [bytes(r.data) for r in into]

    plain, into = await asyncio.to_thread(read_all)
    expected = [want(*c) for c in cases]
    assert plain == expected
    assert into == expected


async def test_small_reads_share_a_batch_scattered_over_their_buffers(cluster: StorageCluster) -> None:
    client = cluster.data_client()
    blobs = [os.urandom(100 + 311 * i) for i in range(9)]
    for i, b in enumerate(blobs):
        await asyncio.to_thread(client.write, 1, ChunkId(32, 0, i), 0, b, BIG)
    ios = [ReadIo(chain_id=1, chunk_id=ChunkId(32, 0, i), offset=i, length=len(b)) for i, b in enumerate(blobs)]
    bufs = [bytearray(b"\xee" * (len(b) + 5)) for b in blobs]
    res = await asyncio.to_thread(client.batch_read, ios, [memoryview(b) for b in bufs])
    for i, (r, b, buf) in enumerate(zip(res, blobs, bufs, strict=True)):
        assert r.error is None and bytes(r.data) == b[i:]
        assert buf[:len(b) - i] == b[i:] and buf[len(b) - i:] == b"\xee" * (i + 5)  # the rest untouched


async def test_a_flipped_bit_on_disk_is_caught_by_the_reader_served_elsewhere_and_reported(
        cluster: StorageCluster) -> None:
    client = cluster.data_client()
    cid = ChunkId(33, 0, 0)
    data = os.urandom(BIG - 3)  # whole reads of it go by sendfile, unhashed by the server
    await asyncio.to_thread(client.write, 1, cid, 0, data, BIG)
    routing = await cluster.routing()
    chain = next(c for c in routing.chains if c.chain_id == 1)
    bad = chain.target_ids[1]
    node = next(t.node_id for t in routing.targets if t.target_id == bad)
    tdir = cluster.tmp / "storage" / node / str(bad) / "chunks"

    def flip_bit() -> None:
        [path] = [p for p in tdir.rglob("*") if p.is_file() and cid.hex in p.name]
        raw = bytearray(path.read_bytes())
        raw[BIG // 2 + 1] ^= 0x40
        Path(path).write_bytes(raw)

    await asyncio.to_thread(flip_bit)

    def from_bad() -> object:
        ios = [ReadIo(chain_id=1, chunk_id=cid, length=BIG)]
        node_id, addr = client.address(bad)
        [(_, res)] = client._one_batch((node_id, addr, [(0, bad)]), ios, [memoryview(bytearray(BIG))])
        return res.error

    err = await asyncio.to_thread(from_bad)
    assert isinstance(err, ChunkCorrupted) and "CRC32C" in str(err)
    # the reader told the replica, which verified the chunk itself and marked it
    await wait_for(lambda: cid.hex in _corrupted_on(cluster, routing, bad), timeout_s=10.0,
                   what="corruption confirmed by the replica")
    for _ in range(4):  # readers always get good bytes (another replica)
        buf = bytearray(BIG)
        res = await asyncio.to_thread(client.batch_read, [ReadIo(chain_id=1, chunk_id=cid, length=BIG)],
                                      [memoryview(buf)])
        assert res[0].error is None and bytes(res[0].data) == data


async def test_a_corruption_report_about_a_good_copy_changes_nothing(cluster: StorageCluster) -> None:
    client = cluster.data_client()
    cid = ChunkId(34, 0, 0)
    data = os.urandom(BIG)
    await asyncio.to_thread(client.write, 2, cid, 0, data, BIG)
    routing = await cluster.routing()
    target = next(c for c in routing.chains if c.chain_id == 2).target_ids[0]
    _, addr = client.address(target)

    def report() -> object:
        caps = client.caps_for((cid.inode,), READ)  # a report needs read access to the chunk
        return client._call(addr, OP_REPORT_CORRUPT,
                            meta=to_meta(CorruptReport(target=target, chunk_id=cid, caps=caps))).meta

    assert await asyncio.to_thread(report) == {"corrupted": False}
    assert await asyncio.to_thread(_corrupted_on, cluster, routing, target) == []
    _, got = await asyncio.to_thread(cluster.read_target, routing, 2, target, cid)
    assert got == data
