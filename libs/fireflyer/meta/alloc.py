"""Inode id allocation: a KV counter sharded N ways, handing out blocks of ids.

Why sharded: every create needs a fresh id; one shared counter key would make every
two concurrent creates conflict.  With ``shards`` counters (3FS: 32) each process
and thread uses its own shard, so reservations rarely meet, and they happen only
once per ``block_size`` ids (3FS: 4096, the low 12 bits handed out locally).

Id space.  Counter ``c`` of shard ``s`` (``IDAL`` + s; absent reads as 1) names block
``b = c * shards + s``; the block owns ids ``[b * block_size, (b + 1) * block_size)``.
Distinct (c, s) pairs give distinct blocks, so ids are unique across shards, threads
and processes; the reservation is one transaction that reads and bumps ``c``, so
two reservations of one shard conflict and one retries.  Counters start at 1, so
every allocated id is >= ``shards * block_size``, far above the root's id 1.
Reserved ids not used before a process exits are simply skipped (ids are 64-bit).
"""

from __future__ import annotations

import os
import threading
import zlib

from fireflyer.kv import KV, Txn
from fireflyer.kv.errors import KVInvalidArgument

from .keys import alloc_key

__all__ = ["InodeAllocator", "DEFAULT_BLOCK_SIZE", "read_counter"]

DEFAULT_BLOCK_SIZE = 4096


def read_counter(txn: Txn, shard: int) -> int:
    raw = txn.get(alloc_key(shard))
    return 1 if raw is None else int.from_bytes(raw, "big")


class InodeAllocator:
    """Hands out unique inode ids; thread safe, one per ``MetaStore``.

    Each thread keeps its own current block, and draws from the shard chosen by a
    hash of (pid, thread id, salt); ``reserve_block`` is the only KV access.
    """

    def __init__(self, kv: KV, *, shards: int = 32, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if not 1 <= shards <= 65535:
            raise KVInvalidArgument("alloc_shards must be in [1, 65535]", shards=shards)
        if block_size < 1:
            raise KVInvalidArgument("block_size must be >= 1", block_size=block_size)
        self._kv = kv
        self.shards = shards
        self.block_size = block_size
        self._local = threading.local()
        self._salt = os.urandom(4)

    def shard_for_thread(self) -> int:
        ident = f"{os.getpid()}:{threading.get_ident()}".encode() + self._salt
        return zlib.crc32(ident) % self.shards

    def reserve_block(self, shard: int) -> range:
        """Reserve the next block of ``shard`` in its own transaction."""

        def bump(txn: Txn) -> int:
            c = read_counter(txn, shard)
            txn.set(alloc_key(shard), (c + 1).to_bytes(8, "big"))
            return c

        c = self._kv.run(bump)
        block = c * self.shards + shard
        return range(block * self.block_size, (block + 1) * self.block_size)

    def next_id(self) -> int:
        loc = self._local
        it = getattr(loc, "ids", None)
        if it is not None:
            n = next(it, None)
            if n is not None:
                return n
        loc.ids = iter(self.reserve_block(self.shard_for_thread()))
        return next(loc.ids)
