"""A task's rank for the tracing tests: one checkpoint save (local root) and one scheduler call, so its
trace has spans of the rank process (ckpt phases, an RPC) under the node agent's."""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np

from fireflyer.ckpt import CheckpointManager
from fireflyer.sched.client import SchedClient


async def _own_task() -> None:
    async with SchedClient(os.environ["FF_SCHED_ADDR"]) as c:
        chain = await c.get(int(os.environ["MARSV2_TASK_ID"]))
        print("my task", chain.chain_id, "runs", len(chain.runs), flush=True)


def main() -> None:
    root = sys.argv[1]
    mgr = CheckpointManager("trace-e2e", root=root, interval_s=0)
    mgr.save(1, {"w": np.arange(1024, dtype=np.float32)}, blocking=True)
    mgr.close()
    print("saved step 1", flush=True)
    asyncio.run(_own_task())


if __name__ == "__main__":
    main()
