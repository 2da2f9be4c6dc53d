"""``ff bench sched`` runs at a small size and reports what it says it does."""

from __future__ import annotations

import json

from fireflyer.bench.sched import bench_sched, main


def test_bench_sched_small() -> None:
    r = bench_sched(nodes=40, zones=2, tasks=60, cycles=20, scaling=(10, 60), scaling_cycles=5, seed=3)
    run = r["run"]
    assert run["tasks"] == 60 and run["cycles"] == 20 and run["starts"] > 0
    assert 0.0 <= run["busy_min"] <= run["busy_median"] <= 1.0
    assert run["cycle_ms_median"] <= run["cycle_ms_p95"] <= run["cycle_ms_max"]
    assert run["anchor_sort_ms"] > 0 and run["ratio_to_sort"] > 0
    assert [row["tasks"] for row in r["scaling"]] == [10, 60]
    storm = r["preemption_storm"]
    assert storm["tasks"] == 60 and 0 < storm["preempts"] <= 40
    cycle, busy = r["goals"]
    assert cycle["value"] == run["cycle_ms_p95"] and cycle["met"] == (cycle["value"] <= cycle["target"])
    assert busy["value"] == run["busy_min"] and busy["met"] == (busy["value"] >= busy["target"])
    # the same seed gives the same workload and decisions
    again = bench_sched(nodes=40, zones=2, tasks=60, cycles=20, scaling=(10, 60), scaling_cycles=5, seed=3)
    assert (again["run"]["starts"], again["run"]["preempts"]) == (run["starts"], run["preempts"])


def test_bench_sched_cli_json(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--nodes", "20", "--tasks", "30", "--cycles", "3", "--scaling", "30",
                 "--scaling-cycles", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bench"] == "sched" and out["nodes"] == 20 and out["scaling"][0]["tasks"] == 30


def test_bench_sched_preempt_needs_a_cluster(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """--preempt measures a running cluster only (the e2e test runs it on one): none -> NoClusterFound,
    and a bad --iterations is refused before anything is submitted."""
    import pytest

    from fireflyer.core.errors import NoClusterFound

    for var in ("FF_SCHED_ADDR", "FF_TOKEN", "FF_STATE_DIR"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit) as e:
        main(["--preempt", "--iterations", "0"])
    assert e.value.code == 2
    with pytest.raises(NoClusterFound):
        main(["--preempt", "--state-dir", str(tmp_path / "none"), "--json"])
