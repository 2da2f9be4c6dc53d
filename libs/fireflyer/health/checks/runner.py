"""Run the checks at a level, as DCGM's ``dcgmi diag -r N`` does, against the node's baseline.

Level 1 takes seconds (before a node is admitted), level 2 minutes (after a failed job), level 3 is
the long periodic run (weekly by default: GEMM over most of the accelerator's memory, gigabytes of
pattern tests).  A level is a :class:`LevelPlan` of sizes; pass ``plan=`` to change them (tests use
tiny ones).  ``inject={"gemm": "corrupt"}`` runs a check with a simulated fault, which must FAIL.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import msgspec

from . import allreduce as _allreduce
from . import cpu as _cpu
from . import gemm as _gemm
from . import hardware as _hardware
from . import memory as _memory
from . import storage as _storage
from .result import Baseline, CheckResult, NodeSpec, Status, worst

__all__ = ["CHECKS", "INJECTIONS", "LevelPlan", "LEVELS", "NodeReport", "run_level", "baseline_from"]

#: every check, in the order a level runs them (cheap and decisive first)
CHECKS = ("hardware", "cpu", "memory_bandwidth", "memory_pattern", "gemm", "allreduce", "storage")

#: check -> the faults it can simulate
INJECTIONS: dict[str, tuple[str, ...]] = {
    "hardware": _hardware.INJECTIONS, "cpu": _cpu.INJECTIONS, "memory_bandwidth": _memory.BW_INJECTIONS,
    "memory_pattern": _memory.PATTERN_INJECTIONS, "gemm": _gemm.INJECTIONS, "allreduce": _allreduce.INJECTIONS,
    "storage": _storage.INJECTIONS,
}

#: check -> the evidence keys that are throughputs (what a baseline records)
_METRICS = {"cpu": (_cpu.METRIC,), "memory_bandwidth": (_memory.BW_METRIC,), "gemm": (_gemm.METRIC,),
            "allreduce": (_allreduce.METRIC,), "storage": (_storage.WRITE_METRIC, _storage.READ_METRIC)}


class LevelPlan(msgspec.Struct, frozen=True):
    cpu_n: int = 4096
    cpu_rounds: int = 200
    mem_bw_mib: int = 64
    mem_bw_repeats: int = 3
    pattern_mib: float = 16
    pattern_tests: tuple[str, ...] = ("address_in_address",)
    #: bytes of A, B and C together; 0: 85 % of the free GPU memory (the paper's "GEMM using full GPU memory")
    gemm_budget_bytes: int = 64 << 20
    allreduce_mib: float = 4
    allreduce_iters: int = 2
    storage_files: int = 2
    storage_mib: float = 4


_ALL_PATTERNS = ("walking_ones", "address_in_address", "moving_inversions")

LEVELS: dict[int, LevelPlan] = {
    1: LevelPlan(),
    2: LevelPlan(cpu_n=1 << 16, cpu_rounds=2000, mem_bw_mib=256, mem_bw_repeats=10, pattern_mib=256,
                 pattern_tests=_ALL_PATTERNS, gemm_budget_bytes=1 << 30, allreduce_mib=64, allreduce_iters=10,
                 storage_files=8, storage_mib=64),
    3: LevelPlan(cpu_n=1 << 20, cpu_rounds=5000, mem_bw_mib=1024, mem_bw_repeats=20, pattern_mib=4096,
                 pattern_tests=_ALL_PATTERNS, gemm_budget_bytes=0, allreduce_mib=256, allreduce_iters=20,
                 storage_files=16, storage_mib=256),
}


class NodeReport(msgspec.Struct, frozen=True):
    level: int
    status: Status
    results: list[CheckResult]
    #: check -> why it did not run (no file system or communicator given)
    not_run: dict[str, str] = {}
    duration_s: float = 0.0

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status is not Status.PASS]


def _gpu_budget() -> int:
    try:
        import torch

        if torch.cuda.is_available():
            free, _total = torch.cuda.mem_get_info()
            return int(free * 0.85)  # the rest: float64 blocks of the checksum pass
    except ImportError:
        pass
    return 8 << 30  # no GPU: a host GEMM over 8 GiB


def run_level(level: int, spec: NodeSpec, baseline: Baseline, *, inject: Mapping[str, str] | None = None,
              sysfs_root: str = "/sys", fs: Any = None, comm: Any = None, plan: LevelPlan | None = None,
              checks: tuple[str, ...] = CHECKS) -> NodeReport:
    """Run ``checks`` at ``level`` (sizes from ``plan`` when given) and return every result.

    ``fs`` (a 3FS FileSystem or LocalFS) enables the storage check, ``comm`` (an HFReduce
    communicator of this node's ranks) the allreduce check; without them they are listed in
    ``not_run``.  A check that raises is an ERROR result, never an exception out of the runner."""
    if level not in LEVELS and plan is None:
        raise ValueError(f"run_level: level must be one of {sorted(LEVELS)}, not {level}")
    p = plan or LEVELS[level]
    inject = dict(inject or {})
    for name, fault in inject.items():
        if name not in INJECTIONS or fault not in INJECTIONS[name]:
            raise ValueError(f"run_level: cannot inject {fault!r} into {name!r}; known: {INJECTIONS}")
    runs = {
        "hardware": lambda f: _hardware.check_hardware(spec, sysfs_root, inject=f),
        "cpu": lambda f: _cpu.check_cpu(baseline, n=p.cpu_n, rounds=p.cpu_rounds, inject=f),
        "memory_bandwidth": lambda f: _memory.check_memory_bandwidth(baseline, mib=p.mem_bw_mib,
                                                                     repeats=p.mem_bw_repeats, inject=f),
        "memory_pattern": lambda f: _memory.check_memory_pattern(mib=p.pattern_mib, tests=p.pattern_tests, inject=f),
        "gemm": lambda f: _gemm.check_gemm(baseline, budget_bytes=p.gemm_budget_bytes or _gpu_budget(), inject=f),
        "allreduce": lambda f: _allreduce.check_allreduce(comm, baseline, mib=p.allreduce_mib,
                                                          iters=p.allreduce_iters, inject=f),
        "storage": lambda f: _storage.check_storage(fs, baseline, files=p.storage_files, mib=p.storage_mib, inject=f),
    }
    not_run: dict[str, str] = {}
    results: list[CheckResult] = []
    t0 = time.perf_counter()
    for name in checks:
        if name == "allreduce" and comm is None:
            not_run[name] = "no HFReduce communicator given"
            continue
        if name == "storage" and fs is None:
            not_run[name] = "no file system given"
            continue
        fault = inject.get(name, "")
        t1 = time.perf_counter()
        try:
            results.append(runs[name](fault))
        except Exception as e:  # noqa: BLE001 - one broken check must not hide the others' verdicts
            results.append(CheckResult(name, Status.ERROR, f"{name} check raised {type(e).__name__}: {e}", {},
                                       time.perf_counter() - t1, fault))
    return NodeReport(level=level, status=worst([r.status for r in results]), results=results, not_run=not_run,
                      duration_s=time.perf_counter() - t0)


def baseline_from(report: NodeReport, fraction: float = 0.5, previous: Baseline | None = None) -> Baseline:
    """A baseline from a good run's throughputs (on top of ``previous``); failed checks add nothing."""
    values: dict[str, float] = {}
    for r in report.results:
        if r.status is Status.PASS and not r.injected:
            for m in _METRICS.get(r.check, ()):
                if isinstance(r.evidence.get(m), int | float):
                    values[m] = float(r.evidence[m])
    base = previous.values if previous is not None else {}
    return Baseline(values={**base, **values}, fraction=fraction)
