"""The scheduler's Prometheus metrics: its queue and its nodes, as the leader's last decision saw them.

- ``ff_scheduler_pending_tasks{reason}``: runs waiting to start, by the code of why they wait
  (the decision's reason code: ``quota``, ``nodes``, ...; ``backoff`` after failed starts;
  ``held`` while suspended by the user; ``none`` before a decision named one);
- ``ff_scheduler_nodes{state,busy}``: nodes by state (enabled, drained; a node whose agent went
  silent counts as drained) and whether a run holds them (busy, free);
- ``ff_scheduler_leader``: 1 on the replica that holds the lease and decides, 0 on the others.

Only the leader decides, so only the leader reports the first two (a follower's would be stale);
sum them over the replicas, or select ``ff_scheduler_leader == 1``.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fireflyer.sched.model import NodeView
from fireflyer.telemetry.metrics import ServiceMetrics

__all__ = ["QueueView", "queue_view", "SchedulerMetrics"]


@dataclass(frozen=True)
class QueueView:
    """What one decision cycle left: waiting runs by reason code, nodes by (state, busy)."""

    pending: dict[str, int] = field(default_factory=dict)
    nodes: dict[tuple[str, str], int] = field(default_factory=dict)


def queue_view(waiting_codes: Iterable[str], nodes: Iterable[NodeView]) -> QueueView:
    """Tally a cycle's waiting runs (one reason code each) and its node views."""
    return QueueView(pending=dict(Tally(waiting_codes)),
                     nodes=dict(Tally((n.state, "busy" if n.busy else "free") for n in nodes)))


class SchedulerMetrics:
    def __init__(self, metrics: ServiceMetrics, *, is_leader: Callable[[], bool],
                 view: Callable[[], QueueView | None]) -> None:
        self._is_leader, self._view = is_leader, view
        self._pending = metrics.gauge("scheduler_pending_tasks", "Runs waiting to start, by why they wait",
                                      ("reason",))
        self._nodes = metrics.gauge("scheduler_nodes", "Nodes by state and whether a run holds them",
                                    ("state", "busy"))
        self._leader = metrics.gauge("scheduler_leader", "1 on the replica that holds the scheduler lease")
        metrics.on_scrape(self.sample)

    def sample(self) -> None:
        leader = self._is_leader()
        self._leader.set(1 if leader else 0)
        view = self._view() if leader else None
        # a fresh set each scrape: reasons and states that no longer occur disappear (a waiting
        # reason is gone once its runs start), and a follower reports none
        self._pending.clear()
        self._nodes.clear()
        if view is None:
            return
        for reason, n in view.pending.items():
            self._pending.labels(reason=reason).set(n)
        for (state, busy), n in view.nodes.items():
            self._nodes.labels(state=state, busy=busy).set(n)
