"""GEMM time of one training step at a stated fraction of the GPU's peak.

Per weight matrix (k x n) and m tokens the forward matmul is 2 m k n flops; backward is twice
that, and activation recomputation repeats the forward: 8 m k n in all. A layer's four matrices
hold 12 H^2 weights, so one step is 8 x tokens x params flops, spread evenly over the GPUs (every
configuration of the grid divides the same work by the same number of GPUs).
"""

from __future__ import annotations

from fireflyer.core.errors import InvalidArgument
from fireflyer.planner.models import ModelShape
from fireflyer.planner.topology import Topology

__all__ = ["step_flops", "compute_s", "DEFAULT_EFFICIENCY"]

#: fraction of peak a large bf16 GEMM reaches; AxoNN reports 57% of peak end to end on Perlmutter
DEFAULT_EFFICIENCY = 0.5


def step_flops(model: ModelShape, batch: int, seq: int) -> float:
    return 8.0 * batch * seq * model.params


def compute_s(model: ModelShape, gpus: int, batch: int, seq: int, topo: Topology, *,
              efficiency: float = DEFAULT_EFFICIENCY) -> float:
    if not 0 < efficiency <= 1:
        raise InvalidArgument(f"GEMM efficiency must be in (0, 1], got {efficiency}",
                              argument="efficiency", value=efficiency)
    return step_flops(model, batch, seq) / gpus / (topo.gpu_peak_flops * efficiency)
