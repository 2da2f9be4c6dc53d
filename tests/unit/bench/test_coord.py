"""``ff bench coord``: the state machine's figures (moved from tests/unit/coord)."""

from __future__ import annotations

from fireflyer.bench.coord import bench_state_machine


def test_bench_state_machine_small() -> None:
    r = bench_state_machine(64, 2)
    assert r["cross_zone_pairs"] == 1 and r["depth"] <= 6 and r["world_size"] == 64 * 8
