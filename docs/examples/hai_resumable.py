"""A resumable training loop for the HAI scheduler (``ff task submit``), as HAI Platform users write one.

    ff task submit -n 2 -p LOW --name demo -- python docs/examples/hai_resumable.py --steps 1000
    ff task run --simulate-suspend-after 5 -- python docs/examples/hai_resumable.py   # locally

Every rank: resume from the newest checkpoint (``fireflyer.ckpt``), then loop steps; each step asks
``fireflyer.hai.suspend_requested(comm)`` -- with more than one node, through HFReduce, so every rank
sees the flag at the same step -- and when it is set, saves the step count and calls ``go_suspend()``
(the scheduler stops the task and queues its next run, which starts here again).  Rank 0 prints one
line per step (``step N restart R``); the whole-life state counts the runs that saved.

Options: ``--steps`` (total), ``--step-s`` (seconds per step), ``--name`` (checkpoint name; default
``hai-<chain id>``), ``--local`` (keep checkpoints in this directory instead of the checkpoint
service: for simulate mode without a cluster), ``--save-every N`` (also save every N steps, so a
run stopped without warning -- a drained node -- resumes near where it was), ``--slow-file PATH``
(a drill: :mod:`fireflyer.hai.faults`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--step-s", type=float, default=0.1)
    ap.add_argument("--name", default="")
    ap.add_argument("--local", default="")
    ap.add_argument("--save-every", type=int, default=0, help="also save every N steps (0: only when suspended)")
    ap.add_argument("--slow-file", default=None, help="fault injection (fireflyer.hai.faults): slow this node")
    args = ap.parse_args(argv)

    from fireflyer import hai
    from fireflyer.ckpt import CheckpointManager
    from fireflyer.hai.faults import injected_delay

    rank = int(os.environ.get("FF_NODE_RANK", "0"))
    nnodes = int(os.environ.get("FF_NNODES", "1"))
    restart = int(os.environ.get("FF_RESTART_COUNT", "0"))
    name = args.name or f"hai-{os.environ.get('FF_CHAIN_ID', 'local')}"
    comm = None
    if nnodes > 1 and os.environ.get("FF_HFREDUCE_SOCKET"):
        from fireflyer import hfreduce

        comm = hfreduce.init()
    mgr = CheckpointManager(name, root=args.local) if args.local else CheckpointManager(name)
    start = 0
    latest = mgr.latest()
    if latest is not None:
        state = mgr.load(latest.step)
        start = int(state["step"])
    print(f"rank {rank} start at step {start} restart {restart} whole_life_state {hai.get_whole_life_state()}",
          flush=True)
    weights = np.zeros(4, dtype=np.float32)
    for step in range(start, args.steps):
        weights += 1.0
        time.sleep(args.step_s + injected_delay(args.slow_file))
        if rank == 0:
            print(f"step {step} restart {restart}", flush=True)
        if args.save_every and (step + 1) % args.save_every == 0:
            mgr.save(step + 1, {"step": step + 1, "weights": weights}, blocking=True).result()
            print(f"rank {rank} saved step {step + 1}", flush=True)
        if hai.suspend_requested(comm):
            t0 = time.monotonic()
            mgr.save(step + 1, {"step": step + 1, "weights": weights}, blocking=True).result()
            print(f"rank {rank} saved step {step + 1} in {time.monotonic() - t0:.3f} s; suspending", flush=True)
            hai.set_whole_life_state(hai.get_whole_life_state() + 1)
            mgr.close()
            hai.go_suspend()
    mgr.close()
    print(f"rank {rank} done at step {args.steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
