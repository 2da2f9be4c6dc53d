"""A storage node against hostile data-plane peers (issue 48, point 6), over raw sockets speaking
the framed protocol as the probe did: idle unauthenticated connections cost no thread, one user's
connections are capped, a write header that announces 64 MiB and sends nothing allocates nothing
and is dropped at the frame deadline, a truncated frame does not wait out an idle timeout."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest
from stor_svc_harness import StorageCluster, new_cluster

from fireflyer.storage import ChunkId, WriteReq
from fireflyer.storage.protocol import OP_WRITE, WriteMsg, to_meta
from fireflyer.testing.poll import wait_until
from fireflyer.wire.frame import (
    PREFIX,
    ErrorFrame,
    FrameLimits,
    Hello,
    Request,
    Welcome,
    decode_header,
    encode_head,
    parse_prefix,
)

MiB = 1 << 20


@pytest.fixture
async def hostile_cluster(tmp_path: Path, nats_server):
    c = new_cluster(tmp_path, nats_server.url)
    try:
        await c.start(FF_STORAGE_WIRE_MAX_CONNECTIONS_PER_USER="4", FF_STORAGE_WIRE_FRAME_TIMEOUT_S="0.5",
                      FF_STORAGE_WIRE_HANDSHAKE_TIMEOUT_S="60", FF_STORAGE_MAX_CHUNK_SIZE=str(64 * MiB))
        yield c
    except BaseException:
        for p in [c.mgmtd, *c.storage]:
            if p is not None:
                print(f"---- {p.instance} ({p.state()}) log ----\n{p.log()[-6000:]}")
        raise
    finally:
        await c.close()


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def _read_frame(sock: socket.socket):
    buf = b""
    while len(buf) < PREFIX.size:
        got = sock.recv(PREFIX.size - len(buf))
        if not got:
            raise EOFError("closed")
        buf += got
    hlen, plen = parse_prefix(buf, FrameLimits())
    body = b""
    while len(body) < hlen + plen:
        got = sock.recv(hlen + plen - len(body))
        if not got:
            raise EOFError("closed")
        body += got
    return decode_header(body[:hlen])


def _hello(addr: tuple[str, int], token: str) -> tuple[socket.socket, object]:
    s = socket.create_connection(addr, timeout=5)
    s.sendall(encode_head(Hello(token=token, client="probe"), 0))
    return s, _read_frame(s)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    t0 = time.monotonic()
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return time.monotonic() - t0 < seconds


async def test_storage_node_survives_hostile_connections(hostile_cluster: StorageCluster) -> None:
    c = hostile_cluster
    routing = await c.routing()
    addr = c.node_address(routing, "storage-0")
    proc = next(p for p in c.storage if p.instance == "storage-0")

    def probe() -> None:
        # 1. 400 idle unauthenticated connections: the probe saw 436 threads
        before = _threads(proc.pid)
        idle = [socket.create_connection(addr, timeout=5) for _ in range(400)]
        try:
            # the node accepts in order: once a later connection is welcomed, these were all accepted
            last, h = _hello(addr, c.user)
            idle.append(last)
            assert isinstance(h, Welcome), h
            assert _threads(proc.pid) - before < 10
        finally:
            for s in idle:
                s.close()

        # 2. one user's connections are capped (4 here), with a clear error frame
        mine = []
        try:
            for _ in range(4):
                s, h = _hello(addr, c.user)
                mine.append(s)
                assert isinstance(h, Welcome), h
            s, h = _hello(addr, c.user)
            mine.append(s)
            assert isinstance(h, ErrorFrame) and h.error["fields"]["reason"] == "user_limit", h
        finally:
            for s in mine:
                s.close()

        # 3. a write header announcing 64 MiB, then nothing: dropped at the frame deadline
        def welcomed() -> socket.socket | None:  # closed connections leave the count as the node notices
            sock, head = _hello(addr, c.user)
            if isinstance(head, Welcome):
                return sock
            sock.close()
            return None

        s = wait_until(welcomed, timeout_s=10, what="a connection under the user cap again")
        chain = next(ch for ch in routing.chains if ch.chain_id == 1)
        req = WriteReq(chain_id=1, chain_ver=chain.version, chunk_id=ChunkId(77, 0, 0), offset=0, length=64 * MiB,
                       chunk_size=64 * MiB, payload_crc=0, client_id="probe", channel=1, seq=1)
        s.sendall(encode_head(Request(rid=1, op=OP_WRITE, meta=to_meta(WriteMsg(target=chain.head, req=req))),
                              64 * MiB))
        assert _closed_within(s, 5.0)  # the probe: 31 s holding 64 MiB
        s.close()

        # 4. a truncated frame: dropped at the frame deadline, not an idle timeout
        s, h = _hello(addr, c.user)
        assert isinstance(h, Welcome), h
        s.sendall(bytes(encode_head(Request(rid=1, op=OP_WRITE), 0))[:PREFIX.size + 1])
        assert _closed_within(s, 3.0)
        s.close()

    await asyncio.to_thread(probe)
    assert proc.returncode is None  # the node still runs
