"""``ff launch``: run a program on N simulated nodes x K local ranks with HFReduce workers (torchrun-like).

    ff launch --nodes 2 --local-ranks 4 -- python train.py --lr 3e-4
    ff launch --nodes 3 --local-ranks 1 --zones A,A,B --chunk-size 1M -- python -m mypkg.bench

No scheduler or cluster is needed.  The launcher starts one HFReduce worker per
node on its own loopback address (node i on 127.0.0.(i+1)), hands every worker
the full peer list (the rendezvous, done by the launcher itself), then runs
N*K copies of the command with the training-process environment (FF_RANK,
FF_WORLD_SIZE, FF_LOCAL_RANK, FF_HFREDUCE_SOCKET ... and torch's RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, so a torch.distributed
program runs unchanged).  Output lines are prefixed ``[rank R]``.  The exit code
is the first non-zero exit code of a rank (0 when all succeed); on any failure,
or Ctrl-C, every process it started is stopped.

Each node's worker and ranks are bound to the node's own share of the CPUs
(``--cpu-bind node``, the default), as they would be on separate machines,
when there are at least as many CPUs as nodes;
``--cpu-bind none`` leaves placement to the scheduler.

The cluster is found as every ``ff`` command finds it: FF_<SVC>_ADDR and
FF_TOKEN, else the local cluster (``ff up``) of --state-dir / FF_STATE_DIR /
./.ff.  The ranks get its FF_*_ADDR, FF_NATS_URL, FF_TOKEN (the user's) and
FF_STATE_DIR, so CheckpointManager() and fireflyer.fs.connect() work without
arguments; with no cluster a line says the ranks run standalone.  When the
cluster runs a coord service the workers join through it: it assigns node
ranks (by zone, then node name), builds the zone-aware trees, watches
liveness and collects telemetry (``ff coord comms``).

--job NAME makes FF_JOB_ID stable (default: generated per launch).
--max-restarts N relaunches every rank (and the workers) after a failure, up
to N times, with FF_RESTART_COUNT counting 0, 1, ...; a bare ``python`` runs
as the launching interpreter (sys.executable), so ranks share its venv.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def _cmd(ns: argparse.Namespace) -> int:
    from fireflyer.core.errors import InvalidArgument
    from fireflyer.core.sizes import parse_size
    from fireflyer.hfreduce.launch import Launcher
    from fireflyer.hfreduce.launch_plan import LaunchOptions, parse_zones

    cmd = list(ns.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise InvalidArgument("no command to launch: give it after '--' (ff launch --nodes 2 -- python train.py)")
    if ns.chunk_size is not None:
        parse_size(ns.chunk_size, what="--chunk-size")  # fail here, naming the option, not in N workers
    opts = LaunchOptions(nodes=ns.nodes, local_ranks=ns.local_ranks, zones=parse_zones(ns.zones, ns.nodes),
                         chunk_size=ns.chunk_size, timeout_s=ns.timeout_s, job_id=ns.job_id, cpu_bind=ns.cpu_bind)
    return Launcher(opts, cmd, run_dir=ns.run_dir, grace_s=ns.grace, ready_timeout_s=ns.ready_timeout_s,
                    state_dir=ns.state_dir, max_restarts=ns.max_restarts).run()


def register(subparsers: Any) -> None:
    from fireflyer.cli.options import add_state_dir

    doc = __doc__ or ""
    p = subparsers.add_parser(
        "launch", help="run a command as N nodes x K local ranks with HFReduce workers (torchrun-like)",
        description=doc.split("\n\n", 2)[2] if doc.count("\n\n") >= 2 else doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="ff launch --nodes N --local-ranks K [options] -- CMD [ARGS...]")
    p.add_argument("--nodes", type=int, default=1, metavar="N", help="simulated nodes, one worker each (default 1)")
    p.add_argument("--local-ranks", type=int, default=1, metavar="K", help="ranks per node (default 1)")
    p.add_argument("--zones", default=None, metavar="A,A,B",
                   help="zone of each node, in node-rank order (one entry per node)")
    p.add_argument("--chunk-size", default=None, metavar="SIZE",
                   help="HFReduce pipeline chunk, e.g. 4M (default: the worker's)")
    p.add_argument("--timeout-s", type=float, default=None, metavar="S",
                   help="collective deadline of the workers in seconds (default: the worker's)")
    p.add_argument("--cpu-bind", choices=["node", "none"], default="node",
                   help="node: bind each node's worker and ranks to its own share of the CPUs, as on real "
                        "nodes, when there are at least as many CPUs as nodes (default); none: leave "
                        "placement to the scheduler")
    p.add_argument("--job", "--job-id", dest="job_id", default=None, metavar="NAME",
                   help="FF_JOB_ID of the ranks, the same across restarts and relaunches, so a relaunched job "
                        "resumes its own checkpoints (default: generated, launch-<hex>)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="when a rank fails, stop every process and start them all again, up to N times, with "
                        "FF_RESTART_COUNT=1..N (torchrun's --max-restarts; default 0)")
    add_state_dir(p)
    p.add_argument("--run-dir", default=None, metavar="DIR",
                   help="where the node sockets live (default: a fresh temp dir, removed at the end)")
    p.add_argument("--grace", type=float, default=5.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL when stopping (default 5)")
    p.add_argument("--ready-timeout-s", type=float, default=60.0, metavar="S",
                   help="how long a worker may take to become ready (default 60)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command each rank runs, after '--'")
    p.set_defaults(func=_cmd)
