"""The environment of one rank of a task, as the node agent starts it (DESIGN.md §3).

Layers, later ones win: what the agent passes on from its own environment
(:func:`inherited_env`: the system's variables and the cluster's service addresses, never
the agent's own credential), the task's ``env``, the rank's ``env``, then the variables the
agent owns -- the FF_* rank variables, torch's and Slurm's -- which a task cannot override,
so every tool reads one consistent numbering.

``WORLD_SIZE`` / ``RANK`` have torch's meaning (all ranks, global rank); HAI's meaning
(nodes, node rank) is left to a compatibility mode of the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping

from .model import RankSpec, TaskSpec

__all__ = ["rank_env", "inherited_env", "SUSPEND_FILE_ENV", "PRIVATE_PREFIXES", "DEFAULT_MASTER_PORT"]

#: the suspend flag file of the task on this node (see :mod:`fireflyer.node.suspend`)
SUSPEND_FILE_ENV = "FF_SUSPEND_FILE"
#: torch's default rendezvous port, used when the task names none
DEFAULT_MASTER_PORT = 29500
#: variables of the agent's own environment that never reach a task: its credential and its
#: own service identity (a task gets its user's token in the task's env instead); a trace context
#: of the agent's own (a task gets the one of its StartTask, fireflyer.telemetry.taskctx)
PRIVATE_PREFIXES = ("FF_TOKEN", "FF_AUTH_", "FF_INSTANCE", "FF_RPC_", "FF_AGENT_", "FF_NODE_", "FF_LOG_", "FF_TELEMETRY_",
                    "FF_GRACE_S", "TRACEPARENT", "TRACESTATE")


def inherited_env(agent_env: Mapping[str, str]) -> dict[str, str]:
    """What a task inherits from the agent's environment: everything but :data:`PRIVATE_PREFIXES`."""
    return {k: v for k, v in agent_env.items() if not k.startswith(PRIVATE_PREFIXES)}


def rank_env(spec: TaskSpec, rank: RankSpec, *, base: Mapping[str, str], node_name: str, node_address: str,
             hfreduce_socket: str = "", suspend_file: str = "", sched_addr: str = "") -> dict[str, str]:
    """The complete environment of ``rank`` of ``spec`` on this node."""
    env = dict(base)
    env.update(spec.env)
    env.update(rank.env)
    world = spec.world
    local_world = len(spec.ranks)
    master_addr = spec.master_addr or node_address
    master_port = spec.master_port or DEFAULT_MASTER_PORT
    env.update({
        "FF_JOB_ID": spec.job,
        "FF_TASK_ID": spec.task_id,
        "FF_RANK": str(rank.rank),
        "FF_WORLD_SIZE": str(world),
        "FF_LOCAL_RANK": str(rank.local_rank),
        "FF_LOCAL_WORLD_SIZE": str(local_world),
        "FF_NODE_RANK": str(spec.node_rank),
        "FF_NNODES": str(spec.nnodes),
        "FF_NODE_NAME": node_name,
        "FF_RESTART_COUNT": str(spec.restart_count),
        # torch.distributed: a torchrun program runs unchanged
        "RANK": str(rank.rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank.local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(spec.node_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        # Slurm: scripts written for sbatch/srun find their place the same way
        "SLURM_JOB_ID": spec.job,
        "SLURM_NNODES": str(spec.nnodes),
        "SLURM_NODEID": str(spec.node_rank),
        "SLURM_PROCID": str(rank.rank),
        "SLURM_LOCALID": str(rank.local_rank),
        "SLURM_NTASKS": str(world),
    })
    if hfreduce_socket:
        env["FF_HFREDUCE_SOCKET"] = hfreduce_socket
    if suspend_file:
        env[SUSPEND_FILE_ENV] = suspend_file
    if sched_addr:
        env["FF_SCHED_ADDR"] = sched_addr
    # output goes to a log file that TailLog follows: do not let Python hold it in a buffer
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
