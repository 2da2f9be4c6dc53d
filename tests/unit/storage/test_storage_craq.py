"""CRAQ replicas wired by direct calls: replication, commit order, NOT_COMMITTED, chain
versions, head-only writes, dedupe, failover during forwarding, checksum divergence."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from storage_harness import CHAIN, Cluster

from fireflyer.core.errors import Unavailable
from fireflyer.mgmt.model import PublicState
from fireflyer.storage import (
    ChainVersionMismatch,
    ChecksumMismatch,
    ChunkId,
    NotCommitted,
    NotHead,
    NotServing,
    ReadReq,
    StaleUpdate,
    UpdateKind,
    UpdateReq,
    WriteReq,
    choose_read_target,
    crc32c,
)

C = ChunkId(100, 0, 0)


@pytest.fixture
def make(tmp_path: Path) -> Iterator:
    made: list[Cluster] = []

    def build(n: int, **kw) -> Cluster:
        c = Cluster(tmp_path / f"c{len(made)}", n, **kw)
        made.append(c)
        return c

    yield build
    for c in made:
        c.close()


def contents(cl: Cluster, cid: ChunkId, targets=None) -> dict[int, tuple[int, bytes]]:
    out = {}
    for t in targets or cl.serving():
        m = cl.stores[t].meta(cid)
        assert m is not None and not m.pending
        out[t] = (m.committed_ver, cl.stores[t].read(cid))
    return out


@pytest.mark.parametrize("n", [1, 2, 3])
def test_writes_commit_on_every_replica(make, n: int) -> None:
    cl = make(n)
    model = bytearray()
    rng = random.Random(n)
    for v in range(1, 21):
        off = rng.randrange(0, 2000)
        data = rng.randbytes(rng.randrange(1, 2000))
        ack = cl.write(C, off, data)
        model.extend(b"\0" * max(0, off + len(data) - len(model)))
        model[off : off + len(data)] = data
        assert (ack.commit_ver, ack.length, ack.crc, ack.chain_ver) == (v, len(model), crc32c(model), 1)
        assert set(contents(cl, C).values()) == {(v, bytes(model))}
        for t in cl.serving():
            assert cl.read(t, C, offset=off, length=len(data)) == data


def test_tail_commits_first(make) -> None:
    cl = make(3)
    cl.write(C, 0, b"x")
    cl.write(ChunkId(100, 0, 1), 0, b"y")
    assert [t for t, _ in cl.commits] == [3, 2, 1, 3, 2, 1]


def test_pending_write_reads_not_committed_and_relaxed(make) -> None:
    cl = make(3)
    cl.write(C, 0, b"old")
    entered, release = threading.Event(), threading.Event()

    def block(target: int, req: UpdateReq, data: bytes) -> None:
        if target == 3:  # hold the update between the middle and the tail
            entered.set()
            assert release.wait(10)

    cl.fault = block
    result: list = []
    th = threading.Thread(target=lambda: result.append(cl.write(C, 0, b"NEW")))
    th.start()
    assert entered.wait(10)
    for t in (1, 2):  # head and middle hold the pending version
        with pytest.raises(NotCommitted):
            cl.read(t, C)
        assert cl.read(t, C, relaxed=True) == b"NEW"
        reply, _ = cl.replicas[t].handle_read(ReadReq(chain_id=CHAIN, chain_ver=1, chunk_id=C, relaxed=True))
        assert reply.uncommitted and reply.version == 2
    assert cl.read(3, C) == b"old"  # the tail has not seen it: still the committed value
    release.set()
    th.join(10)
    assert result[0].commit_ver == 2
    assert {t: cl.read(t, C) for t in (1, 2, 3)} == {1: b"NEW", 2: b"NEW", 3: b"NEW"}


def test_chain_version_mismatch_and_non_head(make) -> None:
    cl = make(3)
    with pytest.raises(ChainVersionMismatch) as ei:
        cl.write(C, 0, b"x", chain_ver=0)
    assert (ei.value.fields["expected"], ei.value.fields["got"], ei.value.fields["chain"]) == (1, 0, CHAIN)
    for t in (2, 3):
        with pytest.raises(NotHead) as nh:
            cl.write(C, 0, b"x", target=t)
        assert nh.value.fields["head"] == 1
    with pytest.raises(ChecksumMismatch):
        cl.replicas[1].handle_write(cl.write_req(C, 0, b"abc"), b"abd")
    assert cl.stores[1].meta(C) is None  # nothing was applied anywhere
    with pytest.raises(ChainVersionMismatch):
        cl.replicas[2].handle_read(ReadReq(chain_id=CHAIN, chain_ver=9, chunk_id=C))


def test_duplicate_requests_apply_once(make) -> None:
    cl = make(2)
    first = cl.write(C, 0, b"AAAA", client="c1", channel=1, seq=1)
    cl.write(C, 0, b"BB", client="c2", channel=1, seq=1)  # another client's write in between
    again = cl.write(C, 0, b"AAAA", client="c1", channel=1, seq=1)  # c1 retries its request
    assert again.duplicate and msgspec.structs.replace(again, duplicate=False) == first
    assert contents(cl, C) == {1: (2, b"BBAA"), 2: (2, b"BBAA")}  # applied once: B is not overwritten
    cl.write(C, 0, b"C", client="c1", channel=1, seq=2)
    with pytest.raises(StaleUpdate):
        cl.write(C, 0, b"AAAA", client="c1", channel=1, seq=1)
    cl.write(C, 0, b"D", client="c1", channel=2, seq=1)  # channels are independent
    assert contents(cl, C)[2] == (4, b"DBAA")


def test_concurrent_duplicate_waits_for_the_first(make) -> None:
    cl = make(2)
    entered, release = threading.Event(), threading.Event()

    def block(target: int, req: UpdateReq, data: bytes) -> None:
        entered.set()
        assert release.wait(10)

    cl.fault = block
    acks: list = []
    ths = [threading.Thread(target=lambda: acks.append(cl.write(C, 0, b"once", seq=7))) for _ in range(2)]
    ths[0].start()
    assert entered.wait(10)
    ths[1].start()
    release.set()
    for th in ths:
        th.join(10)
    assert sorted(a.duplicate for a in acks) == [False, True] and {a.commit_ver for a in acks} == {1}


def test_successor_failure_retry_then_chain_update(make) -> None:
    """B dies mid-write; A retries with backoff; mgmtd moves B to the end as offline and
    bumps the version; A forwards to C, which completes the write (3FS §3)."""
    cl = make(3)
    cl.write(C, 0, b"before")
    cl.down.add(2)
    cl.on_sleep = lambda s: cl.fail(2) if len(cl.sleeps) == 2 else None
    ack = cl.write(C, 0, b"AFTER!")
    assert cl.sleeps[:2] == [0.0, 0.0] and len(cl.sleeps) == 2
    assert ack.commit_ver == 2 and ack.chain_ver == 2
    assert cl.chain.target_ids == (1, 3, 2) and cl.chain.state_of(2) is PublicState.OFFLINE
    assert contents(cl, C) == {1: (2, b"AFTER!"), 3: (2, b"AFTER!")}
    assert cl.stores[3].meta(C).chain_ver == 2  # type: ignore[union-attr]
    m2 = cl.stores[2].meta(C)
    assert m2 is not None and m2.committed_ver == 1  # the offline replica missed it ...
    cl.recover(2)  # ... until resync
    assert contents(cl, C) == {1: (2, b"AFTER!"), 3: (2, b"AFTER!"), 2: (2, b"AFTER!")}


def test_backoff_is_exponential_and_bounded(make) -> None:
    from fireflyer.storage import RetryPolicy

    cl = make(2, retry=RetryPolicy(max_attempts=5, base_delay_s=0.1, max_delay_s=0.3))
    cl.down.add(2)
    with pytest.raises(Unavailable) as ei:
        cl.write(C, 0, b"x", seq=1)
    assert cl.sleeps == [0.1, 0.2, 0.3, 0.3] and ei.value.fields["attempts"] == 5
    assert cl.replicas[1].in_doubt() == [C]
    with pytest.raises(NotCommitted):
        cl.read(1, C)
    # the successor returns: the client's retry commits the in-doubt version once
    cl.down.discard(2)
    ack = cl.write(C, 0, b"x", seq=1)
    assert ack.duplicate and ack.commit_ver == 1 and cl.replicas[1].in_doubt() == []
    assert contents(cl, C) == {1: (1, b"x"), 2: (1, b"x")}


def test_in_doubt_version_committed_before_next_write(make) -> None:
    """Forwarding gave up after the tail committed (the ack was lost): the head re-forwards
    the same content; the tail treats it as already applied; the next write follows."""
    cl = make(2)
    lost = {"n": 0}

    def lose_ack(target: int, req: UpdateReq, data: bytes) -> None:
        if lost["n"] < 5:
            lost["n"] += 1
            if lost["n"] == 1:
                cl.replicas[2].handle_update(req, data)  # applied and committed at the tail ...
            raise Unavailable("ack lost")  # ... but the head never hears of it

    cl.fault = lose_ack
    with pytest.raises(Unavailable):
        cl.write(C, 0, b"first")
    assert cl.stores[2].meta(C).committed_ver == 1 and cl.stores[1].meta(C).pending  # type: ignore[union-attr]
    cl.fault = None
    assert cl.write(C, 5, b"+second").commit_ver == 2
    assert contents(cl, C) == {1: (2, b"first+second"), 2: (2, b"first+second")}
    assert cl.replicas[1].resolve_pending(CHAIN, C) is False


def test_successor_checksum_mismatch_is_detected(make) -> None:
    cl = make(3)
    cl.write(C, 0, b"same")
    m = cl.stores[2].meta(C)
    cl.stores[2].replace_full(C, b"diff", version=1, chain_ver=m.chain_ver)  # silent divergence at v1
    with pytest.raises(ChecksumMismatch) as ei:
        cl.write(C, 4, b"!")
    assert ei.value.fields["what"] == "chunk" and ei.value.fields["target"] == 2
    for t in (1, 2, 3):  # nothing committed, nothing left pending
        meta = cl.stores[t].meta(C)
        assert meta is not None and meta.committed_ver == 1 and not meta.pending
    assert cl.replicas[1].in_doubt() == []


def test_acked_checksum_is_compared(make) -> None:
    cl = make(2)
    real = cl.replicas[2].handle_update

    def lying(req: UpdateReq, data: bytes):
        ack = real(req, data)
        return msgspec.structs.replace(ack, crc=ack.crc ^ 1)

    cl.replicas[2].handle_update = lying  # type: ignore[method-assign]
    with pytest.raises(ChecksumMismatch) as ei:
        cl.write(C, 0, b"x")
    assert ei.value.fields["what"] == "chain" and not cl.stores[1].meta(C)


def test_payload_corrupted_in_flight_is_retried(make) -> None:
    cl = make(3)
    hits = {"n": 0}

    def corrupt_once(target: int, req: UpdateReq, data: bytes) -> bytes | None:
        hits["n"] += 1
        return data[:-1] + bytes([data[-1] ^ 1]) if hits["n"] == 1 else None

    cl.fault = corrupt_once
    assert cl.write(C, 0, b"payload").commit_ver == 1
    assert len(cl.sleeps) == 1 and set(contents(cl, C).values()) == {(1, b"payload")}


def test_version_gap_answered_with_full_replace(make) -> None:
    cl = make(2)
    cl.write(C, 0, b"v1")
    cl.write(C, 0, b"v2")
    cl.stores[2].replace_full(C, b"v1", version=1, chain_ver=1)  # the tail lost v2
    kinds: list[UpdateKind] = []
    cl.fault = lambda t, req, data: kinds.append(req.kind)
    assert cl.write(C, 2, b"+3").commit_ver == 3
    assert kinds == [UpdateKind.WRITE, UpdateKind.REPLACE]
    assert contents(cl, C) == {1: (3, b"v2+3"), 2: (3, b"v2+3")}


def test_syncing_successor_gets_full_chunk_replaces(make) -> None:
    cl = make(2)
    cl.write(C, 0, b"0123456789")
    cl.set_states({2: PublicState.OFFLINE})
    cl.down.add(2)
    cl.write(C, 0, b"AB")
    cl.down.discard(2)
    cl.set_states({2: PublicState.SYNCING})  # before resync ran: the target is stale
    kinds: list[UpdateKind] = []
    cl.fault = lambda t, req, data: kinds.append(req.kind)
    cl.write(C, 9, b"Z")
    assert kinds == [UpdateKind.REPLACE]
    assert contents(cl, C, [1, 2]) == {1: (3, b"AB2345678Z"), 2: (3, b"AB2345678Z")}
    with pytest.raises(NotServing):  # syncing targets take writes, not reads
        cl.read(2, C)


def test_successor_rejects_until_it_learns_the_new_chain(make) -> None:
    cl = make(3)
    cl.write(C, 0, b"a")
    stale_view = cl.chain
    cl.down.add(2)
    cl.fail(2)  # mgmtd: 2 offline, version 2; target 3 still sees version 1
    cl.views[3] = stale_view
    cl.on_sleep = lambda s: cl.views.pop(3, None) if len(cl.sleeps) == 2 else None
    errors: list[str] = []
    real = cl.forward

    def spy(t, req, data):
        try:
            return real(t, req, data)
        except ChainVersionMismatch as e:
            errors.append(f"{e.fields['expected']}<{e.fields['got']}")
            raise

    cl.replicas[1]._forward = spy  # type: ignore[attr-defined]
    assert cl.write(C, 0, b"b").commit_ver == 2
    assert errors == ["1<2", "1<2"]


def test_update_to_non_member_is_refused(make) -> None:
    cl = make(2)
    cl.fail(2)
    req = UpdateReq(
        chain_id=CHAIN, chain_ver=cl.chain.version, chunk_id=C, kind=UpdateKind.WRITE, offset=0, length=1,
        chunk_size=4096, payload_crc=crc32c(b"x"), update_ver=1, expected_crc=crc32c(b"x"), expected_length=1,
        from_target=1,
    )  # fmt: skip
    with pytest.raises(NotServing):
        cl.replicas[2].handle_update(req, b"x")


def test_read_target_choice_is_balanced(make) -> None:
    cl = make(3)
    cl.set_states({2: PublicState.SYNCING})
    rng = random.Random(0)
    picks = [choose_read_target(cl.chain, rng) for _ in range(300)]
    assert set(picks) == {1, 3} and min(picks.count(1), picks.count(3)) > 100
    assert choose_read_target(cl.chain, rng, exclude=[1]) == 3
    with pytest.raises(NotServing):
        choose_read_target(cl.chain, rng, exclude=[1, 3])


def test_write_req_is_a_wire_header() -> None:
    req = WriteReq(
        chain_id=1, chain_ver=2, chunk_id=C, offset=0, length=3, chunk_size=4096, payload_crc=5, client_id="c",
        channel=1, seq=9,
    )  # fmt: skip
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(req), type=WriteReq) == req
