"""Rank program for the haiscale integration tests, run by ``ff launch`` (2 nodes x 1 rank).

``python ddp_prog.py MODE OUT``: each rank writes ``OUT/<mode>.rank<R>.json`` (what it
found) and, for modes that train, ``OUT/<mode>.rank<R>.npz`` (its final parameters), so
the test compares ranks bit for bit.  Every mode joins HFReduce (``hfreduce.init()``)
and torch's Gloo group (ff launch gives the ranks torch's env:// variables), so one
launch trains our wrapper and torch DDP on Gloo side by side.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from fireflyer import hfreduce
from fireflyer.haiscale.ddp import DistributedDataParallel as HaiDDP
from fireflyer.haiscale.hooks import bf16_compress_hook, fp16_compress_hook

STEPS = 6


class Net(nn.Module):
    def __init__(self, branch: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.norm = nn.BatchNorm1d(64)  # a buffer that broadcast_buffers keeps equal
        self.fc2 = nn.Linear(64, 48)
        self.head = nn.Linear(48, 4)
        self.side = nn.Linear(48, 4) if branch else None

    def forward(self, x: torch.Tensor, use_side: bool = False) -> torch.Tensor:
        h = torch.relu(self.fc2(torch.relu(self.norm(self.fc1(x)))))
        out = self.head(h)
        if use_side and self.side is not None:
            out = out + self.side(h)
        return out


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randn(16, 4, generator=g)


def model(seed_rank: int, branch: bool = False) -> nn.Module:
    torch.manual_seed(7 + seed_rank)  # ranks start different: construction must broadcast rank 0's
    return Net(branch)


def train(ddp: nn.Module, rank: int, steps: int = STEPS, accumulate: int = 1, lr: float = 0.05) -> list[float]:
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        for micro in range(accumulate):
            x, y = batch(step * accumulate + micro, rank)
            ctx = ddp.no_sync() if micro < accumulate - 1 else _null()
            with ctx:
                loss = nn.functional.mse_loss(ddp(x), y)
                loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


def flat(m: nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]
                     + [b.detach().reshape(-1).float() for b in m.buffers()]).numpy()


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)))


def mode_equiv(comm: Any, rank: int, world: int) -> dict[str, Any]:
    """Ours vs torch DDP on Gloo, plain and with gradient_as_bucket_view and tiny buckets."""
    out: dict[str, Any] = {}
    ref = torch.nn.parallel.DistributedDataParallel(model(rank))
    t0 = time.perf_counter()
    train(ref, rank)
    out["gloo_s"] = time.perf_counter() - t0
    ours = HaiDDP(model(rank), comm=comm)
    t0 = time.perf_counter()
    out["losses"] = train(ours, rank)
    out["ours_s"] = time.perf_counter() - t0
    out["buckets"] = len(ours.reducer.plan.buckets)
    out["diff_vs_gloo"] = max_diff(flat(ours.module), flat(ref.module))
    small = HaiDDP(model(rank), comm=comm, bucket_cap_mb=0.004, first_bucket_mb=0.001,
                   gradient_as_bucket_view=True)
    train(small, rank)
    out["small_buckets"] = len(small.reducer.plan.buckets)
    out["small_diff_vs_gloo"] = max_diff(flat(small.module), flat(ref.module))
    out["grad_is_view"] = all(p.grad.data_ptr() == small.reducer.slot(i).data_ptr()
                              for i, p in enumerate(small.reducer.params))
    np.savez(os.path.join(OUT, f"equiv.rank{rank}.npz"), ours=flat(ours.module), small=flat(small.module))
    return out


def mode_features(comm: Any, rank: int, world: int) -> dict[str, Any]:
    """no_sync accumulation, comm hooks, find_unused_parameters, stop()."""
    out: dict[str, Any] = {}
    # no_sync: 3 micro-batches, the last one syncs; torch DDP does the same
    ref = torch.nn.parallel.DistributedDataParallel(model(rank))
    train(ref, rank, steps=3, accumulate=3)
    ours = HaiDDP(model(rank), comm=comm)
    train(ours, rank, steps=3, accumulate=3)
    out["no_sync_diff_vs_gloo"] = max_diff(flat(ours.module), flat(ref.module))
    # inside no_sync nothing is reduced: the gradient is this rank's own
    probe = HaiDDP(model(0), comm=comm)
    x, y = batch(99, rank)
    with probe.no_sync():
        nn.functional.mse_loss(probe(x), y).backward()
    local = probe.module.head.weight.grad.clone()
    probe.module.zero_grad()
    nn.functional.mse_loss(probe(x), y).backward()
    synced = probe.module.head.weight.grad.clone()
    four = torch.stack([local, -local, synced, -synced]).reshape(4, -1).numpy().copy()
    comm.allreduce(four, op="max")  # max == -max(-x) everywhere iff every rank holds the same values
    out["no_sync_local_differs_across_ranks"] = bool(not np.array_equal(four[0], -four[1]))
    out["synced_equal_across_ranks"] = bool(np.array_equal(four[2], -four[3]))
    # comm hooks
    plain = HaiDDP(model(rank), comm=comm)
    train(plain, rank)
    for name, hook in (("fp16", fp16_compress_hook), ("bf16", bf16_compress_hook)):
        m = HaiDDP(model(rank), comm=comm)
        m.register_comm_hook(None, hook)
        train(m, rank)
        out[f"{name}_diff_vs_plain"] = max_diff(flat(m.module), flat(plain.module))
        np.savez(os.path.join(OUT, f"hook_{name}.rank{rank}.npz"), p=flat(m.module))
    calls: list[int] = []

    def counting_hook(state: Any, bucket: Any) -> Any:
        calls.append(bucket.index())
        return state.allreduce(bucket.buffer(), op="avg", async_op=True)

    m = HaiDDP(model(rank), comm=comm, first_bucket_mb=0.001, bucket_cap_mb=0.01)
    m.register_comm_hook(comm, counting_hook)
    train(m, rank)
    out["hook_calls"] = calls
    out["hook_buckets"] = len(m.reducer.plan.buckets)
    out["custom_hook_diff"] = max_diff(flat(m.module), flat(plain.module))
    # find_unused_parameters: rank 1 uses the side branch, rank 0 does not; torch DDP agrees
    ref = torch.nn.parallel.DistributedDataParallel(model(rank, branch=True), find_unused_parameters=True)
    ours = HaiDDP(model(rank, branch=True), comm=comm, find_unused_parameters=True)
    for m in (ref, ours):
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        for step in range(3):
            opt.zero_grad()
            x, y = batch(step, rank)
            nn.functional.mse_loss(m(x, use_side=(rank == 1)), y).backward()
            opt.step()
    out["unused_diff_vs_gloo"] = max_diff(flat(ours.module), flat(ref.module))
    # a parameter nobody uses keeps grad None, as under torch DDP
    ours2 = HaiDDP(model(rank, branch=True), comm=comm, find_unused_parameters=True)
    x, y = batch(0, rank)
    nn.functional.mse_loss(ours2(x), y).backward()
    out["globally_unused_grad_none"] = ours2.module.side.weight.grad is None
    # stop(): training goes on locally
    ours2.stop()
    ours2.module.zero_grad()
    nn.functional.mse_loss(ours2(x), y).backward()
    out["after_stop_local"] = ours2.module.head.weight.grad is not None
    return out


def mode_mismatch(comm: Any, rank: int, world: int) -> dict[str, Any]:
    """Rank 1 uses the side branch, rank 0 does not, with find_unused_parameters=False."""
    m = HaiDDP(model(rank, branch=True), comm=comm)
    x, y = batch(0, rank)
    try:
        nn.functional.mse_loss(m(x, use_side=(rank == 1)), y).backward()
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"error": type(e).__name__, "message": str(e)}
    return {"error": None}


def main() -> int:
    global OUT
    mode, OUT = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    comm = hfreduce.init()
    try:
        result = {"equiv": mode_equiv, "features": mode_features, "mismatch": mode_mismatch}[mode](comm, rank, world)
        result["ok"] = True
    except Exception:  # noqa: BLE001 - reported to the test
        result = {"ok": False, "traceback": traceback.format_exc()}
    with open(os.path.join(OUT, f"{mode}.rank{rank}.json"), "w") as f:
        json.dump(result, f)
    comm.close()
    dist.destroy_process_group()
    return 0


OUT = ""

if __name__ == "__main__":
    sys.exit(main())
