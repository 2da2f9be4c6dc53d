"""Chunk ids: 16 bytes, order-preserving, a file is a contiguous range; offset arithmetic."""

from __future__ import annotations

import random

import msgspec
import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.meta.model import Layout
from fireflyer.storage import ChunkId, chain_for, chunk_of, file_range, split_range
from fireflyer.storage.chunkid import MAX_INDEX, MAX_INODE, MAX_TRACK


def test_round_trip_and_size() -> None:
    c = ChunkId(0x0123456789ABCDEF, 3, 0xDEADBEEF)
    raw = c.to_bytes()
    assert len(raw) == 16 and raw[:2] == b"\0\0"
    assert ChunkId.from_bytes(raw) == c
    assert ChunkId.from_hex(c.hex) == c
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(c), type=ChunkId) == c


def test_byte_order_equals_numeric_order() -> None:
    rng = random.Random(1)
    ids = [
        ChunkId(
            rng.choice([0, 1, 255, 256, 2**32, MAX_INODE]),
            rng.randrange(MAX_TRACK + 1),
            rng.randrange(MAX_INDEX + 1),
        )
        for _ in range(2000)
    ]
    assert sorted(ids) == sorted(ids, key=ChunkId.to_bytes)


def test_file_range_is_contiguous_and_exclusive() -> None:
    begin, end = file_range(42)
    inside = [ChunkId(42, t, i) for t in (0, 1, MAX_TRACK) for i in (0, 1, MAX_INDEX)]
    outside = [ChunkId(41, MAX_TRACK, MAX_INDEX), ChunkId(43, 0, 0)]
    assert all(begin <= c < end for c in inside)
    assert not any(begin <= c < end for c in outside)
    b, e = file_range(42, track=1, start_index=5)
    assert b == ChunkId(42, 1, 5) and e == ChunkId(42, 2, 0)
    assert file_range(42, track=MAX_TRACK)[1] == ChunkId(43, 0, 0)
    assert file_range(MAX_INODE)[1].to_bytes() > ChunkId(MAX_INODE, MAX_TRACK, MAX_INDEX).to_bytes()


def test_out_of_range_ids_are_bad_requests() -> None:
    for args in [(-1, 0, 0), (0, MAX_TRACK + 1, 0), (0, 0, MAX_INDEX + 1)]:
        with pytest.raises(InvalidArgument):
            ChunkId(*args)
    with pytest.raises(InvalidArgument):
        ChunkId.from_bytes(b"short")


def test_chunk_of_and_split_range() -> None:
    assert chunk_of(0, 4096) == (0, 0)
    assert chunk_of(4096 * 3 + 7, 4096) == (3, 7)
    pieces = list(split_range(4000, 10000, 4096))
    assert pieces == [(0, 4000, 96, 0), (1, 0, 4096, 96), (2, 0, 4096, 4192), (3, 0, 1712, 8288)]
    assert sum(p[2] for p in pieces) == 10000
    assert list(split_range(5, 0, 4096)) == []
    with pytest.raises(InvalidArgument):
        chunk_of(-1, 4096)
    with pytest.raises(InvalidArgument):
        list(split_range(0, -1, 4096))


def test_chain_for_follows_layout_stripe() -> None:
    layout = Layout(
        chain_table_id=1, chain_table_version=1, chunk_size=4096, stripe_size=3, chains=(10, 20, 30)
    )
    assert [chain_for(layout, i) for i in range(7)] == [10, 20, 30, 10, 20, 30, 10]
