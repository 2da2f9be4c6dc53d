"""``fireflyer.bench._goals``: which goals an ``ff bench allreduce`` run is judged on, and the verdicts."""

from __future__ import annotations

from fireflyer.bench._goals import GOALS, goals, missed

M64 = 64 << 20


def result(nodes: int, local_ranks: int, entries: list[dict], dtype: str = "fp32") -> dict:
    return {"bench": "allreduce", "nodes": nodes, "local_ranks": local_ranks, "dtype": dtype, "results": entries}


def entry(size: int, ratio: float | None, bound: float | None = None) -> dict:
    return {"size_bytes": size, "ratio": ratio, "fraction_of_bound": bound}


def test_four_by_one_is_judged_on_gloo_and_the_bound_at_64m() -> None:
    got = goals(result(4, 1, [entry(4, 0.5), entry(16 << 20, 0.8, 0.5), entry(M64, 1.48, 0.75)]))
    assert got == [{"goal": "4x1 64M vs Gloo", "value": 1.48, "target": 1.0, "met": True},
                   {"goal": "4x1 64M of the loopback bound", "value": 0.75, "target": 0.8, "met": False}]
    assert missed(got) == ["4x1 64M of the loopback bound"]


def test_two_by_four_is_judged_at_64m_and_at_4_bytes() -> None:
    got = goals(result(2, 4, [entry(4, 3.85), entry(M64, 4.99)]))
    assert [(g["goal"], g["met"]) for g in got] == [("2x4 64M vs Gloo", False), ("2 nodes 4 B vs Gloo", True)]
    assert goals(result(2, 4, [entry(M64, 5.0)]))[0]["met"]  # the target itself meets it


def test_the_two_node_latency_goal_holds_for_any_local_ranks_and_others_need_their_shape() -> None:
    assert [g["goal"] for g in goals(result(2, 1, [entry(4, 0.9), entry(M64, 1.6)]))] == ["2 nodes 4 B vs Gloo"]
    assert goals(result(3, 2, [entry(4, 1.0), entry(M64, 2.0, 0.9)])) == []  # no goal for 3 x 2
    assert goals(result(4, 2, [entry(M64, 2.0, 0.9)])) == []  # 4 x 1 only


def test_a_run_without_the_figure_or_not_fp32_is_judged_on_nothing() -> None:
    assert goals(result(4, 1, [entry(M64, None, None)])) == []  # no --vs gloo, --no-bound
    assert goals(result(2, 4, [entry(M64, 6.0)], dtype="bf16")) == []  # the goals are fp32's
    assert goals(result(2, 4, [])) == []
    assert {g.key for g in GOALS} <= {"ratio", "fraction_of_bound"}
