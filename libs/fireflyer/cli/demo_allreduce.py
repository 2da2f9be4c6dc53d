"""``ff demo``'s HFReduce step: 2 simulated nodes x 2 local ranks allreduce through the cluster.

The same path as ``ff launch --nodes 2 --local-ranks 2 -- python -m fireflyer.cli.demo_rank``
next to a running ``ff up`` cluster: the launcher finds the cluster's coordination service
(``FF_STATE_DIR``), the two node workers join the communicator there and get their node
ranks and trees from it, and four ranks allreduce shared-memory buffers (:mod:`.demo_rank`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["allreduce_demo"]

NODES, LOCAL_RANKS = 2, 2


def allreduce_demo(state_dir: Path, console: Any, *, deadline_s: float = 120.0) -> bool:
    """Run the step, printing the ranks' lines; True when every rank exits 0."""
    from fireflyer.hfreduce.launch import Launcher
    from fireflyer.hfreduce.launch_plan import LaunchOptions

    env = {**os.environ, "FF_STATE_DIR": str(state_dir)}
    ok_lines: list[str] = []

    def sink(source: str, stream: str, line: str) -> None:
        if source.startswith("rank") and line.startswith("allreduce ok"):
            ok_lines.append(line)
        console.print(f"[{source}] {line}", highlight=False, markup=False)

    opts = LaunchOptions(nodes=NODES, local_ranks=LOCAL_RANKS, timeout_s=30.0, job_id="demo")
    rc = Launcher(opts, [sys.executable, "-m", "fireflyer.cli.demo_rank"], env=env, sink=sink,
                  handle_signals=False, deadline_s=deadline_s).run()
    world = NODES * LOCAL_RANKS
    if rc != 0 or len(ok_lines) != world:
        console.print(f"[red]allreduce step failed: exit code {rc}, {len(ok_lines)} of {world} ranks ok[/red]")
        return False
    console.print(f"{world} ranks on {NODES} nodes agree, bit for bit")
    return True
