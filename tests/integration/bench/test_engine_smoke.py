"""``python -m fireflyer.bench._engine``: the engine's micro-benchmark against its loopback bound
(moved from tests/integration/hfreduce/test_engine_processes.py)."""

from __future__ import annotations

from fireflyer.bench._engine import bench_engine


def test_bench_engine_reports_bound_and_fraction() -> None:
    res = bench_engine(2, 4 << 20, 3, chunk_bytes=1 << 20)
    assert res["nodes"] == 2 and res["algbw_GBps"] > 0
    assert res["busbw_GBps"] == res["algbw_GBps"]  # 2(n-1)/n = 1 at n = 2
    assert res["bound_algbw_GBps"] > 0 and 0 < res["fraction"]
