"""A run's life after the decision, as pure transitions: start, interrupt, stop, reports, the end.

The scheduler service calls these inside its KV transactions and performs the node actions they
ask for after the commit.  The order of a preemption (HAI's interrupt protocol, research/hai.md §1):

1. :func:`start` puts a run on its nodes: running, ranks ``created`` until their agents report;
2. :func:`interrupt` (decide()'s preempt, or a user's Suspend) sets ``suspend_code`` SENT and the
   INTERRUPT stop bit; the service sends the suspend flag to *every* node of the run;
3. :func:`report` records the runtime's acknowledgement (RECEIVED) or ``go_suspend`` (CAN_SUSPEND)
   and the ranks' exits;
4. :func:`stop_due` says when the agents must stop it: at once for a user's stop, a failed rank,
   an evicting drain (HOOK_RESTART) or ``go_suspend``; after ``grace_ack_s`` for an unacknowledged interrupt; after ``grace_final_s``
   past the acknowledgement; the agents get ``grace_final_s`` between SIGTERM and SIGKILL;
5. once every rank has ended, :func:`finish` ends the run and, per
   :func:`~fireflyer.sched.model.should_requeue`, makes the chain's next run: same chain, same place
   in the FIFO, ``restart_count`` + 1, ``whole_life_state`` carried, chain status ``suspended``; a
   run that could not start (UNSCHEDULABLE) makes its next one wait 1, 2, 4 ... 60 s first.
"""

from __future__ import annotations

import msgspec

from fireflyer.sched.model import (
    FINISHED,
    QUEUED,
    RUNNING,
    SCHEDULED,
    SUSPENDED,
    Priority,
    RankState,
    RankStatus,
    SchedConfig,
    StopCode,
    SuspendCode,
    Task,
    should_requeue,
)
from fireflyer.sched.policy import Start
from fireflyer.sched.records import RunRecord

__all__ = ["TERMINAL", "UNSCHEDULABLE_BACKOFF_S", "UNSCHEDULABLE_BACKOFF_MAX_S", "with_priority", "start",
           "interrupt", "request_stop", "report", "stop_due", "all_ended", "finish", "grace_ack", "grace_final",
           "stop_reasons"]

#: a chain whose run could not start waits this long before the next try, doubling up to the maximum
UNSCHEDULABLE_BACKOFF_S = 1.0
UNSCHEDULABLE_BACKOFF_MAX_S = 60.0

TERMINAL = frozenset({RankState.SUCCEEDED, RankState.FAILED, RankState.STOPPED})
_USER_FAILURE = StopCode.FAILED | StopCode.INIT_FAILED | StopCode.TIMEOUT


def grace_ack(rec: RunRecord, config: SchedConfig) -> float:
    s = rec.task.spec.grace_ack_s
    return config.grace_ack_s if s is None else s


def grace_final(rec: RunRecord, config: SchedConfig) -> float:
    s = rec.task.spec.grace_final_s
    return config.grace_final_s if s is None else s


def stop_reasons(code: int) -> list[str]:
    """The names of the bits of a stop code, e.g. ``["INTERRUPT"]``."""
    return [c.name for c in StopCode if c.value and code & c.value and c.name]


def start(rec: RunRecord, s: Start, now: float) -> RunRecord:
    t = msgspec.structs.replace(
        rec.task, chain_status=RUNNING, queue_status=SCHEDULED, priority=s.priority, started_at=now,
        nodes=s.nodes, ranks=tuple(RankStatus(rank=i, node=n) for i, n in enumerate(s.nodes)))
    return msgspec.structs.replace(rec, task=t, reason="", reason_code="")


def interrupt(rec: RunRecord, now: float, reason: str, *, hold: bool = False) -> RunRecord:
    """Start the suspend handshake of a running run (a no-op on one already told to stop)."""
    t = rec.task
    if not t.running or t.releasing:
        return msgspec.structs.replace(rec, hold_next=rec.hold_next or hold)
    t = msgspec.structs.replace(t, suspend_code=SuspendCode.SENT, stop_code=t.stop_code | StopCode.INTERRUPT)
    return msgspec.structs.replace(rec, task=t, suspend_sent_at=now, reason=reason, reason_code="interrupted",
                                   hold_next=rec.hold_next or hold)


def request_stop(rec: RunRecord, code: StopCode, now: float, reason: str) -> RunRecord:
    """OR ``code`` into the stop code; a waiting run ends here and now (it holds no nodes)."""
    t = msgspec.structs.replace(rec.task, stop_code=rec.task.stop_code | code)
    rec = msgspec.structs.replace(rec, task=t, reason=reason, reason_code="stopped")
    if t.waiting or (rec.held and not t.running):
        t = msgspec.structs.replace(t, chain_status=FINISHED, queue_status=FINISHED)
        return msgspec.structs.replace(rec, task=t, finished_at=now, held=False)
    return rec


def report(rec: RunRecord, rank: int, state: RankState | None, exit_code: int | None,
           suspend_code: SuspendCode | None, whole_life_state: int | None, now: float) -> RunRecord:
    """An agent's report about one rank: its state, the suspend handshake, the chain's state integer.

    A rank that fails while the run was not being stopped fails the run (HAI: one failed pod fails
    the task); the other ranks are then stopped (:func:`stop_due`)."""
    t = rec.task
    ranks = list(t.ranks)
    if state is not None and 0 <= rank < len(ranks):
        old = ranks[rank]
        if old.state not in TERMINAL:  # a late "running" after an exit must not revive it
            ranks[rank] = msgspec.structs.replace(old, state=state, exit_code=exit_code)
            if state == RankState.FAILED and t.stop_code == StopCode.NONE:
                t = msgspec.structs.replace(t, stop_code=StopCode.FAILED)
                rec = msgspec.structs.replace(rec, reason=f"rank {rank} on {old.node} failed with exit code "
                                                          f"{exit_code}", reason_code="failed")
    t = msgspec.structs.replace(t, ranks=tuple(ranks))
    if suspend_code is not None and t.suspend_code != SuspendCode.NONE and suspend_code > t.suspend_code:
        t = msgspec.structs.replace(t, suspend_code=suspend_code)
        if suspend_code == SuspendCode.RECEIVED:
            rec = msgspec.structs.replace(rec, ack_at=now)
    if whole_life_state is not None:
        t = msgspec.structs.replace(t, whole_life_state=whole_life_state)
    return msgspec.structs.replace(rec, task=t)


def stop_due(rec: RunRecord, now: float, config: SchedConfig) -> float | None:
    """The SIGTERM->SIGKILL grace to stop the run with now, or None while no stop is due (or one was sent)."""
    t = rec.task
    if not t.running or rec.stop_sent_at is not None:
        return None
    final = grace_final(rec, config)
    if t.stop_code & (StopCode.MANUAL_STOP | _USER_FAILURE | StopCode.UNSCHEDULABLE | StopCode.NODE_LOST
                      | StopCode.HOOK_RESTART):
        return final
    if t.suspend_code == SuspendCode.CAN_SUSPEND:
        return 0.0
    if t.suspend_code == SuspendCode.RECEIVED:
        return final if now >= (rec.ack_at or now) + final else None
    if t.suspend_code == SuspendCode.SENT and rec.suspend_sent_at is not None:
        return final if now >= rec.suspend_sent_at + grace_ack(rec, config) else None
    return None


def all_ended(rec: RunRecord) -> bool:
    return rec.task.running and bool(rec.task.ranks) and all(r.state in TERMINAL for r in rec.task.ranks)


def finish(rec: RunRecord, now: float, next_id: int) -> tuple[RunRecord, RunRecord | None]:
    """End a run whose ranks all ended; the chain's next run if the restart rule says so."""
    t = rec.task
    code = t.stop_code
    if code == StopCode.NONE and any(r.state != RankState.SUCCEEDED for r in t.ranks):
        code = StopCode.FAILED  # (ranks stopped with nobody asking: a crash the agent saw as a stop)
    ended = msgspec.structs.replace(t, stop_code=code, chain_status=FINISHED, queue_status=FINISHED)
    failures = rec.failures + (1 if code & _USER_FAILURE else 0)
    done = msgspec.structs.replace(rec, task=ended, finished_at=now)
    if not should_requeue(code, t.spec, rec.failures):
        return done, None
    spec = t.spec
    unschedulable = rec.unschedulable + 1 if code & StopCode.UNSCHEDULABLE else 0
    backoff = min(UNSCHEDULABLE_BACKOFF_S * 2 ** (unschedulable - 1), UNSCHEDULABLE_BACKOFF_MAX_S) \
        if unschedulable else 0.0
    nxt = Task(id=next_id, chain_id=t.chain_id, spec=spec, submitted_at=t.submitted_at,
               restart_count=t.restart_count + 1, whole_life_state=t.whole_life_state,
               chain_status=SUSPENDED, queue_status=QUEUED, trace_context=t.trace_context)
    why = ", ".join(stop_reasons(code)).lower() or "requeued"
    return done, RunRecord(task=nxt, held=rec.hold_next, failures=failures, unschedulable=unschedulable,
                           not_before=now + backoff if backoff else None,
                           reason=f"requeued after run {t.id} ({why})" + ("; held until resumed" if rec.hold_next else ""),
                           reason_code="held" if rec.hold_next else "requeued")


def with_priority(rec: RunRecord, priority: Priority) -> RunRecord:
    """A new priority for the chain: its spec, and the level a running run defends itself with."""
    t = rec.task
    spec = msgspec.structs.replace(t.spec, priority=priority)
    admitted = t.priority
    if t.running and priority != Priority.AUTO:
        admitted = priority
    return msgspec.structs.replace(rec, task=msgspec.structs.replace(t, spec=spec, priority=admitted))
