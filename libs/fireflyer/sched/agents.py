"""What the scheduler asks of a node: start a run's rank there, deliver a suspend, stop, read logs.

The scheduler service talks to node agents only through :class:`NodeAgents`, so the wiring to the
real agent (``services/node``'s NodeAgent gRPC service) is one adapter, and tests use
:class:`fireflyer.testing.schednodes.FakeNodeAgents`.  Agents answer back through the scheduler's
``NodeService.Report`` (role service): a rank running, a rank's exit, the runtime's acknowledgement
of a suspend and its ``go_suspend``.

Every call is idempotent by (run id, rank): a new leader re-sends what its predecessor may have
sent before it died (a start of ranks still ``created``, a suspend of a run still in the
handshake, a stop of a run told to stop), and an agent must take a repeat as a no-op.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

import msgspec

from fireflyer.core.errors import Unavailable

__all__ = ["NodeRef", "RankLaunch", "NodeAgents", "UnwiredAgents"]


class NodeRef(msgspec.Struct, frozen=True, kw_only=True):
    """Which node, and where its agent listens (as it registered)."""

    name: str
    address: str = ""


class RankLaunch(msgspec.Struct, frozen=True, kw_only=True):
    """One rank (one node) of a run, with what the agent needs to build the process environment
    (DESIGN.md §3: ``FF_TASK_ID``, ``FF_RESTART_COUNT``, ``FF_NODE_RANK``, ``FF_NNODES``, HAI's
    ``MARSV2_WHOLE_LIFE_STATE``, Slurm's ``SLURM_JOB_ID`` / ``SLURM_NODEID`` ... and ``MASTER_ADDR``,
    the address of rank 0's node)."""

    task_id: int
    chain_id: int
    restart_count: int
    whole_life_state: int
    user: str
    name: str
    rank: int
    nodes: tuple[str, ...]
    master_address: str
    command: tuple[str, ...]
    watchdog_s: float
    signal: str = ""
    #: SIGTERM -> SIGKILL grace the agent keeps for this run (the run's grace_final_s)
    grace_s: float = 10.0
    #: the submitter's bearer token, the ranks' FF_TOKEN (docs/scheduler.md, "The task's credential");
    #: never logged
    token: str = ""
    #: the chain's trace context (W3C traceparent; ``Task.trace_context``), "" when untraced
    traceparent: str = ""

    def __repr__(self) -> str:  # the token stays out of logs and tracebacks
        return f"RankLaunch(task_id={self.task_id}, rank={self.rank}, nodes={self.nodes!r})"


@runtime_checkable
class NodeAgents(Protocol):
    """The scheduler's side of the node agents (module doc)."""

    async def start(self, node: NodeRef, launch: RankLaunch) -> None:
        """Start rank ``launch.rank`` of run ``launch.task_id`` on ``node``; raise if it cannot."""

    async def suspend(self, node: NodeRef, task_id: int, signal: str = "") -> None:
        """Raise the suspend flag for every process of the run on ``node`` (and send ``signal``, if any)."""

    async def stop(self, node: NodeRef, task_id: int, grace_s: float) -> None:
        """SIGTERM the run's processes on ``node``, SIGKILL after ``grace_s``; the exit is reported.

        A rank the agent never started (its start was lost) has nothing to report: the scheduler
        counts such ranks as stopped when the stop has gone unanswered for ``resend_s``."""

    def logs(self, node: NodeRef, task_id: int, rank: int, follow: bool) -> AsyncIterator[bytes]:
        """The rank's output from the start; with ``follow``, until the rank ends."""
        ...


class UnwiredAgents:
    """The agents of a scheduler with no way to reach node agents (the service uses
    ``services.scheduler.nodeclient.GrpcNodeAgents``; this stands in until it starts): every call fails with
    Unavailable naming the node (a start then fails the run as unschedulable, and it is requeued)."""

    async def start(self, node: NodeRef, launch: RankLaunch) -> None:
        raise self._error(node)

    async def suspend(self, node: NodeRef, task_id: int, signal: str = "") -> None:
        raise self._error(node)

    async def stop(self, node: NodeRef, task_id: int, grace_s: float) -> None:
        raise self._error(node)

    async def logs(self, node: NodeRef, task_id: int, rank: int, follow: bool) -> AsyncIterator[bytes]:
        raise self._error(node)
        yield b""  # (an async generator, as the protocol's callers iterate it)

    @staticmethod
    def _error(node: NodeRef) -> Unavailable:
        return Unavailable(f"the scheduler cannot reach node {node.name}: no node-agent adapter is configured "
                           "in this scheduler (services/node brings one)", node=node.name)
