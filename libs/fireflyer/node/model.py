"""The records a node agent keeps about the tasks it started (msgspec Structs, persisted as JSON).

A record says enough to find a rank's process again after the agent restarts: its pid, its
process group (the rank's own: ranks start in a session of their own, so ``pgid == pid``)
and its start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), which tells
the rank from an unrelated process that got the pid after the rank ended.
"""

from __future__ import annotations

import enum

import msgspec

__all__ = ["RankState", "TaskState", "RankSpec", "HFReduceSpec", "TaskSpec", "RankRecord", "WorkerRecord",
           "TaskRecord", "AgentState", "task_state_of"]


class RankState(enum.StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    #: the process vanished while no agent watched it (or its pid now belongs to another process)
    LOST = "lost"


class TaskState(enum.StrEnum):
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def ended(self) -> bool:
        return self not in (TaskState.RUNNING, TaskState.STOPPING)


class RankSpec(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    local_rank: int
    env: dict[str, str] = msgspec.field(default_factory=dict)


class HFReduceSpec(msgspec.Struct, frozen=True, kw_only=True):
    coord_addr: str = ""
    peers: tuple[str, ...] = ()
    listen: str = ""
    chunk_size: str = ""
    timeout_s: float = 0.0


class TaskSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What StartTask asks for, validated (``services.node`` converts the protobuf)."""

    task_id: str
    command: tuple[str, ...]
    ranks: tuple[RankSpec, ...]
    job_id: str = ""
    cwd: str = ""
    user: str = ""
    grace_s: float = 10.0
    env: dict[str, str] = msgspec.field(default_factory=dict)
    nnodes: int = 1
    node_rank: int = 0
    world_size: int = 0
    restart_count: int = 0
    master_addr: str = ""
    master_port: int = 0
    hfreduce: HFReduceSpec | None = None

    @property
    def job(self) -> str:
        return self.job_id or self.task_id

    @property
    def world(self) -> int:
        """Ranks of the whole task: given, else this node's ranks times the nodes."""
        return self.world_size or len(self.ranks) * max(self.nnodes, 1)


class RankRecord(msgspec.Struct, kw_only=True):
    rank: int
    local_rank: int
    pid: int
    pgid: int
    #: /proc start time in clock ticks (None where /proc is missing)
    start_ticks: int | None
    log: str
    state: RankState = RankState.RUNNING
    exit_code: int | None = None


class WorkerRecord(msgspec.Struct, kw_only=True):
    pid: int
    start_ticks: int | None
    socket: str
    restarts: int = 0
    log: str = ""


class TaskRecord(msgspec.Struct, kw_only=True):
    spec: TaskSpec
    ranks: list[RankRecord]
    state: TaskState = TaskState.RUNNING
    started_at: float = 0.0
    ended_at: float = 0.0
    suspend_requested: bool = False
    #: set by StopTask: the exit of the ranks is then "stopped", not "failed"
    stop_requested: bool = False
    worker: WorkerRecord | None = None
    #: task_exit already published (so a restarted agent does not publish it twice)
    reported: bool = False


class AgentState(msgspec.Struct, kw_only=True):
    """The agent's state file: every task it started and has not forgotten."""

    node: str
    tasks: dict[str, TaskRecord] = msgspec.field(default_factory=dict)


def task_state_of(ranks: list[RankRecord], *, stop_requested: bool) -> TaskState:
    """The task's state from its ranks' on this node.

    Any rank running: RUNNING (STOPPING once a stop was asked).  All ended: STOPPED when a
    stop was asked; else LOST if any rank was lost, FAILED if any exit code was not 0, and
    SUCCEEDED when all were 0.  An exit code nobody could read (a rank adopted after an agent
    restart ends: it is not the new agent's child) counts as a success only if the other
    ranks succeeded -- it is reported as unknown in the rank's status.
    """
    if any(r.state is RankState.RUNNING for r in ranks):
        return TaskState.STOPPING if stop_requested else TaskState.RUNNING
    if stop_requested:
        return TaskState.STOPPED
    if any(r.state is RankState.LOST for r in ranks):
        return TaskState.LOST
    if any(r.exit_code not in (0, None) for r in ranks):
        return TaskState.FAILED
    return TaskState.SUCCEEDED
