"""``fireflyer.bench._runs``: N runs of ``ff bench allreduce`` folded into medians and ranges."""

from __future__ import annotations

import pytest

from fireflyer.bench._runs import RANGE_KEYS, fmt_size, spread_lines, summarize_runs
from fireflyer.core.errors import InvalidArgument


def entry(size: int, time_s: float, ratio: float | None, bound: float | None = None, **extra: object) -> dict:
    e = {"size_bytes": size, "dtype": "fp32", "nodes": 4, "local_ranks": 1, "time_s": time_s,
         "algbw_GBps": size / time_s / 1e9, "ratio": ratio, "gloo_time_s": time_s * ratio if ratio else None,
         "fraction_of_bound": bound, "fraction_of_floor": None, "gloo_over_floor": None, "bound_GBps": None}
    e.update(extra)
    return e


def run(results: list[dict], sha: str = "abc") -> dict:
    return {"bench": "allreduce", "nodes": 4, "local_ranks": 1, "dtype": "fp32", "vs": "gloo",
            "git_sha": sha, "cpu_count": 2, "results": results}


def test_each_figure_is_its_own_median_with_the_range_of_the_runs() -> None:
    docs = [run([entry(4, 6e-4, 1.1), entry(64 << 20, 0.065, 1.49, 0.82)]),
            run([entry(4, 5e-4, 0.9), entry(64 << 20, 0.070, 1.30, 0.66)]),
            run([entry(4, 7e-4, 1.2), entry(64 << 20, 0.059, 1.58, 0.88)])]
    s = summarize_runs(docs)
    assert s["runs"] == 3 and s["per_run"] == [d["results"] for d in docs]
    assert (s["nodes"], s["local_ranks"], s["vs"], s["git_sha"]) == (4, 1, "gloo", "abc")
    small, big = s["results"]
    assert (small["size_bytes"], small["dtype"]) == (4, "fp32")
    assert small["time_s"] == pytest.approx(6e-4) and small["ratio"] == pytest.approx(1.1)
    assert big["time_s"] == pytest.approx(0.065) and big["ratio"] == pytest.approx(1.49)
    assert big["fraction_of_bound"] == pytest.approx(0.82)
    assert big["range"]["ratio"] == [1.30, 1.58] and big["range"]["fraction_of_bound"] == [0.66, 0.88]
    assert big["range"]["time_s"] == [0.059, 0.070]
    assert set(big["range"]) == set(RANGE_KEYS) and big["runs_with"]["ratio"] == 3
    # a figure no run has stays None, with no range
    assert big["fraction_of_floor"] is None and big["range"]["fraction_of_floor"] is None
    assert small["fraction_of_bound"] is None and small["runs_with"]["fraction_of_bound"] == 0
    # the goals are judged on the medians: 1.49x Gloo and 82% of the bound, though one run had 66%
    assert [(g["goal"], g["value"], g["met"]) for g in s["goals"]] == [
        ("4x1 64M vs Gloo", pytest.approx(1.49), True), ("4x1 64M of the loopback bound", pytest.approx(0.82), True)]


def test_a_figure_missing_from_some_runs_is_the_median_of_the_others() -> None:
    note = "Gloo cannot allreduce bf16 here"
    docs = [run([entry(1 << 20, 0.01, None, gloo_note=note)]), run([entry(1 << 20, 0.02, 2.0)]),
            run([entry(1 << 20, 0.03, 4.0)])]
    (e,) = summarize_runs(docs)["results"]
    assert e["ratio"] == pytest.approx(3.0) and e["runs_with"]["ratio"] == 2 and e["range"]["ratio"] == [2.0, 4.0]
    assert e["gloo_note"] == note  # words are kept as they are, not dropped


def test_runs_of_different_benchmarks_or_none_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="no runs"):
        summarize_runs([])
    a = run([entry(4, 1e-4, 1.0)])
    b = run([entry(8, 1e-4, 1.0)])
    with pytest.raises(InvalidArgument, match="not of one benchmark"):
        summarize_runs([a, b])
    c = {**run([entry(4, 1e-4, 1.0)]), "nodes": 2}
    with pytest.raises(InvalidArgument, match="not of one benchmark"):
        summarize_runs([a, c])


def test_runs_of_different_commits_name_them_all() -> None:
    s = summarize_runs([run([entry(4, 1e-4, 1.0)], "b"), run([entry(4, 1e-4, 1.0)], "a")])
    assert s["git_sha"] == "a,b"


def test_spread_lines_say_median_and_range_per_size() -> None:
    docs = [run([entry(64 << 20, 0.065, 1.49, 0.82)]), run([entry(64 << 20, 0.070, 1.30, 0.66)])]
    lines = spread_lines(summarize_runs(docs))
    assert lines[0].startswith("medians of 2 runs")
    assert lines[1].strip().startswith("64M: time 67.5 ms [65.0 ms-70.0 ms]")
    assert "ratio 1.40x [1.30x-1.49x]" in lines[1] and "% of bound 74% [66%-82%]" in lines[1]


def test_fmt_size() -> None:
    assert [fmt_size(n) for n in (4, 1 << 20, 64 << 20, 3 << 30, 1000, 1536)] == ["4", "1M", "64M", "3G", "1000",
                                                                                    "1536"]
