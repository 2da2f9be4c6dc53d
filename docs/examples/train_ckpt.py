"""A small data-parallel training job with checkpoints and resume (the README's walk-through).

    ff launch --job mlp --nodes 2 --local-ranks 2 -- python docs/examples/train_ckpt.py --steps 30

Every rank trains the same MLP on its own slice of a synthetic regression set, averages the
gradients with HFReduce, and saves a checkpoint of the model and optimizer every
``--save-every`` steps through the cluster's checkpoint service into 3FS (each rank its own
shard).  Launched again with the same ``--job``, every rank loads the newest committed
checkpoint and goes on from the step after it; ``--fail-at-step N`` makes rank 0 crash once at
that step (with ``ff launch --max-restarts 1`` the job is relaunched and resumes).

The cluster is found the way every Fire-Flyer client finds it (``FF_CKPT_ADDR``/``FF_TOKEN``,
else ``FF_STATE_DIR`` or ``./.ff``); ``ff launch`` passes its own on to the ranks.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="train until this step (default 30)")
    ap.add_argument("--save-every", type=int, default=10, help="save a checkpoint every N steps (default 10)")
    ap.add_argument("--fail-at-step", type=int, default=None,
                    help="rank 0 exits with code 3 at this step on its first attempt (FF_RESTART_COUNT=0)")
    args = ap.parse_args()

    import torch

    from fireflyer import hfreduce
    from fireflyer.ckpt import CheckpointManager

    comm = hfreduce.init()
    rank, world = comm.rank, comm.world_size
    job = os.environ.get("FF_JOB_ID", "train-ckpt")
    restart = int(os.environ.get("FF_RESTART_COUNT", "0"))

    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1234 + rank)  # each rank's own data
    w_true = torch.linspace(-1, 1, 32).unsqueeze(1)

    with CheckpointManager(job, keep_last=2) as mgr:
        first = 1
        last = mgr.latest()
        if last is not None:
            state = mgr.load()
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            first = int(state["step"]) + 1
            if rank == 0:
                print(f"resumed job {job} from checkpoint {last.id} at step {last.step}", flush=True)
        loss = torch.tensor(float("nan"))
        for step in range(first, args.steps + 1):
            if args.fail_at_step == step and rank == 0 and restart == 0:
                print(f"rank 0: failing on purpose at step {step}", flush=True)
                os._exit(3)
            x = torch.randn(64, 32, generator=gen)
            y = x @ w_true + 0.01 * torch.randn(64, 1, generator=gen)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            for p in model.parameters():  # data parallel: every rank steps with the mean gradient
                comm.allreduce(p.grad, op="avg")
            opt.step()
            if step % args.save_every == 0 or step == args.steps:
                rec = mgr.save(step, {"model": model.state_dict(), "optim": opt.state_dict(), "step": step},
                               blocking=True).result()
                if rank == 0:
                    print(f"step {step}: loss {loss.item():.4f}, checkpoint {rec.id} ({rec.nbytes} bytes)",
                          flush=True)
    # the same parameters on every rank, bit for bit: elementwise max and min of them all agree
    flat = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    comm.allreduce(hi, op="max")
    comm.allreduce(lo, op="min")
    comm.close()
    if not torch.equal(hi, lo):
        n = int((hi != lo).sum())
        print(f"rank {rank}: parameters differ between ranks ({n} of {flat.numel()} values)", flush=True)
        return 1
    if rank == 0:
        print(f"done: {world} ranks at step {args.steps}, loss {loss.item():.4f}, parameters identical", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
