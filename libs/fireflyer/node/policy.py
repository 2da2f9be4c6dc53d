"""The node agent's decisions, as pure functions: restart backoff, stop escalation, rediscovery,
and the command line of a task's HFReduce worker.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

import msgspec

from fireflyer.cluster.decisions import ProcInfo, is_ours

from .model import HFReduceSpec, RankRecord, RankState, TaskSpec

__all__ = ["RestartPolicy", "restart_delay", "next_attempt", "StopStep", "stop_plan", "due_signals",
           "classify_rank", "worker_argv", "WORKER_MODULE"]

WORKER_MODULE = "fireflyer.hfreduce.worker"


class RestartPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How a dead HFReduce worker is restarted: after ``base_s``, doubling per consecutive
    failure up to ``max_s``; a worker that ran ``stable_s`` before dying starts the count over."""

    base_s: float = 0.2
    max_s: float = 10.0
    stable_s: float = 30.0


def restart_delay(attempt: int, policy: RestartPolicy) -> float:
    """Wait before restart number ``attempt`` (1 = the first after a death)."""
    if attempt < 1:
        return 0.0
    return min(policy.base_s * (2 ** (attempt - 1)), policy.max_s)


def next_attempt(previous: int, ran_for_s: float, policy: RestartPolicy) -> int:
    """The attempt number of the restart after a worker that ran ``ran_for_s`` died."""
    return 1 if ran_for_s >= policy.stable_s else previous + 1


class StopStep(msgspec.Struct, frozen=True):
    #: seconds after the stop began
    at_s: float
    signal: int


def stop_plan(grace_s: float) -> tuple[StopStep, ...]:
    """SIGTERM to every rank's process group at once, SIGKILL to the survivors after ``grace_s``
    (``grace_s`` <= 0: SIGKILL at once, as ``scancel --full`` or a HAI stop with grace 0)."""
    if grace_s <= 0:
        return (StopStep(0.0, signal.SIGKILL),)
    return (StopStep(0.0, signal.SIGTERM), StopStep(grace_s, signal.SIGKILL))


def due_signals(plan: Sequence[StopStep], elapsed_s: float, sent: int) -> tuple[list[int], int]:
    """The signals of ``plan`` due at ``elapsed_s`` that were not sent yet (the first ``sent``
    were), and the new count of sent steps."""
    due = [s.signal for s in plan[sent:] if s.at_s <= elapsed_s]
    return due, sent + len(due)


def classify_rank(rec: RankRecord, seen: ProcInfo | None) -> RankState:
    """After an agent restart: is a recorded rank still running (the same process: its start
    time matches), already known to have exited, or lost (gone, a zombie, or its pid now
    belongs to another process)?"""
    if rec.state is not RankState.RUNNING:
        return rec.state
    return RankState.RUNNING if is_ours(rec.start_ticks, seen) else RankState.LOST


def worker_argv(spec: TaskSpec, hf: HFReduceSpec, *, socket: str, node_name: str, node_address: str, zone: str,
                token: str = "", prefix: Sequence[str] | None = None) -> list[str]:
    """This node's HFReduce worker for ``spec`` (the command ``ff launch`` gives each node).

    With ``coord_addr`` it joins the coordination service as ``node_name`` in ``zone``,
    listening on ``listen`` (default: this node's address, a free port); without, it gets
    the node rank and the peer list.
    """
    argv = [*(prefix or (sys.executable, "-m", WORKER_MODULE)), "--nnodes", str(spec.nnodes),
            "--local-world-size", str(len(spec.ranks)), "--socket", socket, "--job-id", spec.job]
    if hf.coord_addr:
        argv += ["--coord", hf.coord_addr, "--node-name", node_name, "--listen", hf.listen or f"{node_address}:0",
                 "--restart-count", str(spec.restart_count)]
        if zone:
            argv += ["--zone", zone]
    else:
        argv += ["--node-rank", str(spec.node_rank), "--peers", ",".join(hf.peers)]
    if hf.chunk_size:
        argv += ["--chunk-size", hf.chunk_size]
    if hf.timeout_s > 0:
        argv += ["--timeout-s", f"{hf.timeout_s:g}"]
    if token:
        argv += ["--token", token]
    return argv
