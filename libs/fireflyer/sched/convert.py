"""protobuf <-> the scheduler's Structs, both directions (the edge of ``ff.scheduler.v1``).

Requests are checked while converting: a bad priority, a negative count or a grace that is not a
number raises InvalidArgument naming the field, before anything is written.
"""

from __future__ import annotations

from typing import Any

from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.core.errors import InvalidArgument
from fireflyer.sched.lifecycle import stop_reasons
from fireflyer.sched.model import Priority, Quota, TaskSpec, parse_priority, slurm_state
from fireflyer.sched.records import NodeRecord, RunRecord

__all__ = ["spec_from_pb", "spec_to_pb", "run_to_pb", "chain_to_pb", "node_to_pb", "node_from_pb",
           "quota_to_pb", "quota_from_pb"]


def spec_from_pb(m: pb.TaskSpec, *, user: str) -> TaskSpec:
    """The spec a caller submitted; ``user`` is who it runs as (the caller, or an admin's choice)."""
    def opt(field: str) -> float | None:
        return getattr(m, field) if m.HasField(field) else None

    return TaskSpec(
        name=m.name, user=user, shared_group=m.shared_group, group=m.group or "default", nodes=int(m.nodes),
        priority=parse_priority(m.priority or "NORMAL"), command=tuple(m.command), zone=m.zone,
        task_type=m.task_type or "training", max_restarts=int(m.max_restarts), grace_ack_s=opt("grace_ack_s"),
        grace_final_s=opt("grace_final_s"), signal=m.signal.upper() if m.signal else "",
        min_runtime_s=opt("min_runtime_s"), watchdog_s=m.watchdog_s or 1800.0,
        whole_life_state=int(m.whole_life_state))


def spec_to_pb(s: TaskSpec) -> pb.TaskSpec:
    m = pb.TaskSpec(name=s.name, user=s.user, shared_group=s.shared_group, group=s.group, nodes=s.nodes,
                    priority=Priority(s.priority).name, command=list(s.command), zone=s.zone, task_type=s.task_type,
                    max_restarts=s.max_restarts, signal=s.signal, watchdog_s=s.watchdog_s,
                    whole_life_state=s.whole_life_state)
    for field in ("grace_ack_s", "grace_final_s", "min_runtime_s"):
        if getattr(s, field) is not None:
            setattr(m, field, getattr(s, field))
    return m


def run_to_pb(rec: RunRecord) -> pb.Run:
    t = rec.task
    return pb.Run(
        id=t.id, chain_id=t.chain_id, restart_count=t.restart_count, whole_life_state=t.whole_life_state,
        chain_status=t.chain_status, queue_status=t.queue_status, slurm_state=slurm_state(t).value,
        priority=Priority(t.priority).name if t.priority is not None else "", submitted_at=t.submitted_at,
        started_at=t.started_at or 0.0, finished_at=rec.finished_at or 0.0, nodes=list(t.nodes),
        stop_code=int(t.stop_code), stop_reasons=stop_reasons(int(t.stop_code)), suspend_code=int(t.suspend_code),
        ranks=[pb.Rank(rank=r.rank, node=r.node, state=str(r.state),
                       exit_code=-1 if r.exit_code is None else r.exit_code) for r in t.ranks],
        reason=rec.reason, reason_code=rec.reason_code, held=rec.held or rec.hold_next, spec=spec_to_pb(t.spec))


def chain_to_pb(runs: list[RunRecord]) -> pb.Chain:
    first = runs[0].task
    return pb.Chain(chain_id=first.chain_id, user=first.spec.user, name=first.spec.name,
                    runs=[run_to_pb(r) for r in runs])


def node_to_pb(n: NodeRecord) -> pb.Node:
    return pb.Node(name=n.name, group=n.group, zone=n.zone, address=n.address, gpus=n.gpus, cpus=n.cpus,
                   state=n.state, reason=n.reason, task=n.task or 0, last_seen_at=n.last_seen_at)


def node_from_pb(m: Any) -> NodeRecord:
    """A node's registration (RegisterNodeRequest) as a record."""
    from fireflyer.bus.subjects import check_token

    if not m.name:
        raise InvalidArgument("a node registers with its name", field="name")
    check_token("name", m.name)  # node names travel in NATS subjects (ff.node.v1.node.<name>.*)
    if m.gpus < 0 or m.cpus < 0:
        raise InvalidArgument("gpus and cpus must be >= 0", field="gpus" if m.gpus < 0 else "cpus")
    return NodeRecord(name=m.name, group=m.group or "default", zone=m.zone, address=m.address, gpus=int(m.gpus),
                      cpus=int(m.cpus))


def quota_to_pb(q: Quota) -> pb.Quota:
    return pb.Quota(owner=q.owner, group=q.group, priority=Priority(q.priority).name, max_nodes=q.max_nodes,
                    expires_at=q.expires_at or 0.0)


def quota_from_pb(m: pb.Quota) -> Quota:
    return Quota(owner=m.owner, group=m.group, priority=parse_priority(m.priority), max_nodes=int(m.max_nodes),
                 expires_at=m.expires_at or None)
