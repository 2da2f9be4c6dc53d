"""Intra-node allreduce through HFReduce, with exact integer data and its bandwidth.

Every local rank runs :func:`check_allreduce` with its communicator (``fireflyer.hfreduce.init()``
on a node, or anything with ``allreduce(x, op="sum")``, ``rank`` and ``world_size``).  Rank r
contributes ``x[i] = (i * (r + 1) + r) mod 2**20`` as int64, so the sum is known exactly in closed
form and any lost, doubled or corrupted block shows at its index.  Bandwidth is reported as NCCL's
bus bandwidth, ``algbw · 2(n−1)/n``.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from .result import Baseline, CheckResult, Status, slow_down

__all__ = ["INJECTIONS", "METRIC", "Comm", "rank_data", "expected_sum", "check_allreduce"]

INJECTIONS = ("wrong_data", "slow")
METRIC = "allreduce_busbw_gbps"
_MOD = 1 << 20


class Comm(Protocol):
    rank: int
    world_size: int

    def allreduce(self, x: Any, op: str = "sum", async_op: bool = False, *, timeout_s: float | None = None) -> Any: ...


def rank_data(rank: int, count: int) -> np.ndarray:
    i = np.arange(count, dtype=np.int64)
    return (i * (rank + 1) + rank) % _MOD


def expected_sum(world_size: int, count: int) -> np.ndarray:
    out = np.zeros(count, dtype=np.int64)
    for r in range(world_size):
        out += rank_data(r, count)
    return out


def check_allreduce(comm: Comm, baseline: Baseline, *, mib: float = 16, iters: int = 3, timeout_s: float = 60.0,
                    inject: str = "") -> CheckResult:
    """``iters`` allreduces of ``mib`` MiB of int64 on this rank; every result checked exactly."""
    if inject and inject not in INJECTIONS:
        raise ValueError(f"check_allreduce: unknown injection {inject!r}; known: {', '.join(INJECTIONS)}")
    count = max(1, int(mib * (1 << 20)) // 8)
    n = comm.world_size
    want = expected_sum(n, count)
    mine = rank_data(comm.rank, count)
    if inject == "wrong_data" and comm.rank == 0:
        mine[count // 2] += 1  # one rank feeds a wrong value (a bad copy engine, a stale buffer)
    x = mine.copy()
    best = float("inf")
    t_all = time.perf_counter()
    for it in range(iters):
        x[:] = mine
        t0 = time.perf_counter()
        try:
            comm.allreduce(x, op="sum", timeout_s=timeout_s)
        except Exception as e:  # noqa: BLE001 - a collective that cannot finish is the finding
            return CheckResult("allreduce", Status.ERROR, f"allreduce {it} on rank {comm.rank} failed: {e}",
                               {"rank": comm.rank, "world_size": n, "iteration": it}, time.perf_counter() - t_all,
                               inject)
        dt = time.perf_counter() - t0
        if inject == "slow" and comm.rank == 0:  # a link at a twentieth of its speed
            dt = slow_down(dt, baseline.expected_s(METRIC, count * 8 / 1e9 * (2 * (n - 1) / n if n > 1 else 1)))
        best = min(best, dt)
        bad = np.flatnonzero(x != want)
        if bad.size:
            i = int(bad[0])
            evidence = {"rank": comm.rank, "world_size": n, "iteration": it, "index": i, "expected": int(want[i]),
                        "got": int(x[i]), "wrong_elements": int(bad.size)}
            return CheckResult("allreduce", Status.FAIL, f"allreduce result wrong on rank {comm.rank}: element {i} "
                               f"is {int(x[i])}, expected {int(want[i])} ({bad.size} wrong)", evidence,
                               time.perf_counter() - t_all, inject)
    algbw = count * 8 / best / 1e9
    busbw = algbw * 2 * (n - 1) / n if n > 1 else algbw
    ok, ev = baseline.judge(METRIC, busbw)
    evidence = {**ev, "rank": comm.rank, "world_size": n, "bytes": count * 8, "best_s": best, "algbw_gbps": algbw}
    wall = time.perf_counter() - t_all
    if not ok:
        return CheckResult("allreduce", Status.FAIL, f"allreduce bus bandwidth {busbw:.3g} GB/s < "
                           f"{ev['threshold']:.3g} ({baseline.fraction:.0%} of the baseline)", evidence, wall, inject)
    return CheckResult("allreduce", Status.PASS, f"{iters} exact allreduces of {count * 8} bytes over {n} ranks, "
                       f"bus {busbw:.3g} GB/s", evidence, wall, inject)
