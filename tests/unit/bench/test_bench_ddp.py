"""``ff bench ddp``'s folding of the ranks' results (the launch itself runs in tests/integration/haiscale)."""

from __future__ import annotations

import pytest

from fireflyer.bench.ddp import summarise


def rank(h: float, th: float, g: float, exposed: float, alone: float) -> dict[str, object]:
    return {"params": 10, "buckets": 2, "haiscale": {"step_ms": h, "exposed_comm_ms": exposed, "comm_alone_ms": alone},
            "torch_hfreduce": {"step_ms": th}, "torch_gloo": {"step_ms": g}}


def test_slowest_rank_ratio_and_hidden_share() -> None:
    r = summarise([rank(50, 70, 100, 2, 10), rank(60, 65, 90, 4, 8)])
    assert (r["haiscale_step_ms"], r["torch_hfreduce_step_ms"], r["torch_gloo_step_ms"]) == (60, 70, 100)
    assert r["ratio_vs_gloo"] == pytest.approx(0.6) and r["goal_met"]
    assert r["hidden_share"] == pytest.approx(1 - 4 / 10)


def test_nothing_hidden_is_zero_not_negative() -> None:
    r = summarise([rank(80, 85, 75, 50, 33)])
    assert r["hidden_share"] == 0.0 and not r["goal_met"]
