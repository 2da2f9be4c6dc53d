"""GEMM with checksum verification (ABFT), sized to a memory budget.

``C = A @ B`` in float32 on the GPU when torch sees one, else with numpy.  Huang & Abraham's
algorithm-based fault tolerance checks the product without a second GEMM: the column sums of C must
equal ``(1ᵀA) B`` and the row sums ``A (B 1)`` (two matrix-vector products, in float64).  The
tolerance is the float32 rounding bound of a length-k dot product, ``k·eps·(|A| |B| 1)``, per row
(and column); a corrupted element shows in one row sum and one column sum, which name it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .result import Baseline, CheckResult, Status

__all__ = ["INJECTIONS", "METRIC", "gemm_size", "abft_verify", "check_gemm"]

INJECTIONS = ("corrupt", "slow")
METRIC = "gemm_gflops"


def gemm_size(budget_bytes: int, itemsize: int = 4, multiple: int = 64) -> int:
    """The largest n (a multiple of ``multiple``) whose A, B and C (n×n each) fit ``budget_bytes``."""
    n = int(math.isqrt(max(0, budget_bytes) // (3 * itemsize)))
    return max(multiple, n // multiple * multiple)


def abft_verify(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[list[int], list[int], float]:
    """(bad rows, bad columns, worst error / tolerance) of ``c == a @ b`` by row/column checksums."""
    a64, b64, c64 = a.astype(np.float64), b.astype(np.float64), c.astype(np.float64)
    k = a.shape[1]
    eps = float(np.finfo(np.float32).eps)
    row_want = a64 @ b64.sum(axis=1)  # A (B 1)
    col_want = a64.sum(axis=0) @ b64  # (1ᵀA) B
    row_tol = 2 * k * eps * (np.abs(a64) @ np.abs(b64).sum(axis=1)) + 1e-30
    col_tol = 2 * k * eps * (np.abs(a64).sum(axis=0) @ np.abs(b64)) + 1e-30
    row_err = np.abs(c64.sum(axis=1) - row_want) / row_tol
    col_err = np.abs(c64.sum(axis=0) - col_want) / col_tol
    worst = float(max(row_err.max(initial=0), col_err.max(initial=0)))
    return np.flatnonzero(row_err > 1).tolist(), np.flatnonzero(col_err > 1).tolist(), worst


def _device(device: str) -> str:
    if device != "auto":
        return device
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def _matmul(a: np.ndarray, b: np.ndarray, device: str) -> tuple[np.ndarray, float]:
    if device == "cpu":
        np.matmul(a[:8, :8], b[:8, :8])  # warm the BLAS threads outside the timing
        t0 = time.perf_counter()
        c = a @ b
        return c, time.perf_counter() - t0
    import torch

    ta, tb = torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)
    torch.matmul(ta[:8, :8], tb[:8, :8])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tc = ta @ tb
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    out: Any = tc.cpu().numpy()
    return out, dt


def check_gemm(baseline: Baseline, *, budget_bytes: int = 64 << 20, n: int | None = None, device: str = "auto",
               seed: int = 0, inject: str = "") -> CheckResult:
    """One n×n float32 GEMM (n from ``budget_bytes`` unless given), verified by ABFT checksums."""
    if inject and inject not in INJECTIONS:
        raise ValueError(f"check_gemm: unknown injection {inject!r}; known: {', '.join(INJECTIONS)}")
    n = n or gemm_size(budget_bytes)
    dev = _device(device)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    t0 = time.perf_counter()
    try:
        c, dt = _matmul(a, b, dev)
    except Exception as e:  # noqa: BLE001 - a GPU that cannot run a GEMM is the finding
        return CheckResult("gemm", Status.ERROR, f"GEMM {n}x{n} on {dev} failed: {e}", {"n": n, "device": dev},
                           time.perf_counter() - t0, inject)
    if inject == "slow":
        time.sleep(19 * dt)  # a clocked-down GPU: a twentieth of its speed
        dt *= 20
    if inject == "corrupt":
        i, j = n // 3, (2 * n) // 3
        c[i, j] += 1e3 * (float(np.abs(c).max()) + 1.0)  # one wrong element, as a bad SM or HBM word leaves it
    rows, cols, worst = abft_verify(a, b, c)
    gflops = 2 * n ** 3 / max(dt, 1e-9) / 1e9
    ok, ev = baseline.judge(METRIC, gflops)
    evidence = {**ev, "n": n, "device": dev, "bytes": 3 * n * n * 4, "gemm_s": dt, "worst_error_over_tol": worst,
                "bad_rows": rows[:16], "bad_cols": cols[:16]}
    wall = time.perf_counter() - t0
    if rows or cols:
        where = f"element ({rows[0]}, {cols[0]})" if rows and cols else f"rows {rows[:4]} cols {cols[:4]}"
        return CheckResult("gemm", Status.FAIL, f"checksum mismatch at {where} of a {n}x{n} GEMM on {dev} "
                           f"(error {worst:.3g}x the rounding bound)", evidence, wall, inject)
    if not ok:
        return CheckResult("gemm", Status.FAIL, f"GEMM {gflops:.1f} GFLOP/s < {ev['threshold']:.1f} "
                           f"({baseline.fraction:.0%} of the baseline) on {dev}", evidence, wall, inject)
    return CheckResult("gemm", Status.PASS, f"{n}x{n} GEMM on {dev} verified, {gflops:.1f} GFLOP/s", evidence, wall,
                       inject)
