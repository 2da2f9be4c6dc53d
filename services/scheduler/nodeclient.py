"""The scheduler's real :class:`~fireflyer.sched.agents.NodeAgents`: gRPC calls to each node agent
(``services/node``, ``ff.node.v1.NodeAgent``) at the address it registered, with the scheduler's own
service token.

What a run's rank gets from here (beside the variables the agent owns, docs/node-agent.md):

- ``FF_TOKEN``: the *submitter's* token, so the ranks use 3FS and checkpoints as their user.  The
  scheduler keeps it in its KV beside the chain (never in a reply; docs/scheduler.md, "The task's
  credential") and hands it only to the agents of the run's nodes; the agent strips its own token
  from the ranks' environment.
- HAI's ``MARSV2_*`` (task id, rank, user, name, whole-life state) and ``FF_CHAIN_ID`` /
  ``FF_WHOLE_LIFE_STATE`` / ``FF_WATCHDOG_S``, which ``fireflyer.hai`` reads.
- With ``coord_addr`` (the cluster's coordination service), an HFReduce worker per node, so the
  ranks can ``hfreduce.init()`` (``fireflyer.hai.suspend_requested(comm)`` agrees on the flag
  through it).

Every call is idempotent: a start the agent already runs (ALREADY_EXISTS) is a success, and so is a
stop or suspend of a run the agent does not know (NOT_FOUND: it never started there, or ended).
"""

from __future__ import annotations

import signal as _signal
from collections.abc import AsyncIterator
from typing import Any

from fireflyer.api.node.v1 import node_pb2 as npb
from fireflyer.api.node.v1 import node_pb2_grpc as npb_grpc
from fireflyer.core.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable
from fireflyer.sched.agents import NodeRef, RankLaunch

__all__ = ["GrpcNodeAgents", "launch_env", "signal_number"]

#: the port rank 0's node offers torch's rendezvous (MASTER_PORT); HFReduce does not use it
MASTER_PORT = 29500


def signal_number(name: str) -> int:
    """``USR1`` / ``SIGUSR1`` / ``10`` -> 10; ``""`` -> 0 (no signal)."""
    if not name:
        return 0
    if name.isdigit():
        return int(name)
    key = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
    try:
        return int(_signal.Signals[key])
    except KeyError:
        raise InvalidArgument(f"unknown signal {name!r}", field="signal") from None


def launch_env(launch: RankLaunch) -> dict[str, str]:
    """The task-level environment of one rank's launch (the agent adds its own variables over it)."""
    env = {
        "FF_CHAIN_ID": str(launch.chain_id),
        "FF_WHOLE_LIFE_STATE": str(launch.whole_life_state),
        "FF_WATCHDOG_S": f"{launch.watchdog_s:g}",
        "FF_TASK_NAME": launch.name,
        "FF_TASK_USER": launch.user,
        "MARSV2_TASK_ID": str(launch.task_id),
        "MARSV2_RANK": str(launch.rank),
        "MARSV2_USER": launch.user,
        "MARSV2_NB_NAME": launch.name,
        "MARSV2_NODE_NAME": launch.nodes[launch.rank] if launch.rank < len(launch.nodes) else "",
        "MARSV2_WHOLE_LIFE_STATE": str(launch.whole_life_state),
        "MARSV2_TASK_TYPE": "training",
    }
    if launch.token:
        env["FF_TOKEN"] = launch.token
    return env


class GrpcNodeAgents:
    """:class:`~fireflyer.sched.agents.NodeAgents` over gRPC (module doc).  ``close()`` when done."""

    def __init__(self, *, token: str, coord_addr: str = "", timeout_s: float = 10.0) -> None:
        self.token = token
        self.coord_addr = coord_addr
        self.timeout_s = timeout_s
        self._channels: dict[str, Any] = {}

    def _stub(self, node: NodeRef) -> npb_grpc.NodeAgentStub:
        from fireflyer.rpc import connect

        if not node.address:
            raise Unavailable(f"node {node.name} has no agent address: its agent has not registered",
                              node=node.name)
        ch = self._channels.get(node.address)
        if ch is None:
            ch = self._channels[node.address] = connect(node.address, token=self.token)
        return npb_grpc.NodeAgentStub(ch)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for ch in channels.values():
            await ch.close()

    async def start(self, node: NodeRef, launch: RankLaunch) -> None:
        req = npb.StartTaskRequest(
            # FF_JOB_ID is the run's own id (a fresh HFReduce communicator per run: a killed run's
            # workers leave no state behind in coord); what spans the runs is FF_CHAIN_ID
            task_id=str(launch.task_id), command=list(launch.command), user=launch.user,
            ranks=[npb.Rank(rank=launch.rank, local_rank=0)], env=launch_env(launch),
            nnodes=len(launch.nodes), node_rank=launch.rank, world_size=len(launch.nodes),
            restart_count=launch.restart_count, master_addr=launch.master_address, master_port=MASTER_PORT,
            grace_s=launch.grace_s)
        if self.coord_addr:
            req.hfreduce.CopyFrom(npb.HFReduceSpec(coord_addr=self.coord_addr))
        try:
            await self._stub(node).StartTask(req, timeout=self.timeout_s)
        except AlreadyExists:
            return  # a repeat (a new leader re-sends starts of ranks still `created`)

    async def suspend(self, node: NodeRef, task_id: int, signal: str = "") -> None:
        req = npb.SuspendRequest(task_id=str(task_id), signal=signal_number(signal), reason="preempted by the scheduler")
        try:
            await self._stub(node).Suspend(req, timeout=self.timeout_s)
        except NotFound:
            return

    async def stop(self, node: NodeRef, task_id: int, grace_s: float) -> None:
        # grace 0 would mean "the task's grace" to the agent: an immediate stop is a tiny grace instead
        req = npb.StopTaskRequest(task_id=str(task_id), grace_s=grace_s if grace_s > 0 else 0.01)
        try:
            await self._stub(node).StopTask(req, timeout=self.timeout_s)
        except NotFound:
            return

    async def logs(self, node: NodeRef, task_id: int, rank: int, follow: bool) -> AsyncIterator[bytes]:
        req = npb.TailLogRequest(task_id=str(task_id), rank=rank, offset=0, follow=follow)
        call = self._stub(node).TailLog(req, timeout=86400.0 if follow else self.timeout_s)
        async for chunk in call:
            if chunk.data:
                yield chunk.data
            if chunk.eof:
                return
