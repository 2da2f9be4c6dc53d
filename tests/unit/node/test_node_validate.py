"""The node agent's validation: run_level in a worker thread with the health service's baseline,
sizes and injections; one at a time; bad requests refused naming the field."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from fireflyer.core.errors import FailedPrecondition, InvalidArgument
from fireflyer.health.checks import LevelPlan, Status
from services.node.validate import NodeValidator

TINY = msgspec.json.encode(LevelPlan(cpu_n=256, cpu_rounds=20, mem_bw_mib=4, mem_bw_repeats=1, pattern_mib=1,
                                     gemm_budget_bytes=1 << 20))


def test_a_level_1_validation_passes_and_reports_evidence() -> None:
    v = NodeValidator("node1")
    report = asyncio.run(v.validate(1, baseline={}, fraction=0.5, inject={}, plan_json=TINY))
    assert report.status is Status.PASS and report.level == 1
    checks = [r.check for r in report.results]
    assert checks == ["hardware", "cpu", "memory_bandwidth", "memory_pattern", "gemm"]
    assert "gemm_gflops" in next(r for r in report.results if r.check == "gemm").evidence
    assert set(report.not_run) == {"allreduce", "storage"}
    assert not v.busy


def test_an_injected_fault_fails_the_validation() -> None:
    report = asyncio.run(NodeValidator("node1").validate(1, baseline={}, fraction=0.5, inject={"gemm": "corrupt"},
                                                         plan_json=TINY))
    assert report.status is Status.FAIL
    gemm = next(r for r in report.results if r.check == "gemm")
    assert gemm.status is Status.FAIL and gemm.injected == "corrupt"


def test_a_second_validation_while_one_runs_is_refused() -> None:
    v = NodeValidator("node1")

    async def both() -> None:
        first = asyncio.create_task(v.validate(1, baseline={}, fraction=0.5, inject={}, plan_json=TINY))
        await asyncio.sleep(0)  # the first has marked the node busy and gone to its thread
        assert v.busy
        with pytest.raises(FailedPrecondition):
            await v.validate(1, baseline={}, fraction=0.5, inject={}, plan_json=TINY)
        await first
    asyncio.run(both())


@pytest.mark.parametrize(("kw", "field"), [
    (dict(level=7), "level"),
    (dict(inject={"gemm": "melt"}), "inject"),
    (dict(inject={"gpu": "corrupt"}), "inject"),
    (dict(fraction=2.0), "baseline_fraction"),
    (dict(plan_json=b'{"cpu_n": "many"}'), "plan_json"),
    (dict(spec_json=b'{"nics": 3}'), "spec_json"),
])
def test_bad_requests_name_the_field(kw: dict, field: str) -> None:  # type: ignore[type-arg]
    args = dict(level=1, baseline={}, fraction=0.5, inject={}, plan_json=TINY)
    args.update(kw)
    level = args.pop("level")
    with pytest.raises(InvalidArgument) as info:
        asyncio.run(NodeValidator("node1").validate(level, **args))  # type: ignore[arg-type]
    assert info.value.fields["field"] == field
