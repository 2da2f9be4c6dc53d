"""Small builders for scheduling scenarios (imported by the sched tests)."""

from __future__ import annotations

import msgspec

from fireflyer.sched.model import (
    DRAINED,
    ENABLED,
    RUNNING,
    SUSPENDED,
    WAITING_INIT,
    NodeView,
    Priority,
    StopCode,
    SuspendCode,
    Task,
    TaskSpec,
)

HOUR = 3600.0


def cluster(zones: dict[str, int], group: str = "default", prefix: str = "n", drained: dict[str, str] | None = None,
            held: dict[str, int] | None = None) -> list[NodeView]:
    """Nodes ``<prefix><i>`` numbered across zones in order; ``drained`` name -> reason; ``held`` name -> run."""
    drained = drained or {}
    held = held or {}
    out, i = [], 0
    for zone, count in zones.items():
        for _ in range(count):
            name = f"{prefix}{i}"
            out.append(NodeView(name=name, group=group, zone=zone, state=DRAINED if name in drained else ENABLED,
                                reason=drained.get(name, ""), task=held.get(name)))
            i += 1
    return out


def waiting(id: int, nodes: int, priority: Priority = Priority.NORMAL, user: str = "alice", at: float = 0.0,
            suspended: bool = False, **kw: object) -> Task:
    spec = TaskSpec(user=user, nodes=nodes, priority=priority, command=("run",), **kw)  # type: ignore[arg-type]
    return Task(id=id, chain_id=id, spec=spec, submitted_at=at, chain_status=SUSPENDED if suspended else WAITING_INIT)


def running(id: int, nodes: list[str], priority: Priority = Priority.NORMAL, user: str = "alice", at: float = 0.0,
            started: float = 0.0, releasing: bool = False, **kw: object) -> Task:
    spec = TaskSpec(user=user, nodes=len(nodes), priority=priority, command=("run",), **kw)  # type: ignore[arg-type]
    return Task(id=id, chain_id=id, spec=spec, submitted_at=at, chain_status=RUNNING, queue_status="scheduled",
                priority=priority if priority != Priority.AUTO else Priority.LOW, started_at=started,
                nodes=tuple(nodes), suspend_code=SuspendCode.SENT if releasing else SuspendCode.NONE,
                stop_code=StopCode.INTERRUPT if releasing else StopCode.NONE)


def hold(nodes: list[NodeView], tasks: list[Task]) -> list[NodeView]:
    """The node view with each running task's nodes held by it."""
    by_node = {n: t.id for t in tasks if t.running for n in t.nodes}
    return [msgspec.structs.replace(n, task=by_node.get(n.name, n.task)) for n in nodes]
