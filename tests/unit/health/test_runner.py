"""run_level: levels, the baseline, and every injection through the runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from fireflyer.ckpt.localfs import LocalFS
from fireflyer.health.checks import (
    CHECKS,
    INJECTIONS,
    LEVELS,
    Baseline,
    LevelPlan,
    Status,
    baseline_from,
    run_level,
)

from .conftest import SPEC, ThreadGroup

TINY = LevelPlan(cpu_n=2048, cpu_rounds=40, mem_bw_mib=1, mem_bw_repeats=3, pattern_mib=0.0625,
                 pattern_tests=("walking_ones", "address_in_address", "moving_inversions"), gemm_budget_bytes=96 * 96 * 12,
                 allreduce_mib=0.0625, allreduce_iters=2, storage_files=2, storage_mib=0.0625)


def _run(sysfs: Path, tmp_path: Path, baseline: Baseline, **kw):
    return run_level(1, SPEC, baseline, sysfs_root=str(sysfs), fs=LocalFS(tmp_path / "fs"),
                     comm=ThreadGroup(1).comm(0), plan=TINY, **kw)


@pytest.fixture
def baseline(sysfs: Path, tmp_path: Path) -> Baseline:
    """The node at its best: the highest of each throughput over three clean runs."""
    values: dict[str, float] = {}
    for _ in range(3):
        report = _run(sysfs, tmp_path, Baseline())
        assert report.status is Status.PASS, [r.summary for r in report.failed]
        for k, v in baseline_from(report).values.items():
            values[k] = max(values.get(k, 0.0), v)
    return Baseline(values=values, fraction=0.1)  # CI is noisy; an injected slowdown is 20x


def test_a_clean_level_passes_every_check(sysfs: Path, tmp_path: Path, baseline: Baseline) -> None:
    assert set(baseline.values) == {"cpu_steps_per_s_per_core", "mem_triad_gbps", "gemm_gflops",
                                    "allreduce_busbw_gbps", "storage_write_mbps", "storage_read_mbps"}
    report = _run(sysfs, tmp_path, baseline)
    assert [r.check for r in report.results] == list(CHECKS)
    assert report.status is Status.PASS and report.not_run == {}, [r.summary for r in report.failed]


@pytest.mark.parametrize("check,fault", [(c, f) for c, faults in INJECTIONS.items() for f in faults])
def test_every_injection_fails_its_check(sysfs: Path, tmp_path: Path, baseline: Baseline, check: str,
                                         fault: str) -> None:
    report = _run(sysfs, tmp_path, baseline, inject={check: fault}, checks=(check,))
    assert report.status is Status.FAIL
    [r] = report.results
    assert (r.check, r.status, r.injected) == (check, Status.FAIL, fault), r.summary


def test_checks_without_their_dependency_are_listed_not_run(sysfs: Path) -> None:
    report = run_level(1, SPEC, Baseline(), sysfs_root=str(sysfs), plan=TINY, checks=("hardware", "allreduce",
                                                                                       "storage"))
    assert [r.check for r in report.results] == ["hardware"] and set(report.not_run) == {"allreduce", "storage"}


def test_a_check_that_raises_is_an_error_not_an_exception(sysfs: Path) -> None:
    class Broken:  # not a communicator: no world_size, so the check itself raises
        rank = 0

    report = run_level(1, SPEC, Baseline(), sysfs_root=str(sysfs), comm=Broken(), plan=TINY, checks=("allreduce",))
    assert report.status is Status.ERROR and "raised AttributeError" in report.results[0].summary


def test_bad_level_and_bad_injection_are_refused() -> None:
    with pytest.raises(ValueError, match="level"):
        run_level(7, SPEC, Baseline())
    with pytest.raises(ValueError, match="cannot inject"):
        run_level(1, SPEC, Baseline(), inject={"gemm": "bitflip"})


def test_levels_grow() -> None:
    one, two, three = LEVELS[1], LEVELS[2], LEVELS[3]
    assert one.pattern_mib < two.pattern_mib < three.pattern_mib
    assert one.gemm_budget_bytes < two.gemm_budget_bytes and three.gemm_budget_bytes == 0  # 0: most of the GPU
    assert one.cpu_n * one.cpu_rounds < two.cpu_n * two.cpu_rounds < three.cpu_n * three.cpu_rounds


def test_baseline_from_keeps_previous_values_and_ignores_failures(sysfs: Path, tmp_path: Path) -> None:
    report = _run(sysfs, tmp_path, Baseline(), inject={"gemm": "corrupt"})
    b = baseline_from(report, fraction=0.7, previous=Baseline(values={"gemm_gflops": 5.0}))
    assert b.values["gemm_gflops"] == 5.0 and b.fraction == 0.7 and "cpu_steps_per_s_per_core" in b.values
