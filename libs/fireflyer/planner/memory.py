"""Memory per GPU of a configuration, against the GPU's memory.

Every term is per GPU and in bytes; the estimate follows the layout of comm.py:

* parameters: bf16 weights, sharded over col x row x depth (2 bytes each);
* gradients: fp32 (4 bytes), sharded like the weights;
* optimizer state: Adam's fp32 master weights, first and second moments (12 bytes), sharded too;
* gathered weights: the largest tile all-gathered over depth before its matmul (the mlp weights,
  4 H^2 / (col x row), bf16), held twice so the next gather can overlap the current matmul;
* activations: with activation recomputation, each layer keeps its input (m x H / col, bf16,
  m = tokens per (depth, data) slice); one layer at a time is live during recomputation and
  backward: qkv (3H / row), attention output (H / col), mlp up before and after the activation
  function (2 x 4H / row) and mlp down (H / col).

Embeddings, attention scores (flash attention keeps none) and framework buffers are left out, so
treat the result as a floor; ``headroom`` keeps a fraction of the GPU free for them.
"""

from __future__ import annotations

import msgspec

from fireflyer.planner.comm import ACT_BYTES, Grid
from fireflyer.planner.models import ModelShape

__all__ = ["MemoryEstimate", "memory_per_gpu", "PARAM_BYTES", "GRAD_STATE_BYTES", "OPTIMIZER_BYTES"]

PARAM_BYTES = 2
GRAD_STATE_BYTES = 4
OPTIMIZER_BYTES = 12


class MemoryEstimate(msgspec.Struct, frozen=True):
    parameters: float
    gradients: float
    optimizer: float
    gathered: float
    activations: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.gathered + self.activations


def memory_per_gpu(model: ModelShape, grid: Grid, batch: int, seq: int, *, grad_acc: int = 1) -> MemoryEstimate:
    h = model.hidden
    shard = model.params / grid.tensor
    m = batch * seq / (grid.depth * grid.data) / grad_acc  # tokens of one micro-batch per slice
    checkpoints = model.layers * m * h / grid.col * ACT_BYTES
    live_layer = m * (3 * h / grid.row + h / grid.col + 2 * 4 * h / grid.row + h / grid.col) * ACT_BYTES
    gathered = 2 * 4 * h * h / (grid.col * grid.row) * PARAM_BYTES if grid.depth > 1 else 0.0
    return MemoryEstimate(
        parameters=shard * PARAM_BYTES,
        gradients=shard * GRAD_STATE_BYTES,
        optimizer=shard * OPTIMIZER_BYTES,
        gathered=gathered,
        activations=checkpoints + live_layer,
    )
