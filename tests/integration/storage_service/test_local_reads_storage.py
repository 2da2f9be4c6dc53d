"""Short-circuit local reads against real storage processes on this host: chunk files handed
over the nodes' Unix sockets as descriptors, read in place, checked like network reads."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path

import msgspec
import pytest
from stor_svc_harness import CHUNK, StorageCluster

from fireflyer.core.errors import Unauthenticated, error_from_dict
from fireflyer.mgmt.model import PublicState, RoutingInfo
from fireflyer.storage import ChunkCorrupted, ChunkId, ChunkNotFound, NotCommitted, ReadReq, crc32c
from fireflyer.storage.capability import READ
from fireflyer.storage.client_min import ReadIo, ReadResult, StorageClient
from fireflyer.storage.localread import LocalReadClient, bind_unix, host_identity, local_socket
from fireflyer.storage.protocol import OP_SPACE, ReadMsg, SpaceReply
from fireflyer.testing.poll import wait_for

BIG = 1 << 20


def _socket_of(routing: RoutingInfo, node: str) -> str:
    n = next(n for n in routing.nodes if n.node_id == node)
    path = local_socket(n.tags)
    assert path is not None, n.tags
    return path


def _node_of(routing: RoutingInfo, target: int) -> str:
    return next(t.node_id for t in routing.targets if t.target_id == target)


def _chunk_file(cluster: StorageCluster, routing: RoutingInfo, target: int, cid: ChunkId) -> Path:
    tdir = cluster.tmp / "storage" / _node_of(routing, target) / str(target) / "chunks"
    [path] = [p for p in tdir.rglob("*") if p.is_file() and cid.hex in p.name]
    return path


def _one(client: StorageClient, local: bool, target: int, io: ReadIo, into: memoryview | None = None) -> ReadResult:
    """Read ``io`` from one given replica through one given path."""
    node, addr = client.address(target)
    bufs = None if into is None else [into]
    if local:
        path = client._local_socket(node)
        assert path is not None
        [(_, res)] = client._local_batch(path, (node, addr, [(0, target)]), [io], bufs)
    else:
        [(_, res)] = client._one_batch((node, addr, [(0, target)]), [io], bufs)
    return res


async def test_nodes_advertise_their_socket_for_this_host(cluster: StorageCluster) -> None:
    routing = await cluster.routing()
    storage = [n for n in routing.nodes if n.node_id.startswith("storage-")]
    assert len(storage) == 3
    for n in storage:
        path = local_socket(n.tags)
        assert path == str(cluster.tmp / "storage" / n.node_id / "local.sock")
        assert local_socket(n.tags, host="another-host/0") is None  # other machines never use it
    assert host_identity().startswith(os.uname().nodename)


async def test_local_reads_are_used_and_return_what_the_network_returns(cluster: StorageCluster) -> None:
    local = cluster.data_client()
    net = cluster.data_client(local_reads=False)
    sizes = [BIG, BIG - 1, 3 * CHUNK + 7, CHUNK, 1, 4097]
    blobs = {i: os.urandom(n) for i, n in enumerate(sizes)}
    for i, b in blobs.items():
        await asyncio.to_thread(local.write, 1 + i % 2, ChunkId(71, 0, i), 0, b, BIG)
    cases: list[tuple[int, int, int]] = []
    for i, b in blobs.items():
        n = len(b)
        cases += [(i, 0, -1), (i, 0, BIG), (i, 1, -1), (i, n // 3, max(1, n // 2)), (i, n - 1, 1)]
    ios = [ReadIo(chain_id=1 + i % 2, chunk_id=ChunkId(71, 0, i), offset=off, length=n) for i, off, n in cases]

    def read(client: StorageClient) -> tuple[list[bytes], list[bytes], list[int]]:
        plain = client.batch_read(ios)
        assert all(r.error is None for r in plain), [r.error for r in plain if r.error]
        bufs = [bytearray(b"\xee" * (BIG + 100)) for _ in ios]
        into = client.batch_read(ios, into=[memoryview(b) for b in bufs])
        assert all(r.error is None for r in into), [r.error for r in into if r.error]
        return [bytes(r.data) for r in plain], [bytes(r.data) for r in into], [r.version for r in plain]

    got_local = await asyncio.to_thread(read, local)
    got_net = await asyncio.to_thread(read, net)
    want = [blobs[i][off:] if n < 0 else blobs[i][off:off + n] for i, off, n in cases]
    assert got_local[0] == want and got_local[1] == want
    assert got_local == got_net  # bytes (so CRCs) and versions identical
    assert [crc32c(b) for b in got_local[0]] == [crc32c(b) for b in got_net[0]]
    s = local.read_stats
    assert s.local_ios == 2 * len(ios) and s.network_ios == 0 and s.local_fallbacks == 0
    assert s.local_bytes == 2 * sum(len(w) for w in want)
    assert net.read_stats.local_ios == 0 and net.read_stats.network_ios >= 2 * len(ios) // 64
    # the nodes counted the descriptor batches they handed out
    routing = await cluster.routing()
    served = 0
    for i in range(3):
        reply = cluster.pool.call(cluster.node_address(routing, f"storage-{i}"), OP_SPACE, meta={})
        served += msgspec.convert(reply.meta, SpaceReply).local_served
    assert served >= 2


async def test_missing_and_empty_chunks_read_as_over_the_network(cluster: StorageCluster) -> None:
    client = cluster.data_client()
    routing = await cluster.routing()
    target = next(c for c in routing.chains if c.chain_id == 1).target_ids[0]
    await asyncio.to_thread(client.write, 1, ChunkId(72, 0, 1), 0, b"", CHUNK)
    missing, empty = ChunkId(72, 0, 0), ChunkId(72, 0, 1)
    for cid in (missing, empty):
        io = ReadIo(chain_id=1, chunk_id=cid)
        a = await asyncio.to_thread(_one, client, True, target, io)
        b = await asyncio.to_thread(_one, client, False, target, io)
        assert type(a.error) is type(b.error)
        assert (bytes(a.data), a.version) == (bytes(b.data), b.version)
        if cid == missing:
            assert isinstance(a.error, ChunkNotFound)  # reads as a hole (fs.batch)
        else:
            assert a.error is None and a.data == b"" and a.version >= 1
    assert client.read_stats.local_ios >= 1


async def test_a_flipped_bit_is_caught_on_the_local_path_served_elsewhere_and_reported(
        cluster: StorageCluster) -> None:
    client = cluster.data_client()
    cid = ChunkId(73, 0, 0)
    data = os.urandom(BIG - 5)
    await asyncio.to_thread(client.write, 1, cid, 0, data, BIG)
    routing = await cluster.routing()
    bad = next(c for c in routing.chains if c.chain_id == 1).target_ids[1]
    path = _chunk_file(cluster, routing, bad, cid)
    raw = bytearray(path.read_bytes())
    raw[BIG // 3] ^= 0x08
    path.write_bytes(raw)

    io = ReadIo(chain_id=1, chunk_id=cid, length=BIG)
    res = await asyncio.to_thread(_one, client, True, bad, io, memoryview(bytearray(BIG)))
    assert isinstance(res.error, ChunkCorrupted) and "CRC32C" in str(res.error)
    # the reader told the replica (over the network), which verified and marked its copy
    def marked() -> bool:
        reply = cluster.pool.call(cluster.node_address(routing, _node_of(routing, bad)), OP_SPACE, meta={})
        space = msgspec.convert(reply.meta, SpaceReply)
        return cid.hex in next(t.corrupted for t in space.targets if t.target == bad)

    await wait_for(lambda: asyncio.to_thread(marked), timeout_s=10.0, what="corruption confirmed by the replica")
    for _ in range(4):  # readers always get good bytes, still locally (from another replica)
        buf = bytearray(BIG)
        [r] = await asyncio.to_thread(client.batch_read, [io], [memoryview(buf)])
        assert r.error is None and bytes(r.data) == data and r.target != bad
    assert client.read_stats.network_ios == 0


async def test_a_gone_socket_falls_back_to_the_network_once_per_batch(cluster: StorageCluster) -> None:
    client = cluster.data_client()
    blobs = {i: os.urandom(CHUNK - i) for i in range(6)}
    for i, b in blobs.items():
        await asyncio.to_thread(client.write, 1 + i % 2, ChunkId(74, 0, i), 0, b, CHUNK)
    ios = [ReadIo(chain_id=1 + i % 2, chunk_id=ChunkId(74, 0, i)) for i in blobs]
    assert [bytes(r.data) for r in await asyncio.to_thread(client.batch_read, ios)] == list(blobs.values())
    assert client.read_stats.local_ios == len(ios)
    routing = await cluster.routing()
    saved = []
    for i in range(3):  # the sockets vanish (pooled connections stay open to the old servers' files)
        p = Path(_socket_of(routing, f"storage-{i}"))
        saved.append((p, p.with_suffix(".moved")))
        os.rename(p, saved[-1][1])
    fresh = cluster.data_client()
    res = await asyncio.to_thread(fresh.batch_read, ios)
    assert [r.error for r in res] == [None] * len(ios)
    assert [bytes(r.data) for r in res] == list(blobs.values())
    s = fresh.read_stats
    # every batch planned before the first refusal falls back (once); later ones go straight to the network
    assert s.local_ios == 0 and s.network_ios == len(ios) and 1 <= s.local_fallbacks <= len(ios)
    assert s.network_bytes == sum(len(b) for b in blobs.values())
    # a node whose socket did not connect is read over the network for a while: no retry per read
    await asyncio.to_thread(fresh.batch_read, ios)
    assert fresh.read_stats.local_fallbacks == s.local_fallbacks and fresh.read_stats.network_ios == 2 * len(ios)
    for p, moved in saved:
        os.rename(moved, p)
    fresh.avoid_s = 0.0
    fresh._local_off.clear()
    await asyncio.to_thread(fresh.batch_read, ios)
    assert fresh.read_stats.local_ios == len(ios)


async def test_a_restarted_node_is_read_locally_again_after_a_fallback(cluster: StorageCluster) -> None:
    client = cluster.data_client(retry_deadline_s=20.0)
    blobs = {i: os.urandom(5000 + i) for i in range(8)}
    for i, b in blobs.items():
        await asyncio.to_thread(client.write, 1 + i % 2, ChunkId(75, 0, i), 0, b, CHUNK)
    ios = [ReadIo(chain_id=1 + i % 2, chunk_id=ChunkId(75, 0, i)) for i in blobs]
    await asyncio.to_thread(client.batch_read, ios)  # connections to every node now pooled
    routing = await cluster.routing()
    victim = cluster.storage[2]
    victim.signal(signal.SIGKILL)  # its socket file stays behind: refused
    victim.wait(5.0)
    for _ in range(3):  # the dead pooled connection, then a refused reconnect: network, then others
        res = await asyncio.to_thread(client.batch_read, ios)
        assert [bytes(r.data) for r in res] == list(blobs.values())
    assert client.read_stats.local_fallbacks >= 1
    target = next(t.target_id for t in routing.targets if t.node_id == "storage-2")
    await cluster.wait_state(target, PublicState.OFFLINE, timeout_s=15.0)
    cluster.storage[2] = cluster.storage_proc(2).start()
    await cluster.storage[2].wait_healthy(30.0)
    await cluster.wait_all_serving(timeout_s=40.0)
    chain = next(c for c in routing.chains if target in c.target_ids)
    cid = next(ChunkId(75, 0, i) for i in blobs if 1 + i % 2 == chain.chain_id)
    client.refresh()
    client._local_off.clear()
    # the restarted node's new socket (same path) serves local reads again
    res = await asyncio.to_thread(_one, client, True, target, ReadIo(chain_id=chain.chain_id, chunk_id=cid))
    assert res.error is None and bytes(res.data) == blobs[cid.index]


async def test_the_setting_turns_local_reads_off(cluster: StorageCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FF_FS_LOCAL_READS", "0")
    off = cluster.data_client()
    assert off.local_reads is False
    monkeypatch.delenv("FF_FS_LOCAL_READS")
    on = cluster.data_client()
    assert on.local_reads is True
    await asyncio.to_thread(on.write, 1, ChunkId(76, 0, 0), 0, b"x" * 1000, CHUNK)
    for c in (off, on):
        assert await asyncio.to_thread(c.read, 1, ChunkId(76, 0, 0)) == b"x" * 1000
    assert (off.read_stats.local_ios, off.read_stats.network_ios) == (0, 1)
    assert (on.read_stats.local_ios, on.read_stats.network_ios) == (1, 0)


async def test_a_request_without_a_valid_token_gets_no_descriptors(cluster: StorageCluster) -> None:
    client = cluster.data_client()
    await asyncio.to_thread(client.write, 1, ChunkId(77, 0, 0), 0, b"secret" * 100, CHUNK)
    routing = await cluster.routing()
    chain = next(c for c in routing.chains if c.chain_id == 1)
    target = chain.target_ids[0]
    path = _socket_of(routing, _node_of(routing, target))
    msg = ReadMsg(target=target, req=ReadReq(chain_id=1, chain_ver=chain.version, chunk_id=ChunkId(77, 0, 0)))
    for token in ("not-a-token", ""):
        rogue = LocalReadClient(token, timeout_s=2.0)
        try:
            reply, fds = await asyncio.to_thread(rogue.open, path, [msg])
        finally:
            rogue.close()
        assert fds == [] and reply.results == []
        assert isinstance(error_from_dict(reply.error or {}), Unauthenticated)
    good = LocalReadClient(cluster.user, timeout_s=2.0)
    try:
        # a valid token without meta's capability for the chunk gets nothing either
        reply, fds = await asyncio.to_thread(good.open, path, [msg])
        assert fds == [] and reply.results == []
        assert error_from_dict(reply.error or {}).fields["reason"] == "missing"
        caps = [cluster.grants().get(77, READ)]
        reply, fds = await asyncio.to_thread(good.open, path, [msg], caps)
        assert reply.error is None and len(fds) == 1
        assert os.pread(fds[0], 6, 0) == b"secret"
        for fd in fds:
            os.close(fd)
    finally:
        good.close()
    # a client with a bad token reads nothing by either path
    bad = StorageClient(cluster.routing_src.get, token="not-a-token", request_timeout_s=1.0,  # type: ignore[union-attr]
                        retry_deadline_s=1.0)
    try:
        [r] = await asyncio.to_thread(bad.batch_read, [ReadIo(chain_id=1, chunk_id=ChunkId(77, 0, 0))])
        assert isinstance(r.error, Unauthenticated) and r.data == b""
    finally:
        bad.close()


async def test_pending_chunks_answer_as_over_the_network(cluster: StorageCluster) -> None:
    """A write held up by a stopped tail leaves a pending version at the head: NotCommitted on
    both paths, and the same uncommitted bytes for a relaxed read."""
    client = cluster.data_client(retry_deadline_s=30.0)
    cid = ChunkId(78, 0, 0)
    old = os.urandom(3000)
    await asyncio.to_thread(client.write, 1, cid, 0, old, CHUNK)
    routing = await cluster.routing()
    chain = next(c for c in routing.chains if c.chain_id == 1)
    head, tail = chain.target_ids[0], chain.target_ids[-1]
    victim = cluster.storage[int(_node_of(routing, tail).rsplit("-", 1)[1])]
    new = os.urandom(3000)
    victim.signal(signal.SIGSTOP)
    writer = threading.Thread(target=lambda: client.write(1, cid, 0, new, CHUNK), daemon=True)
    try:
        writer.start()
        strict = ReadIo(chain_id=1, chunk_id=cid)
        relaxed = ReadIo(chain_id=1, chunk_id=cid, relaxed=True)

        def pending() -> bool:
            return isinstance(_one(client, False, head, strict).error, NotCommitted)

        await wait_for(lambda: asyncio.to_thread(pending), timeout_s=5.0, interval_s=0.01, what="a pending version")
        a, b = await asyncio.gather(asyncio.to_thread(_one, client, True, head, strict),
                                    asyncio.to_thread(_one, client, False, head, strict))
        assert isinstance(a.error, NotCommitted) and isinstance(b.error, NotCommitted)
        a = await asyncio.to_thread(_one, client, True, head, relaxed)
        b = await asyncio.to_thread(_one, client, False, head, relaxed)
        assert a.error is None and b.error is None, (a.error, b.error)
        assert a.uncommitted and b.uncommitted and bytes(a.data) == bytes(b.data) == new
        assert a.version == b.version
    finally:
        victim.signal(signal.SIGCONT)
    await asyncio.to_thread(writer.join, 30.0)
    await cluster.wait_all_serving(timeout_s=30.0)
    client.refresh()
    assert await asyncio.to_thread(client.read, 1, cid) == new


async def test_not_serving_targets_are_refused_on_the_local_path(cluster: StorageCluster) -> None:
    client = cluster.data_client()
    await asyncio.to_thread(client.write, 2, ChunkId(79, 0, 0), 0, b"abc", CHUNK)
    routing = await cluster.routing()
    chain = next(c for c in routing.chains if c.chain_id == 2)
    other = next(c for c in routing.chains if c.chain_id == 1).target_ids[0]
    # a target of another chain: refused exactly as over the network
    io = ReadIo(chain_id=2, chunk_id=ChunkId(79, 0, 0))
    a = await asyncio.to_thread(_one, client, True, other, io)
    b = await asyncio.to_thread(_one, client, False, other, io)
    assert a.error is not None and type(a.error) is type(b.error)
    assert chain.state_of(chain.target_ids[0]) is PublicState.SERVING


def test_long_socket_paths_are_bound_and_reached_through_the_directory(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    path = deep / "local.sock"
    assert len(str(path)) > 108
    server = bind_unix(path, 0o600)
    try:
        assert path.exists() and (path.stat().st_mode & 0o777) == 0o600
        client = LocalReadClient("t", timeout_s=1.0)
        sock, _ = client._take(str(path))
        conn, _ = server.accept()
        conn.close()
        sock.close()
        client.close()
    finally:
        server.close()


def test_a_live_socket_is_not_taken_over_and_a_stale_one_is_replaced(tmp_path: Path) -> None:
    from fireflyer.core.errors import FailedPrecondition

    path = tmp_path / "local.sock"
    first = bind_unix(path, 0o666)
    try:
        with pytest.raises(FailedPrecondition):
            bind_unix(path, 0o666)
    finally:
        first.close()
    assert path.exists()  # left behind, as by a killed node: stale
    second = bind_unix(path, 0o660)
    second.close()
    assert (path.stat().st_mode & 0o777) == 0o660
