"""Bucket planning: reverse registration order, a small first bucket, one dtype per bucket."""

from __future__ import annotations

import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.haiscale.buckets import MIB, ParamSpec, plan_buckets


def f32(i: int, numel: int, name: str = "") -> ParamSpec:
    return ParamSpec(index=i, name=name or f"p{i}", numel=numel, dtype="float32", itemsize=4)


def test_reverse_order_small_first_bucket_then_cap() -> None:
    # 8 params of 256 KiB each (64K float32): first bucket 1 MiB = 4 params, then 2 MiB = 8 (only 4 left)
    params = [f32(i, 64 * 1024) for i in range(8)]
    plan = plan_buckets(params, cap_bytes=2 * MIB, first_bucket_bytes=1 * MIB)
    assert [b.params for b in plan.buckets] == [[7, 6, 5, 4], [3, 2, 1, 0]]
    assert [b.nbytes for b in plan.buckets] == [MIB, MIB]
    assert plan.buckets[0].offsets == [0, 65536, 131072, 196608]
    assert plan.where[5] == (0, 2) and plan.where[0] == (1, 3)


def test_later_buckets_fill_to_the_cap() -> None:
    params = [f32(i, 64 * 1024) for i in range(13)]  # 256 KiB each
    plan = plan_buckets(params, cap_bytes=1 * MIB, first_bucket_bytes=256 * 1024)
    assert [len(b.params) for b in plan.buckets] == [1, 4, 4, 4]
    assert plan.buckets[0].params == [12]
    assert all(b.nbytes <= MIB for b in plan.buckets)


def test_a_parameter_above_the_cap_gets_its_own_bucket() -> None:
    params = [f32(0, 10), f32(1, 1 << 20), f32(2, 10)]  # p1 is 4 MiB
    plan = plan_buckets(params, cap_bytes=MIB, first_bucket_bytes=MIB)
    assert [b.params for b in plan.buckets] == [[2], [1], [0]]
    assert plan.buckets[1].nbytes == 4 * MIB


def test_dtypes_are_bucketed_apart() -> None:
    params = [f32(0, 100), ParamSpec(index=1, name="h", numel=100, dtype="bfloat16", itemsize=2), f32(2, 100)]
    plan = plan_buckets(params, cap_bytes=MIB)
    assert [(b.dtype, b.params) for b in plan.buckets] == [("float32", [2, 0]), ("bfloat16", [1])]
    assert plan.buckets[0].offsets == [0, 100]


def test_every_parameter_is_placed_once_and_offsets_are_contiguous() -> None:
    sizes = [3, 1000, 7, 250_000, 1, 90_000, 12, 400_000]
    plan = plan_buckets([f32(i, n) for i, n in enumerate(sizes)], cap_bytes=MIB, first_bucket_bytes=MIB // 4)
    placed = sorted(i for b in plan.buckets for i in b.params)
    assert placed == list(range(len(sizes)))
    for b in plan.buckets:
        ends = [off + sizes[i] for i, off in zip(b.params, b.offsets, strict=True)]
        assert b.offsets == [0, *ends[:-1]] and b.numel == ends[-1]
    # fill order is reverse registration order across the whole plan
    order = [i for b in plan.buckets for i in b.params]
    assert order == sorted(order, reverse=True)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgument, match="bucket cap"):
        plan_buckets([f32(0, 1)], cap_bytes=0)
    with pytest.raises(InvalidArgument, match="twice"):
        plan_buckets([f32(0, 1), f32(0, 2)], cap_bytes=MIB)
    assert plan_buckets([], cap_bytes=MIB).buckets == []
