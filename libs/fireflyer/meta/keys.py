"""The metadata key layout in the KV (3FS's 4-byte ASCII prefixes).

==============================================  ==========================================
key                                             value (msgpack)
==============================================  ==========================================
``INOD`` + id (8 B big-endian)                  ``Inode``
``DENT`` + parent id (8 B BE) + name (UTF-8)    ``[inode id, type]``
``IDAL`` + shard (2 B BE)                       next block counter of that allocator shard
``CHRR`` + table id (4 B BE) + shard (1 B)      round-robin chain base counter (``layout``)
``GCQU`` + id (8 B BE)                          ``GcItem`` (a removed file, chunks to delete)
``TRNC`` + id (8 B BE)                          ``TruncateItem`` (a file shrunk, tail to drop)
``META``                                        ``{"format": 1}`` once ``MetaStore.init`` ran
==============================================  ==========================================

Inode ids are **big-endian** (3FS uses little-endian to spread sequential ids over
FoundationDB shards): our backends are single B-trees that gain nothing from spreading,
while big-endian keeps ``INOD``/``GCQU`` scans in id order (``statfs``, fsck, GC in
allocation order).  A directory's entries are one contiguous range
``DENT+parent .. strinc(DENT+parent)``: the parent id is fixed width, so no name can
leak into a neighbour's range, and names sort bytewise, which is ``readdir`` order.
"""

from __future__ import annotations

from fireflyer.kv.keys import strinc

__all__ = [
    "INOD",
    "DENT",
    "IDAL",
    "CHRR",
    "GCQU",
    "TRNC",
    "META",
    "inode_key",
    "dentry_key",
    "dentry_range",
    "dentry_name",
    "alloc_key",
    "rr_key",
    "gc_key",
    "trunc_key",
    "id_from_key",
]

INOD = b"INOD"
DENT = b"DENT"
IDAL = b"IDAL"
CHRR = b"CHRR"
GCQU = b"GCQU"
TRNC = b"TRNC"
META = b"META"


def _id(n: int) -> bytes:
    return n.to_bytes(8, "big")


def inode_key(inode_id: int) -> bytes:
    return INOD + _id(inode_id)


def dentry_prefix(parent_id: int) -> bytes:
    return DENT + _id(parent_id)


def dentry_key(parent_id: int, name: str) -> bytes:
    return DENT + _id(parent_id) + name.encode("utf-8")


def dentry_range(parent_id: int) -> tuple[bytes, bytes]:
    p = dentry_prefix(parent_id)
    return p, strinc(p)


def dentry_name(key: bytes) -> str:
    return key[len(DENT) + 8 :].decode("utf-8")


def alloc_key(shard: int) -> bytes:
    return IDAL + shard.to_bytes(2, "big")


def rr_key(table_id: int, shard: int) -> bytes:
    return CHRR + table_id.to_bytes(4, "big") + bytes([shard])


def gc_key(inode_id: int) -> bytes:
    return GCQU + _id(inode_id)


def trunc_key(inode_id: int) -> bytes:
    return TRNC + _id(inode_id)


def id_from_key(key: bytes) -> int:
    """The 8-byte id right after a 4-byte prefix (INOD, GCQU, TRNC keys)."""
    return int.from_bytes(key[4:12], "big")
