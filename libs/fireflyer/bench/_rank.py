"""One rank of ``ff bench allreduce``: time allreduces with HFReduce or with torch.distributed/Gloo.

    python -m fireflyer.bench._rank --mode hfreduce --sizes 4,1048576 --dtype fp32

Run under the launcher (it reads the rank environment).  Both modes do the
same thing per size, so the two are comparable:

1. allocate the buffer once (HFReduce: ``comm.empty``, the zero-copy shared
   memory; Gloo: a torch tensor), fill it with ones;
2. one warm-up allreduce whose result is checked (every element == world
   size: a benchmark of a wrong allreduce is worthless), then zeros (so the
   timed loop cannot overflow into Inf);
3. :func:`probe_ops` more ops timed to estimate one op (more for small sizes:
   the first few small ops are slow, and two of them made the timed loop a
   tenth of ``--target-s``), the median of their times; the ranks agree on the
   estimate with one small allreduce (the mean over ranks, identical on every
   rank because it is the same reduced value), and derive the same number of
   timed iterations from it, so each size takes about ``--target-s``;
4. barrier, then the timed iterations back to back; the rank prints its mean
   time per op as one JSON line ``{"ff_bench_rank": {...}}`` on stdout.

The bench takes the max over ranks of those means (the collective is as slow
as its slowest rank).  A dtype Gloo cannot reduce is reported as
``"unsupported"`` instead of failing the run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

__all__ = ["main", "iterations", "probe_ops", "RESULT_KEY"]

RESULT_KEY = "ff_bench_rank"
#: ops of at most this many bytes are probed with ``PROBE_SMALL`` ops, larger ones with ``PROBE``
PROBE, PROBE_SMALL, SMALL_BYTES = 2, 32, 1 << 20


def probe_ops(size_bytes: int) -> int:
    """How many ops estimate one op's time (the same on every rank: it depends on the size only)."""
    return PROBE_SMALL if size_bytes <= SMALL_BYTES else PROBE


def iterations(probe_s: float, target_s: float, *, min_iters: int = 3, max_iters: int = 20000) -> int:
    """Timed iterations so that the loop takes about ``target_s`` given one op takes ``probe_s``."""
    if not probe_s > 0 or math.isnan(probe_s):
        return max_iters
    return int(max(min_iters, min(max_iters, target_s / probe_s)))


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({RESULT_KEY: record}) + "\n")
    sys.stdout.flush()


class _Backend(Protocol):
    """What the timing loop needs from a collective library."""

    rank: int
    world: int

    def alloc(self, count: int, dtype_name: str) -> Any: ...
    def fill(self, buf: Any, value: float) -> None: ...
    def check(self, buf: Any, expected: float) -> bool: ...
    def allreduce(self, buf: Any) -> None: ...
    def mean_over_ranks(self, value: float) -> float: ...
    def barrier(self) -> None: ...
    def close(self) -> None: ...


class _HFReduce:
    def __init__(self) -> None:
        from fireflyer import hfreduce
        from fireflyer.hfreduce.kernels import dtype_from_name

        self._dtype_from_name = dtype_from_name
        # (records only when the phases are printed: they cost a small op ~10 us per side)
        self.comm = hfreduce.init(op_records=bool(os.environ.get("FF_BENCH_PHASES")))  # type: ignore[attr-defined]
        self.rank = int(os.environ["FF_RANK"])
        self.world = int(os.environ["FF_WORLD_SIZE"])
        self.phases = {"local_reduce_s": 0.0, "tree_s": 0.0, "writeback_s": 0.0}
        self.nops = 0

    def alloc(self, count: int, dtype_name: str) -> Any:
        return self.comm.empty(count, self._dtype_from_name(dtype_name))

    def fill(self, buf: Any, value: float) -> None:
        buf[...] = value

    def check(self, buf: Any, expected: float) -> bool:
        return bool(np.all(buf.astype(np.float32) == np.float32(expected)))

    def allreduce(self, buf: Any) -> None:
        w = self.comm.allreduce(buf, op="sum", async_op=True)
        w.wait()
        rec = w.record
        if rec is not None:  # the worker's phase split of the op (FF_BENCH_PHASES=1 prints it)
            for k in self.phases:
                self.phases[k] += getattr(rec, k, 0.0)
            self.nops += 1

    def take_phases(self) -> dict[str, float]:
        out = {k: v / max(1, self.nops) for k, v in self.phases.items()}
        self.phases = dict.fromkeys(self.phases, 0.0)
        self.nops = 0
        return out

    def mean_over_ranks(self, value: float) -> float:
        x = np.array([value], dtype=np.float32)
        self.comm.allreduce(x, op="sum")
        return float(x[0]) / self.world

    def barrier(self) -> None:
        self.comm.barrier()

    def close(self) -> None:
        self.comm.close()


class _Gloo:
    _DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
               "fp16": "float16", "float16": "float16"}

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        torch.set_num_threads(1)
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world)

    def alloc(self, count: int, dtype_name: str) -> Any:
        return self.torch.zeros(count, dtype=getattr(self.torch, self._DTYPES[dtype_name]))

    def fill(self, buf: Any, value: float) -> None:
        buf.fill_(value)

    def check(self, buf: Any, expected: float) -> bool:
        return bool((buf.float() == expected).all())

    def allreduce(self, buf: Any) -> None:
        self.dist.all_reduce(buf)

    def mean_over_ranks(self, value: float) -> float:
        x = self.torch.tensor([value], dtype=self.torch.float64)
        self.dist.all_reduce(x)
        return float(x[0]) / self.world

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        self.dist.destroy_process_group()


def _time_size(be: _Backend, size_bytes: int, dtype_name: str, itemsize: int, target_s: float) -> dict[str, Any]:
    count = max(1, size_bytes // itemsize)
    buf = be.alloc(count, dtype_name)
    be.fill(buf, 1.0)
    be.allreduce(buf)
    if not be.check(buf, float(be.world)):
        raise SystemExit(f"rank {be.rank}: allreduce of {count} x {dtype_name} gave a wrong sum "
                         f"(expected every element == {be.world})")
    be.fill(buf, 0.0)
    took = []
    for _ in range(probe_ops(count * itemsize)):
        t0 = time.perf_counter()
        be.allreduce(buf)
        took.append(time.perf_counter() - t0)
    probe_s = be.mean_over_ranks(statistics.median(took))
    iters = iterations(probe_s, target_s)
    be.barrier()
    take = getattr(be, "take_phases", None)
    if take is not None:
        take()
    t0 = time.perf_counter()
    for _ in range(iters):
        be.allreduce(buf)
    elapsed = time.perf_counter() - t0
    out: dict[str, Any] = {"size_bytes": count * itemsize, "time_s": elapsed / iters, "iters": iters}
    if take is not None and os.environ.get("FF_BENCH_PHASES"):
        ph = take()
        sys.stderr.write(f"phases rank {be.rank} size {size_bytes}: "
                         + " ".join(f"{k}={v * 1e3:.2f}ms" for k, v in ph.items()) + "\n")
    return out


def run(mode: str, sizes: list[int], dtype_name: str, target_s: float) -> None:
    itemsize = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}[dtype_name]
    factories: dict[str, Callable[[], _Backend]] = {"hfreduce": _HFReduce, "gloo": _Gloo}
    be = factories[mode]()
    try:
        for size in sizes:
            base = {"mode": mode, "rank": be.rank, "world": be.world, "dtype": dtype_name, "requested_bytes": size}
            try:
                rec = _time_size(be, size, dtype_name, itemsize, target_s)
            except RuntimeError as e:
                text = str(e).lower()
                if mode == "gloo" and dtype_name != "fp32" and ("support" in text or "type" in text):
                    # Gloo lacks some reductions for low-precision types: say so, do not fail the bench
                    _emit({**base, "unsupported": str(e).splitlines()[0] if str(e) else type(e).__name__})
                    return
                raise
            _emit({**base, **rec})
        be.barrier()
    finally:
        be.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fireflyer.bench._rank", description=__doc__)
    p.add_argument("--mode", choices=["hfreduce", "gloo"], required=True)
    p.add_argument("--sizes", required=True, help="comma list of sizes in bytes")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--target-s", type=float, default=0.5, help="seconds of timed loop per size")
    ns = p.parse_args(argv)
    run(ns.mode, [int(s) for s in ns.sizes.split(",")], ns.dtype, ns.target_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
