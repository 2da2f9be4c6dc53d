"""The node agent's Prometheus metrics: the tasks it runs.

- ``ff_node_running_tasks``: tasks with a rank still running on this node;
- ``ff_node_tasks{state}``: every task the agent keeps, by state (running, stopping, stopped...).

Both sampled from the task manager on the loop at scrape time (nothing on the task path).
"""

from __future__ import annotations

from collections import Counter as Tally

from fireflyer.telemetry.metrics import ServiceMetrics

from .tasks import TaskManager

__all__ = ["NodeMetrics"]


class NodeMetrics:
    def __init__(self, metrics: ServiceMetrics, manager: TaskManager) -> None:
        self._manager = manager
        self._running = metrics.gauge("node_running_tasks", "Tasks with a rank running on this node")
        self._tasks = metrics.gauge("node_tasks", "Tasks the node agent keeps, by state", ("state",))
        self._seen: set[str] = set()
        metrics.on_scrape(self.sample)

    def sample(self) -> None:
        self._running.set(len(self._manager.running()))
        tally = Tally(str(getattr(t.state, "value", t.state)) for t in self._manager.state.tasks.values())
        for state in self._seen - tally.keys():
            self._tasks.labels(state=state).set(0)
        for state, n in tally.items():
            self._tasks.labels(state=state).set(n)
        self._seen |= tally.keys()
