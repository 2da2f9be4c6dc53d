"""CPU stress: a deterministic integer kernel on every core, exact result and throughput.

Each worker iterates a 64-bit linear congruential map ``x -> a*x + c (mod 2**64)`` over its own
vector of seeds for ``rounds`` rounds (numpy releases the GIL in the loops, so the threads run on
all cores).  The exact answer needs no second run: ``rounds`` steps of an affine map are one affine
map (composed by squaring), applied once to the seeds.  A wrong bit anywhere (a bad core, a bad
cache line) shows as a mismatch naming the worker; a throttled core as a rate under the baseline.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .result import Baseline, CheckResult, Status, slow_down

__all__ = ["INJECTIONS", "METRIC", "lcg_jump", "check_cpu"]

INJECTIONS = ("bitflip", "throttle")
#: the per-core rate compared with the baseline: LCG steps per second on the slowest worker
METRIC = "cpu_steps_per_s_per_core"

_A = 6364136223846793005  # Knuth's MMIX multiplier
_C = 1442695040888963407
_MASK = (1 << 64) - 1


def lcg_jump(rounds: int, a: int = _A, c: int = _C) -> tuple[int, int]:
    """(A, C) with ``rounds`` steps of ``x -> a*x + c`` equal to ``x -> A*x + C`` (mod 2**64)."""
    ra, rc = 1, 0  # the identity map
    while rounds:
        if rounds & 1:
            ra, rc = (ra * a) & _MASK, (rc * a + c) & _MASK
        a, c = (a * a) & _MASK, (c * a + c) & _MASK
        rounds >>= 1
    return ra, rc


def _seeds(worker: int, n: int) -> np.ndarray:
    return np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(worker + 1)


def _work(worker: int, n: int, rounds: int, inject: str, expected_s: float) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    x = _seeds(worker, n)
    a, c = np.uint64(_A), np.uint64(_C)
    with np.errstate(over="ignore"):
        for _ in range(rounds):
            x *= a
            x += c
    if inject == "bitflip" and worker == 0:
        x[n // 2] ^= np.uint64(1 << 17)  # one flipped bit, as a bad ALU or cache line would leave it
    elapsed = time.perf_counter() - t0
    if inject == "throttle" and worker == 0:
        elapsed = slow_down(elapsed, expected_s)  # a core at a twentieth of its clock
    return x, elapsed


def _expected(worker: int, n: int, rounds: int) -> np.ndarray:
    ja, jc = lcg_jump(rounds)
    with np.errstate(over="ignore"):
        return _seeds(worker, n) * np.uint64(ja) + np.uint64(jc)


def _first_mismatch(got: np.ndarray, want: np.ndarray) -> int:
    diff = np.flatnonzero(got != want)
    return int(diff[0]) if diff.size else -1


def check_cpu(baseline: Baseline, *, workers: int | None = None, n: int = 4096, rounds: int = 200,
              inject: str = "") -> CheckResult:
    """Run the kernel on ``workers`` threads (default: every core) over ``n`` seeds for ``rounds`` rounds."""
    if inject and inject not in INJECTIONS:
        raise ValueError(f"check_cpu: unknown injection {inject!r}; known: {', '.join(INJECTIONS)}")
    workers = workers or os.cpu_count() or 1
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers, thread_name_prefix="ff-health-cpu") as pool:
        expected = baseline.expected_s(METRIC, n * rounds)
        outs = list(pool.map(lambda w: _work(w, n, rounds, inject, expected), range(workers)))
    wall = time.perf_counter() - t0
    rates = [n * rounds / max(e, 1e-9) for _, e in outs]
    mism = {w: _first_mismatch(got, _expected(w, n, rounds)) for w, (got, _) in enumerate(outs)}
    bad = [w for w, i in mism.items() if i >= 0]
    slowest = min(range(workers), key=rates.__getitem__)
    ok_rate, ev = baseline.judge(METRIC, rates[slowest])
    evidence = {**ev, "workers": workers, "n": n, "rounds": rounds, "slowest_worker": slowest,
                "rates": [round(r) for r in rates], "total_steps_per_s": n * rounds * workers / wall,
                "wrong_workers": bad}
    if bad:
        w = bad[0]
        got, want = int(outs[w][0][mism[w]]), int(_expected(w, n, rounds)[mism[w]])
        evidence.update(index=mism[w], expected=want, got=got, xor=got ^ want)
        return CheckResult("cpu", Status.FAIL, f"wrong result on worker(s) {bad}: element {mism[w]} is {got:#x}, "
                           f"expected {want:#x} (bits {got ^ want:#x}): a core computes wrong bits",
                           evidence, wall, inject)
    if not ok_rate:
        return CheckResult("cpu", Status.FAIL, f"worker {slowest} ran {rates[slowest]:.3g} steps/s < "
                           f"{ev['threshold']:.3g} ({baseline.fraction:.0%} of the baseline): a throttled core",
                           evidence, wall, inject)
    return CheckResult("cpu", Status.PASS, f"{workers} workers exact, slowest {rates[slowest]:.3g} steps/s",
                       evidence, wall, inject)
