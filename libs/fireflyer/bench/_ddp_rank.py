"""The rank process of ``ff bench ddp``: times training steps three ways, writes one JSON.

``python -m fireflyer.bench._ddp_rank OUT MODEL STEPS WARMUP BUCKET_CAP_MB``.  The default
torch.distributed group is the ``hfreduce`` backend, a Gloo group over the same ranks is
the reference; every variant trains the same model on the same data for ``WARMUP``
untimed then ``STEPS`` timed steps (forward, backward, SGD step), in turn:

- ``haiscale``: :class:`fireflyer.haiscale.ddp.DistributedDataParallel`;
- ``torch_hfreduce``: stock torch DDP on the hfreduce backend;
- ``torch_gloo``: stock torch DDP on Gloo.

For haiscale it also records, from the reducer's timestamps, the communication backward
did not hide (end of backward's compute to the end of the waits) and the time the same
buckets take to reduce alone (submitted together, then waited for), after training.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any


def build(model: str) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    if model == "mlp":
        return nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(1024, 1024), nn.GELU())], nn.Linear(1024, 16))
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True, dropout=0.0)
    return nn.Sequential(nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False), nn.Flatten(1),
                         nn.Linear(256 * 16, 16))


def batch(model: str, step: int, rank: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(32, 1024, generator=g) if model == "mlp" else torch.randn(8, 16, 256, generator=g)
    return x, torch.randn(x.shape[0], 16, generator=g)


def run(m: Any, model: str, steps: int, warmup: int, rank: int, reducer: Any = None) -> dict[str, Any]:
    import torch

    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    times, exposed = [], []
    for step in range(warmup + steps):
        x, y = batch(model, step, rank)
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        dt = time.perf_counter() - t0
        if step >= warmup:
            times.append(dt)
            if reducer is not None and reducer.last_timing:
                t = reducer.last_timing
                exposed.append(t["synced"] - t["last_grad"])
    out: dict[str, Any] = {"step_ms": 1e3 * statistics.median(times)}
    if exposed:
        out["exposed_comm_ms"] = 1e3 * statistics.median(exposed)
    return out


def main() -> int:
    out_dir, model, steps, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    cap_mb = float(sys.argv[5])
    import torch
    import torch.distributed as dist

    import fireflyer.haiscale  # noqa: F401  (registers the backend)
    from fireflyer.haiscale.comm import shared
    from fireflyer.haiscale.ddp import DistributedDataParallel

    torch.set_num_threads(1)  # ranks share the machine's cores
    rank = int(os.environ["RANK"])
    dist.init_process_group("hfreduce")
    gloo = dist.new_group(backend="gloo")
    comm = shared()
    res: dict[str, Any] = {"rank": rank}
    ours = DistributedDataParallel(build(model), comm=comm, bucket_cap_mb=cap_mb)
    res["haiscale"] = run(ours, model, steps, warmup, rank, ours.reducer)
    res["params"] = sum(p.numel() for p in ours.module.parameters())
    res["buckets"] = len(ours.reducer.plan.buckets)
    # the same buckets reduced alone, not behind backward: what there was to hide
    alone = []
    for _ in range(max(3, steps // 2)):
        t0 = time.perf_counter()
        works = [comm.allreduce(b, op="avg", async_op=True) for b in ours.reducer.buffers]
        for w in works:
            w.wait()
        alone.append(time.perf_counter() - t0)
    res["haiscale"]["comm_alone_ms"] = 1e3 * statistics.median(alone)
    ddp = torch.nn.parallel.DistributedDataParallel
    res["torch_hfreduce"] = run(ddp(build(model), bucket_cap_mb=cap_mb), model, steps, warmup, rank)
    res["torch_gloo"] = run(ddp(build(model), process_group=gloo, bucket_cap_mb=cap_mb), model, steps, warmup, rank)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
