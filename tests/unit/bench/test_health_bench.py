"""``ff bench health`` at small sizes: figures present, goals met, JSON through the CLI."""

from __future__ import annotations

import json

import pytest

from fireflyer.bench.health import bench_health, clean_run, fault_trials
from fireflyer.cli.main import BENCHES
from fireflyer.cli.main import main as ff_main
from fireflyer.health.c4 import C4Config
from fireflyer.health.synth import FAULT_KINDS


def test_registered() -> None:
    assert BENCHES["health"] == "fireflyer.bench.health"


def test_fault_trials_small() -> None:
    r = fault_trials(16, 3, seed=2, config=C4Config(deadline_s=5.0))
    assert set(r) == set(FAULT_KINDS)
    for kind, v in r.items():
        assert v["detected"] == 3 and v["wrong_incidents"] == 0, kind
    assert r["delay"]["delay_ops_max"] <= 5 and r["skip"]["delay_s_max"] <= 5.0 + 2


def test_clean_run_small_times_against_median() -> None:
    r = clean_run(16, 200, seed=3, config=C4Config())
    assert r["incidents"] == 0 and r["ops"] == 200
    assert r["classifier_us_per_op"] > 0 and r["median_us_per_op"] > 0


def test_bench_health_goals_at_small_sizes() -> None:
    r = bench_health([16, 32], trials=2, clean_ops=[300, 100], seed=4, config=C4Config(deadline_s=5.0))
    assert [s["nodes"] for s in r["sizes"]] == [16, 32]
    assert {g["goal"]: g["met"] for g in r["goals"]} == {
        "precision": True, "recall": True, "slow named within 5 ops": True,
        "hang named within deadline + 2 s": True, "no incident on clean ops": True}
    assert "available" in r["flashcut"]


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = ff_main(["bench", "health", "--nodes", "16", "--trials", "1", "--clean-ops", "50", "--deadline-s", "3",
                  "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bench"] == "health" and out["summary"]["recall"] == 1.0


def test_cli_rejects_bad_sizes() -> None:
    with pytest.raises(SystemExit):
        ff_main(["bench", "health", "--nodes", "4", "--json"])
