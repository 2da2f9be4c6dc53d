"""Enumerate (col, row, depth, data), exclude what cannot run, rank the rest.

The published constraints: every size is a power of two, their product is the GPU count, the
tensor degree col x row x depth is at least the model's minimum, and the batch divides by
depth x data. With the memory term on, configurations that do not fit the GPU are excluded too;
with the compute term on, the ranking is by step time (GEMM time + communication, no overlap
assumed) instead of communication alone. Ties keep the enumeration order (col, then row, depth,
data, ascending), the order the released model's stable sort leaves them in.
"""

from __future__ import annotations

from collections import Counter

import msgspec

from fireflyer.core.errors import InvalidArgument
from fireflyer.planner.comm import DimTimes, Grid, step_comm
from fireflyer.planner.compute import DEFAULT_EFFICIENCY, compute_s
from fireflyer.planner.memory import MemoryEstimate, memory_per_gpu
from fireflyer.planner.models import ModelShape
from fireflyer.planner.topology import Topology

__all__ = ["Candidate", "Plan", "PlanRequest", "plan", "powers_of_two", "validate",
           "EXCLUDED_TENSOR", "EXCLUDED_BATCH", "EXCLUDED_MEMORY"]

EXCLUDED_TENSOR = "tensor degree below the model's minimum"
EXCLUDED_BATCH = "batch not divisible by depth x data"
EXCLUDED_MEMORY = "does not fit in GPU memory"


class PlanRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: ModelShape
    topology: Topology
    gpus: int
    batch: int
    seq: int = 2048
    memory: bool = True
    compute: bool = True
    efficiency: float = DEFAULT_EFFICIENCY
    #: fraction of GPU memory kept free for what the estimate leaves out
    headroom: float = 0.1
    grad_acc: int = 1


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    grid: Grid
    comm: DimTimes
    compute_s: float
    memory: MemoryEstimate | None

    @property
    def comm_s(self) -> float:
        return self.comm.total

    @property
    def step_s(self) -> float:
        return self.comm.total + self.compute_s


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    request: PlanRequest
    ranked: list[Candidate]
    excluded: dict[str, int]
    considered: int


def powers_of_two(n: int) -> list[int]:
    out, p = [], 1
    while p <= n:
        out.append(p)
        p *= 2
    return out


def _is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def validate(req: PlanRequest) -> None:
    """Refuse inputs no configuration could serve, naming the argument at fault."""
    g, b = req.gpus, req.batch
    if not _is_pow2(g):
        raise InvalidArgument(f"--gpus must be a power of two, got {g}", argument="gpus", value=g)
    if g % req.model.min_tensor:
        raise InvalidArgument(f"--gpus {g} is not divisible by model {req.model.name}'s minimum tensor degree "
                              f"{req.model.min_tensor}", argument="gpus", value=g)
    if g > req.topology.gpus_per_node and g % req.topology.gpus_per_node:
        raise InvalidArgument(f"--gpus {g} is not divisible by the {req.topology.gpus_per_node} GPUs per node of "
                              f"{req.topology.name}", argument="gpus", value=g)
    if b < 1 or req.seq < 1:
        raise InvalidArgument(f"--batch and --seq must be positive, got {b} and {req.seq}",
                              argument="batch" if b < 1 else "seq", value=b if b < 1 else req.seq)
    # every replica slice (depth x data) must get whole samples even at the smallest tensor degree
    slices = g // req.model.min_tensor
    if b % slices:
        raise InvalidArgument(f"--batch {b} is not divisible by {slices} (= gpus {g} / minimum tensor degree "
                              f"{req.model.min_tensor}); use a multiple of {slices}", argument="batch", value=b)
    if req.grad_acc < 1:
        raise InvalidArgument(f"grad_acc must be >= 1, got {req.grad_acc}", argument="grad_acc", value=req.grad_acc)


def plan(req: PlanRequest) -> Plan:
    validate(req)
    sizes = powers_of_two(req.gpus)
    excluded: Counter[str] = Counter()
    scored: list[tuple[float, int, Candidate]] = []
    considered = 0
    budget = req.topology.gpu_memory_bytes * (1 - req.headroom)
    t_compute = (compute_s(req.model, req.gpus, req.batch, req.seq, req.topology, efficiency=req.efficiency)
                 if req.compute else 0.0)
    for col in sizes:
        for row in sizes:
            for depth in sizes:
                for data in sizes:
                    grid = Grid(col, row, depth, data)
                    if grid.gpus != req.gpus:
                        continue
                    considered += 1
                    if grid.tensor < req.model.min_tensor:
                        excluded[EXCLUDED_TENSOR] += 1
                        continue
                    if req.batch % (depth * data):
                        excluded[EXCLUDED_BATCH] += 1
                        continue
                    mem = None
                    if req.memory:
                        mem = memory_per_gpu(req.model, grid, req.batch, req.seq, grad_acc=req.grad_acc)
                        if mem.total > budget:
                            excluded[EXCLUDED_MEMORY] += 1
                            continue
                    comm = step_comm(req.model, grid, req.batch, req.seq, req.topology, grad_acc=req.grad_acc)
                    cand = Candidate(grid=grid, comm=comm, compute_s=t_compute, memory=mem)
                    scored.append((cand.step_s, len(scored), cand))
    scored.sort(key=lambda x: (x[0], x[1]))
    return Plan(request=req, ranked=[c for _, _, c in scored], excluded=dict(excluded), considered=considered)
