"""Chunk ids and the arithmetic from file offsets to chunks and chains.

A 3FS chunk id is 16 bytes: reserved/tenant bytes, the 64-bit inode id, a 16-bit track
and the 32-bit chunk index, all big-endian (research/3fs.md §2).  Big-endian makes byte
order equal numeric order, so every chunk of one file is one contiguous key range on a
target: removing a file's chunks (GC, truncate) and finding its last chunk (exact file
length) are range operations, not scans.  Our layout: 2 reserved zero bytes, 8 bytes inode,
2 bytes track, 4 bytes index.

``ChunkId`` is an ordered, frozen msgspec Struct encoded as a 3-element array, so it can
sit in wire headers as is; ``to_bytes``/``from_bytes`` give the 16-byte key.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING

import msgspec

from .errors import BadRequest

if TYPE_CHECKING:
    from fireflyer.meta.model import Layout

__all__ = [
    "ChunkId",
    "CHUNK_ID_SIZE",
    "MAX_INODE",
    "MAX_TRACK",
    "MAX_INDEX",
    "file_range",
    "chunk_of",
    "split_range",
    "chain_for",
]

_FMT = struct.Struct(">HQHI")
CHUNK_ID_SIZE = _FMT.size  # 16
#: the largest inode id a chunk may belong to; ``MAX_INODE + 1`` ends the last file's range
MAX_INODE = (1 << 64) - 2
MAX_TRACK = (1 << 16) - 1
MAX_INDEX = (1 << 32) - 1


class ChunkId(msgspec.Struct, frozen=True, order=True, array_like=True):
    """(inode, track, index); orders like its 16-byte big-endian encoding."""

    inode: int
    track: int
    index: int

    def __post_init__(self) -> None:
        if not (
            0 <= self.inode <= MAX_INODE + 1 and 0 <= self.track <= MAX_TRACK and 0 <= self.index <= MAX_INDEX
        ):
            raise BadRequest(
                f"chunk id ({self.inode}, {self.track}, {self.index}) is out of range "
                f"(inode < 2**64-1, track < 2**16, index < 2**32)",
                inode=self.inode,
                track=self.track,
                index=self.index,
            )

    def to_bytes(self) -> bytes:
        return _FMT.pack(0, self.inode, self.track, self.index)

    @classmethod
    def from_bytes(cls, raw: bytes) -> ChunkId:
        if len(raw) != CHUNK_ID_SIZE:
            raise BadRequest(f"a chunk id is {CHUNK_ID_SIZE} bytes, got {len(raw)}", size=len(raw))
        _reserved, inode, track, index = _FMT.unpack(raw)
        return cls(inode, track, index)

    @property
    def hex(self) -> str:
        return self.to_bytes().hex()

    @classmethod
    def from_hex(cls, text: str) -> ChunkId:
        return cls.from_bytes(bytes.fromhex(text))

    def __str__(self) -> str:
        return f"{self.inode:x}:{self.track}:{self.index}"


def file_range(inode: int, track: int | None = None, start_index: int = 0) -> tuple[ChunkId, ChunkId]:
    """The half-open range ``[begin, end)`` of a file's chunks with index >= ``start_index``.

    ``track=None`` spans every track of the file (then ``start_index`` applies to track 0
    only, so use it with a track when truncating).
    """
    if not 0 <= inode <= MAX_INODE:
        raise BadRequest(f"inode {inode} is out of range", inode=inode)
    if track is None:
        return ChunkId(inode, 0, start_index), ChunkId(inode + 1, 0, 0)
    begin = ChunkId(inode, track, start_index)
    end = ChunkId(inode, track + 1, 0) if track < MAX_TRACK else ChunkId(inode + 1, 0, 0)
    return begin, end


def chunk_of(offset: int, chunk_size: int) -> tuple[int, int]:
    """``(chunk index, offset inside that chunk)`` of a file offset."""
    if offset < 0 or chunk_size <= 0:
        raise BadRequest(
            f"bad offset {offset} / chunk size {chunk_size}", offset=offset, chunk_size=chunk_size
        )
    return divmod(offset, chunk_size)


def split_range(offset: int, length: int, chunk_size: int) -> Iterator[tuple[int, int, int, int]]:
    """Split a file byte range into per-chunk pieces.

    Yields ``(chunk index, offset in chunk, length, offset in the caller's buffer)``;
    what a client needs to turn one read/write into chunk requests.
    """
    if length < 0:
        raise BadRequest(f"negative length {length}", length=length)
    index, inner = chunk_of(offset, chunk_size)
    done = 0
    while done < length:
        n = min(chunk_size - inner, length - done)
        yield index, inner, n, done
        done += n
        index += 1
        inner = 0


def chain_for(layout: Layout, chunk_index: int) -> int:
    """The chain id holding chunk ``chunk_index`` of a file: ``chains[i % stripe]`` (§2)."""
    if chunk_index < 0:
        raise BadRequest(f"negative chunk index {chunk_index}", index=chunk_index)
    return layout.chain_of(chunk_index)
