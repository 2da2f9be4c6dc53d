"""What the scheduler service keeps per run and per node, beside the pure task model.

:class:`RunRecord` wraps one :class:`~fireflyer.sched.model.Task` (one run of a chain) with what the
service needs to drive it through its life: the one-line reason it waits or stopped, whether the
chain is held (a user's Suspend), and the times of the interrupt handshake and of the stop it sent,
from which :mod:`fireflyer.sched.lifecycle` decides when grace times end.  :class:`NodeRecord` is a
node as its agent registered it, with the admin's drain and the run that holds it.
"""

from __future__ import annotations

import msgspec

from fireflyer.sched.model import ENABLED, NodeView, Task

__all__ = ["RunRecord", "NodeRecord"]


class RunRecord(msgspec.Struct, kw_only=True):
    """One run and the service's bookkeeping of it.

    - ``reason`` / ``reason_code``: why it waits (the decision's :class:`~fireflyer.sched.policy.Reason`),
      or why it stopped;
    - ``held``: the chain waits for a Resume before it is scheduled again (user's Suspend);
      ``hold_next``: the chain's next run starts held (the Suspend came while this one ran);
    - ``suspend_sent_at`` / ``ack_at``: when the interrupt went out and when the runtime acknowledged;
    - ``stop_sent_at``: when the agents were told to stop the run (None: not yet);
    - ``failures``: runs of the chain before this one that ended in a user-code failure
      (``should_requeue``'s count against ``max_restarts``);
    - ``unschedulable`` / ``not_before``: a chain whose runs keep failing to start (a node agent
      that refuses or cannot be reached) waits 1, 2, 4 ... up to 60 s before it is tried again,
      rather than being restarted in a tight loop.
    """

    task: Task
    reason: str = ""
    reason_code: str = ""
    held: bool = False
    hold_next: bool = False
    finished_at: float | None = None
    suspend_sent_at: float | None = None
    ack_at: float | None = None
    stop_sent_at: float | None = None
    failures: int = 0
    #: runs of the chain in a row that could not start (unschedulable), and when the next may try
    unschedulable: int = 0
    not_before: float | None = None

    @property
    def id(self) -> int:
        return self.task.id

    @property
    def user(self) -> str:
        return self.task.spec.user


class NodeRecord(msgspec.Struct, kw_only=True):
    """A node as its agent registered it (labels, address), the admin's state, and its holder."""

    name: str
    group: str = "default"
    zone: str = ""
    address: str = ""
    gpus: int = 0
    cpus: int = 0
    state: str = ENABLED
    reason: str = ""
    task: int | None = None
    last_seen_at: float = 0.0
    registered_by: str = ""

    def view(self) -> NodeView:
        return NodeView(name=self.name, group=self.group, zone=self.zone, state=self.state, reason=self.reason,
                        task=self.task)
