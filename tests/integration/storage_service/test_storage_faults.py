"""Injected faults against real processes: kill -9, SIGSTOP, a flipped bit."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from stor_svc_harness import CHUNK, StorageCluster, new_cluster

from fireflyer.core.errors import FireFlyerError
from fireflyer.mgmt.model import PublicState
from fireflyer.storage import ChunkCorrupted, ChunkId, crc32c
from fireflyer.storage.errors import ChainVersionMismatch
from fireflyer.storage.protocol import ChunkCorruptedEvent, corrupted_subject
from fireflyer.testing.poll import wait_for


def _node_of(routing, target: int) -> str:
    return next(t.node_id for t in routing.targets if t.target_id == target)


async def _check_every_replica(cluster: StorageCluster, acked: dict[ChunkId, tuple[int, int]]) -> None:
    """Every acknowledged write reads back, with its checksum, from every serving replica."""
    routing = await cluster.wait_all_serving(timeout_s=20.0)
    for cid, (chain_id, crc) in acked.items():
        chain = next(c for c in routing.chains if c.chain_id == chain_id)
        for t in chain.target_ids:
            _, data = await _read_when_current(cluster, routing, chain_id, t, cid)
            assert crc32c(data) == crc, f"chunk {cid} on target {t} is stale or wrong"


async def _read_when_current(cluster: StorageCluster, routing, chain_id: int, target: int, cid: ChunkId,
                             timeout_s: float = 10.0):
    """Read one replica with the manager's routing; a target may learn that routing version a
    moment after the manager reports it (ChainVersionMismatch: it is behind), so retry until then."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await asyncio.to_thread(cluster.read_target, routing, chain_id, target, cid)
        except ChainVersionMismatch:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_kill_middle_target_during_writes_then_resync(cluster: StorageCluster) -> None:
    client = cluster.data_client(retry_deadline_s=20.0)
    routing = await cluster.routing()
    chain1 = next(c for c in routing.chains if c.chain_id == 1)
    middle = chain1.target_ids[1]
    victim_i = int(_node_of(routing, middle).rsplit("-", 1)[1])
    acked: dict[ChunkId, tuple[int, int]] = {}
    errors: list[BaseException] = []
    stop = threading.Event()
    count = [0]

    def writer() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            cid = ChunkId(40, 0, n % 24)  # rewrites too: the last acked content must win
            chain_id = 1 + n % 2
            data = os.urandom(1000 + n % 3000)
            try:
                client.write(chain_id, cid, 0, data, CHUNK)
            except FireFlyerError as e:
                errors.append(e)
                return
            acked[cid] = (chain_id, crc32c(data))
            count[0] = n

    th = threading.Thread(target=writer, daemon=True)
    th.start()
    await wait_for(lambda: count[0] >= 30, timeout_s=10.0, what="writes flowing")
    cluster.storage[victim_i].signal(signal.SIGKILL)
    cluster.storage[victim_i].wait(5.0)
    await cluster.wait_state(middle, PublicState.OFFLINE, timeout_s=10.0)
    before = count[0]
    await wait_for(lambda: count[0] >= before + 30, timeout_s=10.0, what="writes continue without the target")
    cluster.storage[victim_i] = cluster.storage_proc(victim_i).start()
    await cluster.wait_all_serving(timeout_s=25.0)  # resynced and serving again, writes still flowing
    later = count[0]
    await wait_for(lambda: count[0] >= later + 20, timeout_s=10.0, what="writes after the resync")
    stop.set()
    th.join(20.0)
    assert not errors, errors
    await _check_every_replica(cluster, acked)
    # the returning target went through a resync.  How many chunks it had to send depends on
    # timing: writes that reach a SYNCING successor are full-chunk replaces, so under a fast
    # writer they may already have refreshed every chunk before the diff runs.
    done = [json.loads(line) for p in cluster.storage for line in p.log().splitlines()
            if '"event":"storage.resync_done"' in line]
    assert done, "no resync ran for the returning target"


async def test_sigstop_reads_fail_over_within_timeout(cluster: StorageCluster) -> None:
    timeout = 0.5
    client = cluster.data_client(request_timeout_s=timeout, connect_timeout_s=timeout)
    blobs = {i: os.urandom(2000 + i) for i in range(12)}
    for i, b in blobs.items():
        await asyncio.to_thread(client.write, 1 + i % 2, ChunkId(50, 0, i), 0, b, CHUNK)
    victim = cluster.storage[2]
    victim.signal(signal.SIGSTOP)
    try:
        worst = 0.0
        for _ in range(2):
            for i, b in blobs.items():
                t0 = time.monotonic()
                got = await asyncio.to_thread(client.read, 1 + i % 2, ChunkId(50, 0, i))
                worst = max(worst, time.monotonic() - t0)
                assert got == b
        # one timed-out request (connect or read) plus a back-off, never the fail interval
        assert worst < 2 * timeout + 0.6, worst
        routing = await cluster.routing()
        t = next(t.target_id for t in routing.targets if t.node_id == "storage-2")
        await cluster.wait_state(t, PublicState.OFFLINE, timeout_s=10.0)
        # a write while it is stopped lands on the others
        await asyncio.to_thread(client.write, 1, ChunkId(50, 0, 0), 0, b"new" * 100, CHUNK)
    finally:
        victim.signal(signal.SIGCONT)
    # it wakes fenced, rejoins through a resync, and serves the new data (no stale read)
    want = b"new" * 100 + blobs[0][300:]  # a positional write over the first 300 bytes
    await _check_every_replica(cluster, {ChunkId(50, 0, 0): (1, crc32c(want))})


async def test_flipped_bit_is_detected_served_elsewhere_and_reported(cluster: StorageCluster, bus) -> None:
    client = cluster.data_client()
    cid = ChunkId(60, 0, 0)
    data = os.urandom(30000)
    await asyncio.to_thread(client.write, 1, cid, 0, data, CHUNK)
    routing = await cluster.routing()
    chain = next(c for c in routing.chains if c.chain_id == 1)
    bad = chain.target_ids[1]
    events: list[ChunkCorruptedEvent] = []

    async def on_event(ev: ChunkCorruptedEvent, msg: object) -> None:
        events.append(ev)

    await bus.subscribe(corrupted_subject(None), on_event, types=ChunkCorruptedEvent)
    tdir = cluster.tmp / "storage" / _node_of(routing, bad) / str(bad) / "chunks"

    def flip_bit() -> None:
        files = [p for p in tdir.rglob("*") if p.is_file() and cid.hex in p.name]
        assert len(files) == 1
        raw = bytearray(files[0].read_bytes())
        raw[12345] ^= 0x10
        Path(files[0]).write_bytes(raw)

    await asyncio.to_thread(flip_bit)

    with pytest.raises(ChunkCorrupted):  # that replica detects it
        await asyncio.to_thread(cluster.read_target, routing, 1, bad, cid)
    for _ in range(6):  # the client always gets good data (from another replica)
        assert await asyncio.to_thread(client.read, 1, cid) == data
    await wait_for(lambda: events, timeout_s=5.0, what="corruption reported on NATS")
    assert (events[0].target, events[0].chunk) == (bad, cid.hex)
    # repair: the target is taken out of service, resynced, and serves the right bytes again
    await _check_every_replica(cluster, {cid: (1, crc32c(data))})


async def test_a_clean_stop_takes_targets_out_at_once_and_the_restart_rejoins_without_waiting(
        tmp_path: Path, nats_server) -> None:
    """SIGTERM: the node reports its targets offline on the way out, so mgmtd takes them out of
    their chains at once -- with a 60 s heartbeat fail interval, nothing else could within the
    test's deadlines -- and the restarted node rejoins (resync, serving) without waiting out that
    interval for mgmtd to forget its old self (``ff down`` then ``ff up`` used to stall 3FS
    writes for the local cluster's ~25 s)."""
    cluster = new_cluster(tmp_path, nats_server.url)
    try:
        await cluster.start(mgmtd_env={"FF_MGMTD_HEARTBEAT_FAIL_INTERVAL_S": "60"})
        client = cluster.data_client(retry_deadline_s=20.0)
        acked = {}
        for n in range(12):
            cid, data = ChunkId(41, 0, n), os.urandom(2000 + n)
            client.write(1 + n % 2, cid, 0, data, CHUNK)
            acked[cid] = (1 + n % 2, crc32c(data))
        cluster.storage[0].signal(signal.SIGTERM)
        assert cluster.storage[0].wait(10.0) == 0
        assert '"event":"storage.left"' in cluster.storage[0].log()
        for t in (101, 102):  # storage-0's targets
            await cluster.wait_state(t, PublicState.OFFLINE, timeout_s=10.0)
        for n in range(12, 18):  # the other two replicas take writes meanwhile
            cid, data = ChunkId(41, 0, n), os.urandom(3000 + n)
            client.write(1 + n % 2, cid, 0, data, CHUNK)
            acked[cid] = (1 + n % 2, crc32c(data))
        cluster.storage[0] = cluster.storage_proc(0).start()
        await cluster.wait_all_serving(timeout_s=25.0)
        assert '"event":"storage.join_waiting"' not in cluster.storage[0].log()
        await _check_every_replica(cluster, acked)
    finally:
        await cluster.close()
