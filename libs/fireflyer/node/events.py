"""The node agent's NATS events (JSON, tagged; see :mod:`fireflyer.bus.events`).

- ``ff.node.v1.node.<name>.heartbeat``: :class:`NodeHeartbeat`, every ``heartbeat_interval_s``
  (the node's labels ride along, so a scheduler learns a node from its first heartbeat);
- ``ff.node.v1.node.<name>.task_exit``: :class:`TaskExited`, once per task, when its last rank
  on this node has ended.
"""

from __future__ import annotations

from fireflyer.bus.events import Event
from fireflyer.bus.subjects import pattern, subject

__all__ = ["NodeHeartbeat", "TaskExited", "heartbeat_subject", "task_exit_subject", "HEARTBEAT_PATTERN",
           "TASK_EXIT_PATTERN"]


class NodeHeartbeat(Event, tag="node.heartbeat.v1"):
    node: str
    group: str = ""
    zone: str = ""
    cpus: int = 0
    gpus: int = 0
    address: str = ""
    agent_address: str = ""
    running_tasks: list[str] = []
    started_at: float = 0.0


class TaskExited(Event, tag="node.task_exit.v1"):
    node: str
    task_id: str
    #: succeeded, failed, stopped, lost
    state: str
    #: rank -> exit code (negative: killed by that signal; None: unknown, see fireflyer.node.model)
    exit_codes: dict[str, int | None] = {}
    suspend_requested: bool = False


def heartbeat_subject(node: str) -> str:
    return subject("node", "node", node, "heartbeat")


def task_exit_subject(node: str) -> str:
    return subject("node", "node", node, "task_exit")


HEARTBEAT_PATTERN = pattern("node", entity="node", event="heartbeat")
TASK_EXIT_PATTERN = pattern("node", entity="node", event="task_exit")
