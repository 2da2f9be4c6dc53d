"""Data-parallel training with haiscale's DistributedDataParallel, checkpoints and resume.

    ff launch --job mlp-ddp --nodes 2 --local-ranks 2 -- python docs/examples/train_ddp.py --steps 40
    ff launch --nodes 2 --local-ranks 1 -- python docs/examples/train_ddp.py --root /tmp/ckpts --steps 20
    ff task run --simulate-suspend-after 20 -- ff launch --nodes 2 --local-ranks 1 -- \
        python docs/examples/train_ddp.py --root /tmp/ckpts --steps 100000

Every rank trains the same MLP on its own stream of a synthetic regression set.  The model
is wrapped in ``haiscale.ddp.DistributedDataParallel``: it starts from rank 0's weights,
and ``loss.backward()`` returns with the gradients averaged over all ranks through HFReduce
(bucketed, reduced while backward goes on).  ``--accumulate N`` runs N micro-batches per
step, the first N-1 under ``no_sync()``.  A checkpoint of model, optimizer and step is saved
every ``--save-every`` steps through ``fireflyer.ckpt.CheckpointManager`` (rank 0's shard holds
the replicated state; every rank commits); launched again with the same job (``--job`` of
ff launch, or the same ``--root``), every rank loads the newest committed checkpoint and goes
on from the step after it.

Under the HAI scheduler (``ff task submit``, or ``ff task run --simulate-suspend-after S -- ff launch
...`` locally) every step also asks ``fireflyer.hai.suspend_requested(model.comm)``: the flag is agreed
across ranks through the DDP's own HFReduce communicator (the process's shared one: only one per
process), so when the scheduler raises it every rank saves a checkpoint at the same step, waits for
the others to have saved, and calls ``hai.go_suspend()``; the task's next run resumes from that step.
Outside a cluster the flag is never up and this costs one tiny allreduce per step.

Checkpoints go to the cluster's checkpoint service and 3FS when one is found (``FF_CKPT_ADDR``
..., ``FF_STATE_DIR`` or ``./.ff``; ff launch passes its own on), or to a local directory with
``--root DIR`` (no cluster needed).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="train until this step (default 40)")
    ap.add_argument("--save-every", type=int, default=10, help="save a checkpoint every N steps (default 10)")
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches per step (default 1)")
    ap.add_argument("--root", default=None, help="keep checkpoints in this directory instead of the cluster")
    ap.add_argument("--job", default=None,
                    help="checkpoint job name (default task-<FF_CHAIN_ID> under the scheduler, else FF_JOB_ID, "
                         "else train-ddp)")
    ap.add_argument("--step-s", type=float, default=0.0, help="sleep this long per step (a bigger model's compute)")
    ap.add_argument("--slow-file", default=None,
                    help="fault injection: while this file exists and names this node (FF_NODE_NAME) on its first "
                         "line, each step here takes the seconds on its second line (default 1.0) longer")
    args = ap.parse_args()

    import torch

    from fireflyer import hai
    from fireflyer.ckpt import CheckpointManager
    from fireflyer.hai.faults import injected_delay
    from haiscale.ddp import DistributedDataParallel

    torch.manual_seed(int(os.environ.get("FF_RANK", "0")))  # ranks start apart: the wrapper syncs rank 0's
    net = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 128),
                              torch.nn.GELU(), torch.nn.Linear(128, 1))
    model = DistributedDataParallel(net)  # its comm is haiscale.comm.shared(): the suspend poll reuses it
    rank, world = model.comm.rank, model.comm.world_size
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    w_true = torch.linspace(-1, 1, 32).unsqueeze(1)
    # under the HAI scheduler the chain is the job: every run of it resumes from the same checkpoints
    chain = os.environ.get("FF_CHAIN_ID")
    job = args.job or (f"task-{chain}" if chain else None) or os.environ.get("FF_JOB_ID") or "train-ddp"
    if args.root is not None:
        job = args.job or "train-ddp"  # a local root is the job's identity: FF_JOB_ID changes per launch

    suspended_at = None
    with CheckpointManager(job, root=args.root, keep_last=2) as mgr:
        first = 1
        last = mgr.latest()
        if last is not None:
            state = mgr.load()
            net.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            first = int(state["step"]) + 1
            if rank == 0:
                print(f"resumed job {job} from checkpoint {last.id} at step {last.step}", flush=True)
        loss = torch.tensor(float("nan"))
        for step in range(first, args.steps + 1):
            opt.zero_grad()
            for micro in range(args.accumulate):
                # the batch depends on (step, micro, rank) only, so a resumed run sees the data it would have
                gen = torch.Generator().manual_seed((step * 1000 + micro) * 1000 + rank)
                x = torch.randn(64, 32, generator=gen)
                y = torch.sin(x @ w_true) + 0.01 * torch.randn(64, 1, generator=gen)
                sync = micro == args.accumulate - 1
                with contextlib.nullcontext() if sync else model.no_sync():
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    (loss / args.accumulate).backward()
            opt.step()
            if args.step_s > 0:
                time.sleep(args.step_s)
            time.sleep(injected_delay(args.slow_file))  # --slow-file: a drill for the health service
            # a collective (every rank, every step): if any rank saw the flag, all stop at this step
            suspend = hai.suspend_requested(model.comm)
            if step % args.save_every == 0 or step == args.steps or suspend:
                rec = mgr.save(step, {"model": net.state_dict(), "optim": opt.state_dict(), "step": step},
                               blocking=True).result()
                if rank == 0:
                    print(f"step {step}: loss {loss.item():.4f}, checkpoint {rec.id}", flush=True)
            if suspend:
                suspended_at = step
                break
    if suspended_at is not None:
        # save() returns after this rank's commit; the checkpoint is whole once every rank committed,
        # so no rank may tell the scheduler to stop the task before all have (a barrier: a sum of 1s)
        model.comm.allreduce(torch.ones(1), op="sum")
        if rank == 0:
            print(f"suspend requested: every rank saved step {suspended_at}; suspending", flush=True)
        model.stop()
        hai.go_suspend()  # in a task: never returns, the node agents stop it (its next run resumes here)
        model.comm.close()
        return 0
    # the same parameters on every rank, bit for bit: elementwise max and min of them all agree
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    hi, lo = flat.clone(), flat.clone()
    model.comm.allreduce(hi, op="max")
    model.comm.allreduce(lo, op="min")
    model.stop()
    model.comm.close()
    if not torch.equal(hi, lo):
        print(f"rank {rank}: parameters differ between ranks ({int((hi != lo).sum())} values)", flush=True)
        return 1
    if rank == 0:
        digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
        print(f"done: {world} ranks at step {args.steps}, loss {loss.item():.4f}, parameters identical "
              f"(sha256 {digest})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
