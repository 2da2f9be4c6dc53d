"""Bucket planning for data-parallel gradients: which parameters travel together, in what order.

Pure functions over (name, numel, dtype) descriptions, no torch: the wrapper
(:mod:`.ddp`) feeds it its parameters and gets a :class:`BucketPlan` back.

Why this shape.  Backward produces gradients roughly in reverse registration order
(the last layer first), so buckets are filled in that order and bucket 0 holds the
last parameters.  Bucket 0 is small (``first_bucket_bytes``, 1 MiB by default) so the
first allreduce starts as soon as the last layer's gradients exist, not after 25 MiB
of them.  A bucket holds one dtype (it is one flat buffer reduced as one op); a
parameter larger than the cap gets a bucket of its own.  Every rank computes the same
plan from the same module, so the buckets' op order agrees without any exchange.
"""

from __future__ import annotations

import msgspec

from fireflyer.core.errors import InvalidArgument

__all__ = ["ParamSpec", "Bucket", "BucketPlan", "plan_buckets", "MIB", "DEFAULT_FIRST_BUCKET_BYTES"]

MIB = 1 << 20
#: torch DDP's first bucket is 1 MiB too: small enough that communication starts early
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB


class ParamSpec(msgspec.Struct, frozen=True):
    """One parameter as the planner sees it: ``index`` is its registration position."""

    index: int
    name: str
    numel: int
    dtype: str
    itemsize: int


class Bucket(msgspec.Struct, frozen=True):
    """Parameters (registration indices, in fill order) sharing one flat buffer of ``dtype``."""

    index: int
    params: list[int]
    offsets: list[int]  # element offset of each parameter in the flat buffer
    numel: int
    dtype: str
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


class BucketPlan(msgspec.Struct, frozen=True):
    buckets: list[Bucket]
    #: registration index -> (bucket index, position in the bucket)
    where: dict[int, tuple[int, int]]

    def describe(self) -> list[dict[str, object]]:
        return [{"bucket": b.index, "params": len(b.params), "bytes": b.nbytes, "dtype": b.dtype}
                for b in self.buckets]


def plan_buckets(params: list[ParamSpec], cap_bytes: int,
                 first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES) -> BucketPlan:
    """Group ``params`` (registration order) into buckets filled in reverse registration order.

    A bucket closes when adding the next parameter of its dtype would pass its cap
    (``first_bucket_bytes`` for the first bucket of the plan, ``cap_bytes`` after); a
    bucket is never empty, so a parameter above the cap gets a bucket of its own.
    Dtypes are bucketed apart: an open bucket per dtype, closed buckets numbered in the
    order they close (and the open ones at the end in order of first use).
    """
    if cap_bytes <= 0:
        raise InvalidArgument(f"bucket cap must be positive, got {cap_bytes} bytes", argument="bucket_cap_mb")
    if first_bucket_bytes <= 0:
        raise InvalidArgument(f"first bucket size must be positive, got {first_bucket_bytes} bytes",
                              argument="first_bucket_bytes")
    seen: set[int] = set()
    for p in params:
        if p.index in seen:
            raise InvalidArgument(f"parameter index {p.index} ({p.name}) appears twice", argument="params")
        seen.add(p.index)
    closed: list[tuple[str, int, list[ParamSpec]]] = []
    open_: dict[str, list[ParamSpec]] = {}
    order: list[str] = []  # dtypes in order of first use: the open buckets' final order

    def cap() -> int:
        return first_bucket_bytes if not closed else cap_bytes

    for p in sorted(params, key=lambda s: s.index, reverse=True):
        cur = open_.setdefault(p.dtype, [])
        if p.dtype not in order:
            order.append(p.dtype)
        size = sum(q.numel for q in cur) * p.itemsize
        if cur and size + p.numel * p.itemsize > cap():
            closed.append((p.dtype, p.itemsize, cur))
            cur = open_[p.dtype] = []
        cur.append(p)
    for dt in order:
        if open_[dt]:
            closed.append((dt, open_[dt][0].itemsize, open_[dt]))
    buckets: list[Bucket] = []
    where: dict[int, tuple[int, int]] = {}
    for bi, (dt, itemsize, members) in enumerate(closed):
        offsets, off = [], 0
        for pos, p in enumerate(members):
            offsets.append(off)
            off += p.numel
            where[p.index] = (bi, pos)
        buckets.append(Bucket(index=bi, params=[p.index for p in members], offsets=offsets, numel=off, dtype=dt,
                              itemsize=itemsize))
    return BucketPlan(buckets=buckets, where=where)
