"""HAI Platform's task model as plain data: chains of runs, states, stop codes, specs, nodes, quotas.

The shapes follow HAI Platform (``research/hai.md`` §1) so that a HAI user finds their words:

- a user-visible experiment is a **chain**; every start or resume of it is a new **run** with its
  own ``id``; all runs share ``chain_id``; ``restart_count`` counts the runs before this one (HAI
  shows it as ``suspend_count``, Slurm as ``SLURM_RESTART_COUNT``); ``whole_life_state`` is the
  integer the user sets and that survives resumes;
- ``chain_status`` is waiting_init -> running -> suspended (queued again after an interrupt) ->
  finished, beside HAI's ``queue_status`` (queued / scheduled / finished);
- ``stop_code`` is a bitmask OR-ed over the run's lifecycle events, with HAI's values;
- ``suspend_code`` is the interrupt handshake (none -> sent -> received -> can-suspend).

Slurm-style state names stand beside them (:func:`slurm_state`), and HAI's priority levels keep their
numeric values (EXTREME_HIGH 50 ... LOW 0, AUTO -1).  Everything here is pure data and pure checks;
the decision lives in :mod:`fireflyer.sched.policy`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

import msgspec

from fireflyer.core.errors import InvalidArgument

__all__ = [
    "Priority", "PRIORITY_NAMES", "parse_priority", "StopCode", "SuspendCode",
    "WAITING_INIT", "RUNNING", "SUSPENDED", "FINISHED", "CHAIN_STATUSES",
    "QUEUED", "SCHEDULED", "QUEUE_STATUSES", "RANK_STATES", "RankState", "RankStatus",
    "SlurmState", "slurm_state", "ENABLED", "DRAINED", "NODE_STATES",
    "TaskSpec", "Task", "NodeView", "Quota", "SchedConfig", "check_spec", "should_requeue",
    "TASK_TYPES", "LEVELS",
]


class Priority(enum.IntEnum):
    """HAI's priority levels with HAI's numbers (server flags); higher runs first.

    ``UNDER_NORMAL`` is HAI's lowest *internal* level and ``LOW`` is what external users get.
    ``AUTO`` is not a level: the scheduler resolves it when the task starts (see
    :func:`fireflyer.sched.policy.resolve_auto`) and the run keeps the level it got.
    """

    EXTREME_HIGH = 50
    VERY_HIGH = 40
    HIGH = 30
    ABOVE_NORMAL = 20
    NORMAL = 10
    UNDER_NORMAL = 8
    BELOW_NORMAL = 5
    LOW = 0
    AUTO = -1


#: the real levels, highest first (AUTO left out)
LEVELS: tuple[Priority, ...] = tuple(sorted((p for p in Priority if p is not Priority.AUTO), reverse=True))
PRIORITY_NAMES: dict[str, Priority] = {p.name: p for p in Priority}


def parse_priority(value: str | int) -> Priority:
    """``"HIGH"``, ``"high"``, ``30`` or ``"30"`` -> :class:`Priority`; anything else -> InvalidArgument."""
    if isinstance(value, str):
        text = value.strip()
        if text.upper() in PRIORITY_NAMES:
            return PRIORITY_NAMES[text.upper()]
        if text.lstrip("-").isdigit():
            value = int(text)
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return Priority(value)
        except ValueError:
            pass
    raise InvalidArgument(f"unknown priority {value!r}; use one of {', '.join(PRIORITY_NAMES)} "
                          f"or their numbers", field="priority")


class StopCode(enum.IntFlag):
    """Why a run stopped, OR-ed over its lifecycle (HAI's bit values).

    STOP 1, INTERRUPT 16, UNSCHEDULABLE 32, FAILED 128, INIT_FAILED 256, TIMEOUT 512, MANUAL_STOP
    1024 and HOOK_RESTART 2048 are HAI's.  HAI also has MANUAL_SUCCEEDED / MANUAL_FAILED, but
    ``research/hai.md`` does not give their numbers: we define them as the next free bits, 4096
    and 8192, and add NODE_LOST 16384 (ours: the node agent stopped heartbeating, a hardware
    fault that requeues the run elsewhere, as HAI's hardware hook does).
    """

    NONE = 0
    STOP = 1
    INTERRUPT = 16
    UNSCHEDULABLE = 32
    FAILED = 128
    INIT_FAILED = 256
    TIMEOUT = 512
    MANUAL_STOP = 1024
    HOOK_RESTART = 2048
    MANUAL_SUCCEEDED = 4096  # ours: value not in the HAI sources we read
    MANUAL_FAILED = 8192  # ours: value not in the HAI sources we read
    NODE_LOST = 16384  # ours


class SuspendCode(enum.IntEnum):
    """The interrupt handshake: the scheduler sent the flag, the task acknowledged, the task said go."""

    NONE = 0
    SENT = 1
    RECEIVED = 2
    CAN_SUSPEND = 3


WAITING_INIT, RUNNING, SUSPENDED, FINISHED = "waiting_init", "running", "suspended", "finished"
CHAIN_STATUSES = (WAITING_INIT, RUNNING, SUSPENDED, FINISHED)
QUEUED, SCHEDULED = "queued", "scheduled"
QUEUE_STATUSES = (QUEUED, SCHEDULED, FINISHED)

TASK_TYPES = ("training", "jupyter", "validation", "virtual", "background", "upgrade")


class RankState(enum.StrEnum):
    """Per-rank (per-node) state of a run, HAI's pod states."""

    CREATED = "created"
    BUILDING = "building"
    UNSCHEDULABLE = "unschedulable"
    RUNNING = "running"
    SUCCEEDED_TERMINATING = "succeeded_terminating"
    FAILED_TERMINATING = "failed_terminating"
    STOPPED_TERMINATING = "stopped_terminating"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


RANK_STATES = tuple(s.value for s in RankState)


class RankStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One rank (one node) of a run."""

    rank: int
    node: str
    state: RankState = RankState.CREATED
    exit_code: int | None = None


class SlurmState(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    REQUEUED = "REQUEUED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"


ENABLED, DRAINED = "enabled", "drained"
NODE_STATES = (ENABLED, DRAINED)

#: bits after which a finished run counts as failed (Slurm FAILED; TIMEOUT folds in here)
_FAILED_BITS = StopCode.FAILED | StopCode.INIT_FAILED | StopCode.TIMEOUT | StopCode.MANUAL_FAILED \
    | StopCode.NODE_LOST | StopCode.UNSCHEDULABLE
#: bits that requeue a run (HAI's restart rule: interrupt, unschedulable, hardware hook; ours: node lost)
_REQUEUE_BITS = StopCode.INTERRUPT | StopCode.UNSCHEDULABLE | StopCode.HOOK_RESTART | StopCode.NODE_LOST
#: bits that forbid a requeue whatever else is set: the user asked for the end
_FINAL_BITS = StopCode.MANUAL_STOP | StopCode.MANUAL_SUCCEEDED | StopCode.MANUAL_FAILED


class TaskSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a user submits (HAI's v2 experiment file, with Slurm's knobs beside it).

    ``group`` is the *node* group (HAI's scheduling group, Slurm's partition); ``shared_group`` is
    the user's own group (HAI's ``shared_group``, e.g. ``public``), whose quotas the user shares.
    ``zone`` pins the task to one network zone ("" lets the scheduler choose).  Grace times left at
    None take the cluster's defaults (:class:`SchedConfig`); ``min_runtime_s`` None takes the
    cluster's minimum runtime before a preemption.
    """

    name: str = ""
    user: str
    shared_group: str = ""
    group: str = "default"
    nodes: int = 1
    priority: Priority = Priority.NORMAL
    command: tuple[str, ...] = ()
    zone: str = ""
    task_type: str = "training"
    max_restarts: int = 0
    grace_ack_s: float | None = None
    grace_final_s: float | None = None
    signal: str = ""
    min_runtime_s: float | None = None
    watchdog_s: float = 1800.0
    whole_life_state: int = 0


class Task(msgspec.Struct, kw_only=True):
    """One run of a chain as the scheduler sees it.

    ``chain_id`` is the id of the chain's first run (HAI's ``first_id``).
    ``submitted_at`` is when the *chain* was first submitted: a resumed run keeps its chain's place
    in the FIFO, as HAI sorts by ``first_id``.  ``priority`` is the level the run was admitted at
    (AUTO resolved; None while it waits); quotas are charged at that level.  ``nodes`` are the
    nodes the run holds while running (rank order).  A running run whose ``suspend_code`` or
    ``stop_code`` is set is *releasing*: it still holds its nodes until its agents report them free.
    """

    id: int
    chain_id: int
    spec: TaskSpec
    submitted_at: float
    restart_count: int = 0
    whole_life_state: int = 0
    chain_status: str = WAITING_INIT
    queue_status: str = QUEUED
    priority: Priority | None = None
    started_at: float | None = None
    nodes: tuple[str, ...] = ()
    stop_code: StopCode = StopCode.NONE
    suspend_code: SuspendCode = SuspendCode.NONE
    ranks: tuple[RankStatus, ...] = ()
    #: W3C ``traceparent`` of the chain's submission (the scheduler's ``task.submit`` span): every
    #: run's StartTask calls and rank processes join that trace (docs/tracing.md); "" when untraced
    trace_context: str = ""

    @property
    def waiting(self) -> bool:
        return self.chain_status in (WAITING_INIT, SUSPENDED) and self.queue_status == QUEUED

    @property
    def running(self) -> bool:
        return self.chain_status == RUNNING

    @property
    def releasing(self) -> bool:
        """Told to stop (interrupt or stop) but still holding its nodes."""
        return self.running and (self.suspend_code != SuspendCode.NONE or self.stop_code != StopCode.NONE)


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    """A node as the scheduler sees it: where it is, whether it takes work, who holds it.

    ``task`` is the run that holds the node (running, or releasing until its agent reports the
    node free); None means free.  A drained node keeps its running task but gets no new one.
    """

    name: str
    group: str = "default"
    zone: str = ""
    state: str = ENABLED
    reason: str = ""
    task: int | None = None

    @property
    def busy(self) -> bool:
        return self.task is not None


class Quota(msgspec.Struct, frozen=True, kw_only=True):
    """At most ``max_nodes`` nodes of node group ``group`` at ``priority`` for ``owner``.

    ``owner`` is a user name or a shared group name (HAI's ``node-<group>-<PRIORITY>`` resource).
    A user's entry caps that user; a shared group's entry caps its members together.  An entry past
    ``expires_at`` (HAI's ``expire_time``; None: never) counts as absent.
    """

    owner: str
    group: str
    priority: Priority
    max_nodes: int
    expires_at: float | None = None


class SchedConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The cluster admin's knobs for the decision (defaults: HAI's, where HAI has one).

    - ``min_runtime_s``: a run is not preempted before it has run this long (HAI's unused
      ``SCHEDULE_RUNNING_MIN_TIME`` = 15 min, Slurm's ``PreemptExemptTime``);
    - ``demote_above_normal_s``: an ABOVE_NORMAL run counts as NORMAL after this long running
      (HAI's documented 30 minutes) when victims are chosen;
    - ``preempt_equal_priority``: also let a waiting task preempt a *later-submitted* running task of
      the same priority and another user (HAI's time sharing); never one of the same user;
    - ``default_quota``: the cap where no quota entry applies (None: no cap);
    - ``auto_fallback``: the level an AUTO task gets when no quota entry of its user names a level
      with room for it;
    - grace defaults and bounds for the suspend handshake (HAI: 5 s to acknowledge, 5 s to save).
    """

    min_runtime_s: float = 900.0
    demote_above_normal_s: float = 1800.0
    allow_cross_zone: bool = True
    preempt_equal_priority: bool = False
    default_quota: int | None = None
    auto_fallback: Priority = Priority.LOW
    grace_ack_s: float = 5.0
    grace_final_s: float = 5.0
    grace_max_s: float = 3600.0
    min_runtime_max_s: float = 86400.0


_SIGNALS = {"", "SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"}


def check_spec(spec: TaskSpec, *, groups: Mapping[str, int] | None = None,
               zones: Iterable[str] | None = None, config: SchedConfig | None = None) -> None:
    """Refuse a spec that cannot be scheduled, naming the field (InvalidArgument).

    ``groups`` maps each node group to its node count (None: not checked); ``zones`` lists the
    cluster's zones (None: not checked).
    """
    config = config or SchedConfig()

    def bad(field: str, why: str) -> InvalidArgument:
        return InvalidArgument(f"task spec: {field} {why}", field=field)

    if not spec.user or any(c.isspace() for c in spec.user):
        raise bad("user", f"must be a non-empty name without spaces, got {spec.user!r}")
    if not isinstance(spec.nodes, int) or spec.nodes < 1:
        raise bad("nodes", f"must be at least 1 (whole nodes), got {spec.nodes!r}")
    try:
        Priority(spec.priority)
    except ValueError:
        raise bad("priority", f"{spec.priority!r} is not a HAI level; use one of "
                              f"{', '.join(PRIORITY_NAMES)}") from None
    if not spec.command or not spec.command[0].strip():
        raise bad("command", "is empty; give the program and its arguments after --")
    if spec.task_type not in TASK_TYPES:
        raise bad("task_type", f"{spec.task_type!r} is not one of {', '.join(TASK_TYPES)}")
    if groups is not None:
        if spec.group not in groups:
            raise bad("group", f"{spec.group!r} is not a node group of this cluster "
                               f"(groups: {', '.join(sorted(groups)) or 'none'})")
        if spec.nodes > groups[spec.group]:
            raise bad("nodes", f"{spec.nodes} is more than node group {spec.group!r} has "
                               f"({groups[spec.group]})")
    if spec.zone and zones is not None and spec.zone not in set(zones):
        raise bad("zone", f"{spec.zone!r} is not a zone of this cluster")
    for field in ("grace_ack_s", "grace_final_s"):
        value = getattr(spec, field)
        if value is not None and not 0 <= value <= config.grace_max_s:
            raise bad(field, f"must be between 0 and {config.grace_max_s:g} seconds, got {value!r}")
    if spec.min_runtime_s is not None and not 0 <= spec.min_runtime_s <= config.min_runtime_max_s:
        raise bad("min_runtime_s", f"must be between 0 and {config.min_runtime_max_s:g} seconds, "
                                   f"got {spec.min_runtime_s!r}")
    if spec.signal not in _SIGNALS:
        raise bad("signal", f"{spec.signal!r} is not one of {', '.join(sorted(_SIGNALS - {''}))}")
    if spec.max_restarts < 0:
        raise bad("max_restarts", f"must be >= 0, got {spec.max_restarts}")
    if spec.watchdog_s <= 0:
        raise bad("watchdog_s", f"must be > 0 seconds, got {spec.watchdog_s!r}")
    if not 0 <= spec.whole_life_state < 2**31:
        raise bad("whole_life_state", f"must fit a 32-bit signed integer >= 0, got {spec.whole_life_state}")


def should_requeue(stop_code: StopCode | int, spec: TaskSpec, failures: int = 0) -> bool:
    """HAI's restart rule: does a run that stopped with ``stop_code`` get a next run?

    Interrupt, unschedulable, the hardware hook and a lost node requeue; a user's stop never does,
    nor a validation task.  A user-code failure (FAILED, INIT_FAILED, TIMEOUT) requeues only while
    the chain has failed fewer than ``spec.max_restarts`` times (``failures`` before this one),
    torchrun's ``--max-restarts``.
    """
    code = StopCode(stop_code)
    if code & _FINAL_BITS or spec.task_type == "validation":
        return False
    if code & _REQUEUE_BITS:
        return True
    if code & (StopCode.FAILED | StopCode.INIT_FAILED | StopCode.TIMEOUT):
        return failures < spec.max_restarts
    return False


def slurm_state(task: Task) -> SlurmState:
    """The Slurm name of a run's state.

    waiting_init -> PENDING; suspended (requeued after an interrupt) -> REQUEUED; running ->
    RUNNING, or PREEMPTED once the interrupt was sent; finished -> CANCELLED for a user's stop,
    FAILED for failure bits (TIMEOUT included: the list has no TIMEOUT), PREEMPTED for a run that
    ended by an interrupt (its chain goes on as a next run), REQUEUED for one stopped to run again
    elsewhere (HOOK_RESTART: its node was drained for a fault), else COMPLETED.
    """
    if task.chain_status == WAITING_INIT:
        return SlurmState.PENDING
    if task.chain_status == SUSPENDED:
        return SlurmState.REQUEUED
    if task.chain_status == RUNNING:
        if task.suspend_code != SuspendCode.NONE or task.stop_code & StopCode.INTERRUPT:
            return SlurmState.PREEMPTED
        return SlurmState.RUNNING
    code = StopCode(task.stop_code)
    if code & StopCode.MANUAL_STOP:
        return SlurmState.CANCELLED
    if code & _FAILED_BITS:
        return SlurmState.FAILED
    if code & StopCode.INTERRUPT:
        return SlurmState.PREEMPTED
    if code & StopCode.HOOK_RESTART:
        return SlurmState.REQUEUED
    return SlurmState.COMPLETED
