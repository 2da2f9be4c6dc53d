"""GEMM with checksum verification (ABFT), sized to a memory budget.

``C = A @ B`` in float32: on the GPU through torch when there is one (the matrices are made, used
and checked on the device; only vectors come back), else with numpy.  Huang & Abraham's
algorithm-based fault tolerance checks the product without a second GEMM: the row sums of C must
equal ``A (B 1)`` and the column sums ``(1ᵀA) B`` — matrix-vector products, done in float64 over
blocks of rows so the float64 temporaries stay small next to a budget that fills the memory.  The
tolerance is the float32 rounding bound of a length-k dot product, ``2·k·eps·(|A| |B| 1)``, per row
(and column); a corrupted element shows in one row sum and one column sum, which name it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .result import Baseline, CheckResult, Status, slow_down

__all__ = ["INJECTIONS", "METRIC", "gemm_size", "abft_verify", "check_gemm"]

INJECTIONS = ("corrupt", "slow")
METRIC = "gemm_gflops"
_EPS32 = float(np.finfo(np.float32).eps)
#: rows per float64 block of the checksum pass
_BLOCK = 1024


def gemm_size(budget_bytes: int, itemsize: int = 4, multiple: int = 64) -> int:
    """The largest n (a multiple of ``multiple``) whose A, B and C (n×n each) fit ``budget_bytes``."""
    n = int(math.isqrt(max(0, budget_bytes) // (3 * itemsize)))
    return max(multiple, n // multiple * multiple)


class _Np:
    """The few array operations the checksums need, for numpy..."""

    @staticmethod
    def f64(x: Any) -> Any:
        return x.astype(np.float64)

    @staticmethod
    def host(x: Any) -> np.ndarray:
        return np.asarray(x)

    @staticmethod
    def zeros(n: int, like: Any) -> Any:
        return np.zeros(n, dtype=np.float64)


class _Torch:
    """...and for torch tensors (any device)."""

    @staticmethod
    def f64(x: Any) -> Any:
        import torch

        return x.to(torch.float64)

    @staticmethod
    def host(x: Any) -> np.ndarray:
        return x.detach().cpu().numpy()

    @staticmethod
    def zeros(n: int, like: Any) -> Any:
        import torch

        return torch.zeros(n, dtype=torch.float64, device=like.device)


def abft_verify(a: Any, b: Any, c: Any, block: int = _BLOCK) -> tuple[list[int], list[int], float]:
    """(bad rows, bad columns, worst error / tolerance) of ``c == a @ b`` by row/column checksums;
    ``a``, ``b``, ``c`` are numpy arrays or torch tensors (on any device)."""
    xp: Any = _Np if isinstance(a, np.ndarray) else _Torch
    n, k = a.shape
    b_rows = xp.zeros(k, b)  # B 1, and |B| 1
    b_abs_rows = xp.zeros(k, b)
    col_a = xp.zeros(k, a)  # 1ᵀA, and 1ᵀ|A|
    col_a_abs = xp.zeros(k, a)
    for s in range(0, k, block):
        bb = xp.f64(b[s:s + block])
        b_rows[s:s + block] = bb.sum(1)
        b_abs_rows[s:s + block] = abs(bb).sum(1)
    row_err, c_cols = [], xp.zeros(c.shape[1], c)
    for s in range(0, n, block):
        ab = xp.f64(a[s:s + block])
        cb = xp.f64(c[s:s + block])
        col_a += ab.sum(0)
        col_a_abs += abs(ab).sum(0)
        c_cols += cb.sum(0)
        tol = 2 * k * _EPS32 * (abs(ab) @ b_abs_rows) + 1e-30
        row_err.append(xp.host(abs(cb.sum(1) - ab @ b_rows) / tol))
    col_want = xp.zeros(c.shape[1], c)
    col_tol = xp.zeros(c.shape[1], c)
    for s in range(0, k, block):  # (1ᵀA) B and (1ᵀ|A|) |B|, by blocks of B's rows
        bb = xp.f64(b[s:s + block])
        col_want += col_a[s:s + block] @ bb
        col_tol += col_a_abs[s:s + block] @ abs(bb)
    rows = np.concatenate(row_err) if row_err else np.zeros(0)
    cols = xp.host(abs(c_cols - col_want) / (2 * k * _EPS32 * col_tol + 1e-30))
    worst = float(max(rows.max(initial=0), cols.max(initial=0)))
    return np.flatnonzero(rows > 1).tolist(), np.flatnonzero(cols > 1).tolist(), worst


def _device(device: str) -> str:
    if device != "auto":
        return device
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def _numpy_gemm(n: int, seed: int) -> tuple[Any, Any, Any, float]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    np.matmul(a[:8, :8], b[:8, :8])  # start the BLAS threads outside the timing
    t0 = time.perf_counter()
    c = a @ b
    return a, b, c, time.perf_counter() - t0


def _torch_gemm(n: int, seed: int, device: str) -> tuple[Any, Any, Any, float]:
    """On ``device`` ("cuda", "cuda:1"; "torch:cpu" runs this path on the host, for tests)."""
    import torch

    dev = torch.device(device.removeprefix("torch:"))
    gen = torch.Generator(device=dev).manual_seed(seed)
    a = torch.randn((n, n), generator=gen, device=dev, dtype=torch.float32)
    b = torch.randn((n, n), generator=gen, device=dev, dtype=torch.float32)
    c = torch.empty((n, n), device=dev, dtype=torch.float32)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.matmul(a[:8, :8], b[:8, :8])
    sync()
    t0 = time.perf_counter()
    torch.matmul(a, b, out=c)
    sync()
    return a, b, c, time.perf_counter() - t0


def check_gemm(baseline: Baseline, *, budget_bytes: int = 64 << 20, n: int | None = None, device: str = "auto",
               seed: int = 0, inject: str = "") -> CheckResult:
    """One n×n float32 GEMM (n from ``budget_bytes`` unless given), verified by ABFT checksums.
    ``device``: "auto" (CUDA when torch sees a GPU, else numpy), "cpu" (numpy), or a torch device."""
    if inject and inject not in INJECTIONS:
        raise ValueError(f"check_gemm: unknown injection {inject!r}; known: {', '.join(INJECTIONS)}")
    n = n or gemm_size(budget_bytes)
    dev = _device(device)
    t_all = time.perf_counter()
    try:
        a, b, c, dt = _numpy_gemm(n, seed) if dev == "cpu" else _torch_gemm(n, seed, dev)
    except Exception as e:  # noqa: BLE001 - a device that cannot run a GEMM is the finding
        return CheckResult("gemm", Status.ERROR, f"GEMM {n}x{n} on {dev} failed: {e}", {"n": n, "device": dev},
                           time.perf_counter() - t_all, inject)
    if inject == "slow":  # a clocked-down GPU: a twentieth of its speed
        dt = slow_down(dt, baseline.expected_s(METRIC, 2 * n ** 3 / 1e9))
    if inject == "corrupt":
        i, j = n // 3, (2 * n) // 3
        # one wrong element, as a bad SM or HBM word leaves it (max and min: no n×n temporary on a full GPU)
        c[i, j] += 1e3 * (max(abs(float(c.max())), abs(float(c.min()))) + 1.0)
    rows, cols, worst = abft_verify(a, b, c)
    gflops = 2 * n ** 3 / max(dt, 1e-9) / 1e9
    ok, ev = baseline.judge(METRIC, gflops)
    evidence = {**ev, "n": n, "device": dev, "bytes": 3 * n * n * 4, "gemm_s": dt, "worst_error_over_tol": worst,
                "bad_rows": rows[:16], "bad_cols": cols[:16]}
    wall = time.perf_counter() - t_all
    if rows or cols:
        where = f"element ({rows[0]}, {cols[0]})" if rows and cols else f"rows {rows[:4]} cols {cols[:4]}"
        return CheckResult("gemm", Status.FAIL, f"checksum mismatch at {where} of a {n}x{n} GEMM on {dev} "
                           f"(error {worst:.3g}x the rounding bound)", evidence, wall, inject)
    if not ok:
        return CheckResult("gemm", Status.FAIL, f"GEMM {gflops:.1f} GFLOP/s < {ev['threshold']:.1f} "
                           f"({baseline.fraction:.0%} of the baseline) on {dev}", evidence, wall, inject)
    return CheckResult("gemm", Status.PASS, f"{n}x{n} GEMM on {dev} verified, {gflops:.1f} GFLOP/s", evidence, wall,
                       inject)
