"""AxoNN's per-layer communication model: ring collectives per grid dimension.

A configuration is a 3D tensor grid col x row x depth times data parallelism (AxoNN's Gc, Gr,
Gd, Gdata). Each weight matrix is tiled over col x row and its tile sharded over depth; the tokens
of the global batch (batch x seq) are split over depth x data. Per weight matrix of width factor
``wide`` (H x wide*H), with ``m`` = tokens per (depth, data) slice:

* col group: all-reduce of the wide activations, m * wide*H / row elements, counted twice
  as the released model does (our reading: forward and recomputation);
* row group: all-reduce of the narrow activations, m * H / col elements, once;
  (transposed matrices swap the two roles: row carries the wide side split over col);
* depth group: two all-gathers and one reduce-scatter of the weight tile, wide*H*H / (col*row)
  elements, per gradient-accumulation step;
* data group: one all-reduce of the fp32 gradient shard, wide*H*H / (col*row*depth) elements.

Ring costs (bandwidth term only; M = bytes of the whole buffer, p = group size):
all-gather and reduce-scatter (p-1)/p * M / bw, all-reduce 2 (p-1)/p * M / bw. Activations and
weights move as bf16 (2 bytes), gradients as fp32 (4 bytes). The bandwidth of each group comes from
the topology and its placement: ranks vary fastest along col, then row, depth, data.
"""

from __future__ import annotations

import msgspec

from fireflyer.planner.models import GEMMS, Gemm, ModelShape
from fireflyer.planner.topology import Topology

__all__ = ["Grid", "DimTimes", "ring_allgather_s", "ring_reduce_scatter_s", "ring_allreduce_s",
           "gemm_comm", "layer_comm", "step_comm", "placements", "ACT_BYTES", "GRAD_BYTES"]

ACT_BYTES = 2  # bf16 activations and weights
GRAD_BYTES = 4  # fp32 gradients in the data-parallel all-reduce
DIMS = ("col", "row", "depth", "data")


class Grid(msgspec.Struct, frozen=True):
    col: int
    row: int
    depth: int
    data: int

    @property
    def tensor(self) -> int:
        return self.col * self.row * self.depth

    @property
    def gpus(self) -> int:
        return self.col * self.row * self.depth * self.data

    def sizes(self) -> tuple[int, int, int, int]:
        return (self.col, self.row, self.depth, self.data)


class DimTimes(msgspec.Struct, frozen=True):
    """Seconds spent in each dimension's collectives (no overlap between them)."""

    col: float = 0.0
    row: float = 0.0
    depth: float = 0.0
    data: float = 0.0

    @property
    def total(self) -> float:
        return self.col + self.row + self.depth + self.data

    def __add__(self, other: DimTimes) -> DimTimes:
        return DimTimes(self.col + other.col, self.row + other.row,
                        self.depth + other.depth, self.data + other.data)

    def scaled(self, k: float) -> DimTimes:
        return DimTimes(self.col * k, self.row * k, self.depth * k, self.data * k)


def ring_allgather_s(p: int, nbytes: float, bps: float) -> float:
    """Ring all-gather of a buffer of ``nbytes`` in total over ``p`` ranks."""
    return 0.0 if p <= 1 else (p - 1) / p * nbytes / bps


ring_reduce_scatter_s = ring_allgather_s  # same traffic pattern, the other way round


def ring_allreduce_s(p: int, nbytes: float, bps: float) -> float:
    """Ring all-reduce = reduce-scatter + all-gather."""
    return 2 * ring_allgather_s(p, nbytes, bps)


def placements(grid: Grid) -> dict[str, tuple[int, int]]:
    """(inner, size) per dimension: the product of the sizes placed inside it, and its own size."""
    out: dict[str, tuple[int, int]] = {}
    inner = 1
    for name, size in zip(DIMS, grid.sizes(), strict=True):
        out[name] = (inner, size)
        inner *= size
    return out


def _bandwidths(grid: Grid, topo: Topology) -> dict[str, float]:
    return {name: topo.bandwidth(inner, size) for name, (inner, size) in placements(grid).items() if size > 1}


def gemm_comm(gemm: Gemm, hidden: int, grid: Grid, tokens: int, topo: Topology, *,
              grad_acc: int = 1, bws: dict[str, float] | None = None) -> DimTimes:
    """Communication of one weight matrix for one step (``tokens`` = batch x seq)."""
    bws = bws if bws is not None else _bandwidths(grid, topo)
    h = hidden
    m = tokens / (grid.data * grid.depth)
    if gemm.transposed:
        wide_dim, wide_bytes = "row", m * gemm.wide * h / grid.col * ACT_BYTES
        narrow_dim, narrow_bytes = "col", m * h / grid.row * ACT_BYTES
    else:
        wide_dim, wide_bytes = "col", m * gemm.wide * h / grid.row * ACT_BYTES
        narrow_dim, narrow_bytes = "row", m * h / grid.col * ACT_BYTES
    t = {"col": 0.0, "row": 0.0, "depth": 0.0, "data": 0.0}
    size = {"col": grid.col, "row": grid.row}
    if size[wide_dim] > 1:
        t[wide_dim] += 2 * ring_allreduce_s(size[wide_dim], wide_bytes, bws[wide_dim])
    if size[narrow_dim] > 1:
        t[narrow_dim] += ring_allreduce_s(size[narrow_dim], narrow_bytes, bws[narrow_dim])
    weights = gemm.wide * h * h
    if grid.depth > 1:
        tile = weights / (grid.col * grid.row) * ACT_BYTES
        per_step = (2 * ring_allgather_s(grid.depth, tile, bws["depth"])
                    + ring_reduce_scatter_s(grid.depth, tile, bws["depth"]))
        t["depth"] = per_step * grad_acc
    if grid.data > 1:
        shard = weights / grid.tensor * GRAD_BYTES
        t["data"] = ring_allreduce_s(grid.data, shard, bws["data"])
    return DimTimes(**t)


def layer_comm(model: ModelShape, grid: Grid, tokens: int, topo: Topology, *, grad_acc: int = 1) -> DimTimes:
    """Communication of one transformer layer (its four weight matrices) for one step."""
    bws = _bandwidths(grid, topo)
    total = DimTimes()
    for g in GEMMS:
        total = total + gemm_comm(g, model.hidden, grid, tokens, topo, grad_acc=grad_acc, bws=bws)
    return total


def step_comm(model: ModelShape, grid: Grid, batch: int, seq: int, topo: Topology, *,
              grad_acc: int = 1) -> DimTimes:
    """Communication of one training step: one layer's times the number of layers."""
    return layer_comm(model, grid, batch * seq, topo, grad_acc=grad_acc).scaled(model.layers)
