"""Rank program for the haiscale integration tests, run by ``ff launch`` (2 nodes x 1 rank).

``python ddp_prog.py OUT MODE...``: each rank writes ``OUT/<mode>.rank<R>.json`` (what it
found) and, for modes that train, ``OUT/<mode>.rank<R>.npz`` (its final parameters), so
the test compares ranks bit for bit.  The default torch.distributed group is the
``hfreduce`` backend; a Gloo group over the same ranks (ff launch gives torch's env://
variables) is the reference, and our wrapper has its own HFReduce communicator, so one
launch trains our wrapper, stock torch DDP on HFReduce and torch DDP on Gloo side by side.
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

import fireflyer.haiscale  # noqa: F401  (registers the hfreduce backend)
from fireflyer.haiscale.comm import shared
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
    """Parameters and buffers (BatchNorm statistics: rank 0's at each forward, then this rank's update)."""
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]
                     + [b.detach().reshape(-1).float() for b in m.buffers()]).numpy()


def params(m: nn.Module) -> np.ndarray:
    """Parameters only: what must be bit-identical across ranks."""
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy()


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)))


def mode_equiv(comm: Any, rank: int, world: int) -> dict[str, Any]:
    """Ours vs torch DDP on Gloo, plain and with gradient_as_bucket_view and tiny buckets."""
    out: dict[str, Any] = {}
    ref = torch.nn.parallel.DistributedDataParallel(model(rank), process_group=GLOO)
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
    np.savez(os.path.join(OUT, f"equiv.rank{rank}.npz"), ours=params(ours.module), small=params(small.module))
    return out


def mode_features(comm: Any, rank: int, world: int) -> dict[str, Any]:
    """no_sync accumulation, comm hooks, find_unused_parameters, stop()."""
    out: dict[str, Any] = {}
    # no_sync: 3 micro-batches, the last one syncs; torch DDP does the same
    ref = torch.nn.parallel.DistributedDataParallel(model(rank), process_group=GLOO)
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
        np.savez(os.path.join(OUT, f"hook_{name}.rank{rank}.npz"), p=params(m.module))
    calls: list[int] = []
    first_submit: list[float] = []  # per step: when bucket 0 went out
    last_grad: list[float] = []  # per step: when fc1.weight, the last parameter backward reaches, got its gradient

    def counting_hook(state: Any, bucket: Any) -> Any:
        calls.append(bucket.index())
        if bucket.index() == 0:
            first_submit.append(time.perf_counter())
        return state.allreduce(bucket.buffer(), op="avg", async_op=True)

    net = model(rank)
    net.fc1.weight.register_post_accumulate_grad_hook(lambda p: last_grad.append(time.perf_counter()))
    m = HaiDDP(net, comm=comm, first_bucket_mb=0.001, bucket_cap_mb=0.01)
    m.register_comm_hook(comm, counting_hook)
    train(m, rank)
    out["hook_calls"] = calls
    out["overlap_s"] = [g - f for f, g in zip(first_submit, last_grad, strict=True)]
    out["hook_buckets"] = len(m.reducer.plan.buckets)
    out["custom_hook_diff"] = max_diff(flat(m.module), flat(plain.module))
    # find_unused_parameters: rank 1 uses the side branch, rank 0 does not; torch DDP agrees
    ref = torch.nn.parallel.DistributedDataParallel(model(rank, branch=True), find_unused_parameters=True,
                                                  process_group=GLOO)
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


def mode_backend(comm: Any, rank: int, world: int) -> dict[str, Any]:
    """The hfreduce torch.distributed backend: collectives, async works, unsupported ops, stock torch DDP."""
    out: dict[str, Any] = {"backend": dist.get_backend()}
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    out["all_reduce_sum"] = t.tolist()
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = t.tolist()
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    out["all_reduce_avg"] = t.tolist()
    t = torch.arange(4, dtype=torch.int64) * (rank + 1)
    w = dist.all_reduce(t, async_op=True)
    out["async_returns_work"] = type(w).__name__
    w.wait()
    out["async_sum_int64"] = t.tolist()
    t = torch.full((4,), float(rank + 10))
    fut = dist.all_reduce(t, async_op=True).get_future()
    out["future_value"] = fut.wait()[0].tolist()
    b = torch.full((3,), float(rank + 7))
    dist.broadcast(b, src=1)
    out["broadcast_from_1"] = b.tolist()
    dist.barrier()
    w = dist.barrier(async_op=True)
    w.wait()
    outs = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(outs, torch.tensor([float(rank), -float(rank) - 1]))
    out["all_gather"] = [o.tolist() for o in outs]
    big = torch.zeros(world * 3, dtype=torch.int32)
    dist.all_gather_into_tensor(big, torch.full((3,), rank + 1, dtype=torch.int32))
    out["all_gather_into_tensor"] = big.tolist()
    rs = torch.zeros(2)
    dist.reduce_scatter(rs, [torch.full((2,), float(r + 1) * (rank + 1)) for r in range(world)])
    out["reduce_scatter"] = rs.tolist()
    rst = torch.zeros(2)
    dist.reduce_scatter_tensor(rst, torch.arange(2 * world, dtype=torch.float32) + rank)
    out["reduce_scatter_tensor"] = rst.tolist()
    # large: one broadcast / reduce per rank (the fan-out path), checked against what it must give
    n = 20_000  # 80 KB of float32 per rank, above FANOUT_MIN_BYTES
    mine = torch.arange(n, dtype=torch.float32) * (rank + 1)
    mine[0] = -0.0  # kept as -0.0 by broadcasts (an allreduce with zeros would give +0.0)
    big = torch.empty(world * n)
    w = dist.all_gather_into_tensor(big, mine, async_op=True)
    w.wait()
    want = torch.cat([torch.arange(n, dtype=torch.float32) * (r + 1) for r in range(world)])
    out["big_all_gather_ok"] = bool(torch.equal(big, want)) and str(big[0].item()) == "-0.0"
    outs = [torch.empty(n) for _ in range(world)]
    dist.all_gather(outs, mine)
    out["big_all_gather_list_ok"] = bool(torch.equal(torch.cat(outs), want))
    inp = torch.arange(world * n, dtype=torch.float32) + rank
    dst = torch.empty(n)
    dist.reduce_scatter_tensor(dst, inp)
    full = sum(torch.arange(world * n, dtype=torch.float32) + r for r in range(world))
    out["big_reduce_scatter_tensor_ok"] = bool(torch.equal(dst, full[rank * n:(rank + 1) * n]))
    out["input_untouched"] = bool(torch.equal(inp, torch.arange(world * n, dtype=torch.float32) + rank))
    dst2 = torch.empty(n)
    dist.reduce_scatter(dst2, list(inp.chunk(world)), op=dist.ReduceOp.MAX)
    out["big_reduce_scatter_max_ok"] = bool(torch.equal(dst2, (inp - rank + world - 1)[rank * n:(rank + 1) * n]))
    r = torch.full((2,), float(rank + 1))
    dist.reduce(r, dst=0)
    out["reduce_to_0"] = r.tolist()
    errors = {}
    for name, call in (("send", lambda: dist.send(torch.zeros(1), dst=1 - rank)),
                       ("product", lambda: dist.all_reduce(torch.ones(1), op=dist.ReduceOp.PRODUCT)),
                       ("all_to_all_single", lambda: dist.all_to_all_single(torch.zeros(world), torch.zeros(world)))):
        try:
            call()
            errors[name] = None
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors[name] = f"{type(e).__name__}: {e}"
    out["unsupported"] = errors
    # stock torch DDP on the hfreduce backend, against torch DDP on Gloo and our wrapper: same seeds, same data
    stock = torch.nn.parallel.DistributedDataParallel(model(rank))
    ref = torch.nn.parallel.DistributedDataParallel(model(rank), process_group=GLOO)
    ours = HaiDDP(model(rank), comm=comm)
    times = {}
    for name, m in (("stock_hfreduce", stock), ("gloo", ref), ("haiscale", ours)):
        t0 = time.perf_counter()
        train(m, rank)
        times[name] = time.perf_counter() - t0
    out["train_s"] = times
    out["stock_diff_vs_gloo"] = max_diff(flat(stock.module), flat(ref.module))
    out["stock_diff_vs_ours"] = max_diff(flat(stock.module), flat(ours.module))
    np.savez(os.path.join(OUT, f"backend.rank{rank}.npz"), stock=params(stock.module))
    return out


def mode_kill(comm: Any, rank: int, world: int) -> dict[str, Any]:
    """Rank 1 dies in the middle of step 3's backward (after its first bucket went out)."""
    net = model(rank)
    if rank == 1:
        calls = [0]

        def die(p: torch.Tensor) -> None:
            calls[0] += 1
            if calls[0] == 3:
                os._exit(0)  # no goodbye: the process is simply gone

        net.fc1.weight.register_post_accumulate_grad_hook(die)
    m = HaiDDP(net, comm=comm, first_bucket_mb=0.001, bucket_cap_mb=0.004)
    t0 = time.monotonic()
    try:
        train(m, rank, steps=5)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"error": type(e).__name__, "message": str(e), "after_s": time.monotonic() - t0}
    return {"error": None}


def main() -> int:
    global OUT, GLOO
    OUT, modes = sys.argv[1], sys.argv[2:]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("hfreduce")
    GLOO = dist.new_group(backend="gloo")
    comm = shared()  # the backend's: a worker runs one communicator at a time
    for mode in modes:
        try:
            result = {"equiv": mode_equiv, "features": mode_features, "mismatch": mode_mismatch,
                      "backend": mode_backend, "kill": mode_kill}[mode](comm, rank, world)
            result["ok"] = True
        except Exception:  # noqa: BLE001 - reported to the test
            result = {"ok": False, "traceback": traceback.format_exc()}
        with open(os.path.join(OUT, f"{mode}.rank{rank}.json"), "w") as f:
            json.dump(result, f)
    if "kill" not in modes:
        dist.destroy_process_group()
        comm.close()
    return 0


OUT = ""
GLOO: Any = None

if __name__ == "__main__":
    sys.exit(main())
