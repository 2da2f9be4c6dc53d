"""The validator's checks (the Fire-Flyer paper's list), each returning a
:class:`~.result.CheckResult` (PASS / FAIL / ERROR with evidence) and each with an ``inject=``
switch that simulates a fault and must make it FAIL:

- :mod:`.hardware` — CPU frequency and governor, NIC speed and state, PCIe link width and speed;
- :mod:`.cpu` — a deterministic integer kernel on every core: exact result and rate;
- :mod:`.memory` — STREAM triad bandwidth; walking ones, address in address, moving inversions;
- :mod:`.gemm` — GEMM sized to a memory budget, verified by ABFT row/column checksums;
- :mod:`.allreduce` — intra-node HFReduce allreduce of exact integers, bus bandwidth;
- :mod:`.storage` — 3FS write/read bandwidth with byte-for-byte read-back;
- :mod:`.runner` — ``run_level(level, spec, baseline, inject=...)`` at DCGM-like levels.
"""

from .result import Baseline, CheckResult, NicSpec, NodeSpec, PcieSpec, Status, worst
from .runner import CHECKS, INJECTIONS, LEVELS, LevelPlan, NodeReport, baseline_from, run_level

__all__ = ["Baseline", "CheckResult", "NicSpec", "NodeSpec", "PcieSpec", "Status", "worst", "CHECKS", "INJECTIONS",
           "LEVELS", "LevelPlan", "NodeReport", "baseline_from", "run_level"]
