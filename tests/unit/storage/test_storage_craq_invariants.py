"""Random runs of writes, reads, failures (detected at once, during retries, or not at all),
lost acks, corrupted payloads and recoveries, checking the invariants of 3FS's P model
(specs/DataStorage, research/3fs.md §5) after every step:

- WriteComplete: an acked write is on every non-offline replica (committed, same content);
- MonotoneIncreasingVersionNumber: no replica's committed version of a chunk ever drops;
- AllReplicasOnChainUpdated: after a chain change settles, serving replicas agree.

Clients retry a failed request with the same (client, channel, seq) after mgmtd has
caught up with the failures, as the 3FS client does; the model applies each write once.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from storage_harness import CHAIN, Cluster

from fireflyer.core.errors import Unavailable
from fireflyer.mgmt.model import PublicState
from fireflyer.storage import (
    ChainVersionMismatch,
    ChunkId,
    NotCommitted,
    NotHead,
    ReadReq,
    UpdateReq,
    choose_read_target,
    crc32c,
)

CHUNKS = [ChunkId(9, 0, i) for i in range(3)]


def settle(cl: Cluster) -> None:
    """mgmtd catches up: every down target still in the write path goes offline."""
    stale = [t for t in cl.down if cl.chain.state_of(t) is not PublicState.OFFLINE]
    if stale:
        cl.set_states({t: PublicState.OFFLINE for t in stale})


def check(cl: Cluster, model: dict[ChunkId, bytes], seen: dict[tuple[int, ChunkId], int]) -> None:
    for cid, content in model.items():
        versions = set()
        for t in cl.serving():
            m = cl.stores[t].meta(cid)
            assert m is not None and not m.pending, (t, cid, m)
            assert cl.stores[t].read(cid) == content, (t, cid)  # WriteComplete
            versions.add((m.committed_ver, m.crc))
        assert len(versions) == 1, versions  # AllReplicasOnChainUpdated
    for t, store in cl.stores.items():  # MonotoneIncreasingVersionNumber, offline ones included
        for m in store.all_meta():
            key = (t, m.chunk_id)
            assert m.committed_ver >= seen.get(key, 0), (key, m.committed_ver, seen.get(key))
            seen[key] = m.committed_ver


@pytest.mark.parametrize("seed", range(12))
def test_random_runs_keep_p_spec_invariants(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    n = 3 + seed % 2
    cl = Cluster(tmp_path, n)
    model: dict[ChunkId, bytes] = {}
    seen: dict[tuple[int, ChunkId], int] = {}
    fault_state: dict[str, object] = {}

    def fault(target: int, req: UpdateReq, data: bytes) -> bytes | None:
        kind = fault_state.get("kind")
        if kind == "die" and target == fault_state["target"]:
            cl.down.add(target)  # dies mid-write; detected after `detect` retries (or never)
            fault_state.clear()
        elif kind == "lose_ack" and target not in cl.down:
            fault_state.clear()
            cl.replicas[target].handle_update(req, data)
            raise Unavailable("ack lost")
        elif kind == "corrupt":
            fault_state.clear()
            return data[:-1] + bytes([data[-1] ^ 0x40]) if data else None
        return None

    def on_sleep(_: float) -> None:
        detect = fault_state.get("detect_after")
        if isinstance(detect, int):
            if detect <= 1:
                fault_state.pop("detect_after")
                settle(cl)
            else:
                fault_state["detect_after"] = detect - 1

    cl.fault = fault
    cl.on_sleep = on_sleep
    seq = 0
    tally = {"dup": 0, "retry": 0, "fail": 0, "recover": 0}
    for _step in range(60):
        op = rng.random()
        serving = cl.serving()
        down = sorted(cl.down)
        if op < 0.55:
            cid = rng.choice(CHUNKS)
            off = rng.randrange(0, 3000)
            data = rng.randbytes(rng.randrange(1, 1000))
            if rng.random() < 0.3 and len(serving) > 1:
                victim = rng.choice([t for t in serving if t != cl.head])
                fault_state.update(kind="die", target=victim, detect_after=rng.choice([1, 2, 99]))
            elif rng.random() < 0.15:
                fault_state.update(kind=rng.choice(["lose_ack", "corrupt"]))
            seq += 1
            for _attempt in range(10):
                try:
                    ack = cl.write(cid, off, data, client="cl", channel=1, seq=seq)
                    tally["dup"] += ack.duplicate
                    break
                except (Unavailable, NotHead, ChainVersionMismatch):
                    tally["retry"] += 1
                    fault_state.pop("detect_after", None)
                    settle(cl)
            else:
                raise AssertionError("write never completed")
            fault_state.clear()
            base = bytearray(model.get(cid, b""))
            base.extend(b"\0" * max(0, off + len(data) - len(base)))
            base[off : off + len(data)] = data
            model[cid] = bytes(base)
            assert ack.crc == crc32c(base)
        elif op < 0.75 and model:
            cid = rng.choice(sorted(model))
            t = choose_read_target(cl.chain, rng)
            reply, got = cl.replicas[t].handle_read(
                ReadReq(chain_id=CHAIN, chain_ver=cl.chain.version, chunk_id=cid)
            )
            assert got == model[cid] and reply.crc == crc32c(got)
        elif op < 0.87 and len(serving) > 1:
            victim = rng.choice(serving)
            cl.down.add(victim)
            cl.fail(victim)
            tally["fail"] += 1
        elif down:
            cl.recover(rng.choice(down))
            tally["recover"] += 1
        check(cl, model, seen)
    for t in sorted(cl.down):
        cl.recover(t)
    check(cl, model, seen)
    # the head survives these write faults, so every retried request was answered from the
    # dedupe cache after its in-doubt version committed: applied exactly once
    assert tally["dup"] == tally["retry"]
    assert set(cl.serving()) == set(range(1, n + 1))
    cl.close()


def test_concurrent_clients_and_readers(tmp_path: Path) -> None:
    """Threads write shared chunks through the head while readers hit every replica: each
    read returns exactly the content some acked version had, or NOT_COMMITTED."""
    cl = Cluster(tmp_path, 3)
    acked: dict[tuple[ChunkId, int], int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = {"ok": 0, "pending": 0}

    def writer(w: int) -> None:
        rng = random.Random(w)
        try:
            for s in range(40):
                cid = rng.choice(CHUNKS)
                ack = cl.write(
                    cid, rng.randrange(2000), rng.randbytes(rng.randrange(1, 500)), client=f"w{w}", seq=s
                )
                with lock:
                    acked[(cid, ack.commit_ver)] = ack.crc
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def reader(r: int) -> None:
        rng = random.Random(100 + r)
        while not stop.is_set():
            cid, t = rng.choice(CHUNKS), rng.choice([1, 2, 3])
            try:
                reply, _data = cl.replicas[t].handle_read(ReadReq(chain_id=CHAIN, chain_ver=1, chunk_id=cid))
            except NotCommitted:
                reads["pending"] += 1
                continue
            except Exception as e:  # noqa: BLE001
                if type(e).__name__ == "ChunkNotFound":
                    continue
                errors.append(e)
                return
            reads["ok"] += 1
            with lock:  # a reader may see a version before its writer recorded the ack
                want = acked.get((cid, reply.version))
            if want is not None and want != reply.crc:
                errors.append(AssertionError(f"read {cid} v{reply.version} crc {reply.crc} != acked {want}"))

    ws = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    rs = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for th in ws + rs:
        th.start()
    for th in ws:
        th.join(30)
    stop.set()
    for th in rs:
        th.join(30)
    assert errors == []
    assert reads["ok"] > 0
    for cid in CHUNKS:
        metas = {(cl.stores[t].meta(cid).committed_ver, cl.stores[t].meta(cid).crc) for t in (1, 2, 3)}  # type: ignore[union-attr]
        assert len(metas) == 1
        [(ver, crc)] = metas
        assert acked[(cid, ver)] == crc
    # versions are dense: every committed version of a chunk was acked exactly once
    for cid in CHUNKS:
        vers = sorted(v for c, v in acked if c == cid)
        assert vers == list(range(1, len(vers) + 1))
    cl.close()
