"""Choosing a new file's layout: round-robin base + our own deterministic shuffle.

3FS picks ``stripe`` consecutive chain indexes of the chain table starting at a
round-robin base and shuffles them with a per-file seed; its use of ``std::shuffle``
made layouts differ between compilers (3FS issue #368).  We fix the algorithm here:

**Round-robin base.**  Counters ``CHRR + table id + shard`` (``RR_SHARDS`` = 32
shards, shard = inode id mod 32).  A counter absent from the KV starts at
``shard * n // 32`` (n = chains in the table) so that the shards begin spread over
the table.  A create reads its shard's counter with a *snapshot* read and writes
``counter + stripe``: two concurrent creates may get the same base (they then share
chains, which only costs balance), but they never conflict on the counter.

**Shuffle** (``shuffle_indexes``).  ``idx = [(base + i) % n for i in range(stripe)]``,
then Fisher–Yates from the end: for ``i = stripe-1 .. 1``: ``j = next() % (i + 1)``,
swap ``idx[i]``/``idx[j]``, where ``next()`` is the splitmix64 stream seeded with the
inode id (state += 0x9E3779B97F4A7C15; z = state; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9;
z = (z ^ z>>27) * 0x94D049BB133111EB; return z ^ z>>31; all mod 2**64).  The modulo
bias (< stripe / 2**64) is irrelevant.  Chains are ``table[idx[k]]``.  Python's
``random`` is not used: its algorithms may change between versions.
"""

from __future__ import annotations

from collections.abc import Iterator

from .model import Layout, LayoutPolicy

__all__ = ["RR_SHARDS", "splitmix64", "shuffle_indexes", "rr_shard", "rr_initial", "make_layout"]

RR_SHARDS = 32
_M64 = (1 << 64) - 1


def splitmix64(seed: int) -> Iterator[int]:
    """The splitmix64 stream (Steele, Lea, Flood 2014) from ``seed``."""
    state = seed & _M64
    while True:
        state = (state + 0x9E3779B97F4A7C15) & _M64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        yield z ^ (z >> 31)


def shuffle_indexes(n: int, base: int, stripe: int, seed: int) -> list[int]:
    """``stripe`` consecutive indexes of an ``n``-chain table from ``base``, shuffled."""
    idx = [(base + i) % n for i in range(stripe)]
    rng = splitmix64(seed)
    for i in range(stripe - 1, 0, -1):
        j = next(rng) % (i + 1)
        idx[i], idx[j] = idx[j], idx[i]
    return idx


def rr_shard(inode_id: int) -> int:
    return inode_id % RR_SHARDS


def rr_initial(shard: int, n: int) -> int:
    return shard * n // RR_SHARDS


def make_layout(
    policy: LayoutPolicy, table_version: int, table: tuple[int, ...], base: int, inode_id: int
) -> Layout:
    """The layout of file ``inode_id`` under ``policy`` (already validated against the table)."""
    idx = shuffle_indexes(len(table), base, policy.stripe_size, inode_id)
    return Layout(
        chain_table_id=policy.chain_table_id,
        chain_table_version=table_version,
        chunk_size=policy.chunk_size,
        stripe_size=policy.stripe_size,
        chains=tuple(table[i] for i in idx),
    )
