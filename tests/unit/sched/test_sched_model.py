"""HAI's task model: priorities, stop codes, Slurm names, spec validation, the restart rule."""

from __future__ import annotations

import msgspec
import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.sched.model import (
    FINISHED,
    LEVELS,
    RUNNING,
    SUSPENDED,
    WAITING_INIT,
    Priority,
    RankState,
    RankStatus,
    SlurmState,
    StopCode,
    SuspendCode,
    Task,
    TaskSpec,
    check_spec,
    parse_priority,
    should_requeue,
    slurm_state,
)


def spec(**kw: object) -> TaskSpec:
    base: dict[str, object] = {"user": "alice", "nodes": 2, "command": ("python", "train.py")}
    base.update(kw)
    return TaskSpec(**base)  # type: ignore[arg-type]


def test_priority_values_are_hais() -> None:
    assert [int(p) for p in LEVELS] == [50, 40, 30, 20, 10, 8, 5, 0]
    assert Priority.AUTO == -1 and Priority.AUTO not in LEVELS


@pytest.mark.parametrize(("text", "want"), [("HIGH", Priority.HIGH), ("very_high", Priority.VERY_HIGH),
                                           (30, Priority.HIGH), ("-1", Priority.AUTO), ("auto", Priority.AUTO)])
def test_parse_priority(text: str | int, want: Priority) -> None:
    assert parse_priority(text) is want


@pytest.mark.parametrize("bad", ["URGENT", 11, "", True])
def test_parse_priority_refuses_unknown(bad: object) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_priority(bad)  # type: ignore[arg-type]
    assert e.value.fields["field"] == "priority"


def test_stop_code_bits_are_hais_and_distinct() -> None:
    assert (StopCode.STOP, StopCode.INTERRUPT, StopCode.UNSCHEDULABLE, StopCode.FAILED) == (1, 16, 32, 128)
    assert (StopCode.INIT_FAILED, StopCode.TIMEOUT, StopCode.MANUAL_STOP, StopCode.HOOK_RESTART) == (
        256, 512, 1024, 2048)
    bits = [int(c) for c in StopCode if c]
    assert all(b & (b - 1) == 0 for b in bits) and len(set(bits)) == len(bits)
    assert StopCode.INTERRUPT | StopCode.STOP == 17


def test_task_round_trips_through_msgpack() -> None:
    t = Task(id=7, chain_id=3, submitted_at=1.5, spec=spec(priority=Priority.HIGH), restart_count=1,
             whole_life_state=42, chain_status=RUNNING, priority=Priority.HIGH, nodes=("n1", "n2"),
             stop_code=StopCode.INTERRUPT, suspend_code=SuspendCode.RECEIVED,
             ranks=(RankStatus(rank=0, node="n1", state=RankState.RUNNING),))
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(t), type=Task)
    assert back == t and back.releasing and back.ranks[0].state is RankState.RUNNING


@pytest.mark.parametrize(("status", "stop", "suspend", "want"), [
    (WAITING_INIT, 0, 0, SlurmState.PENDING),
    (SUSPENDED, StopCode.INTERRUPT, 0, SlurmState.REQUEUED),
    (RUNNING, 0, 0, SlurmState.RUNNING),
    (RUNNING, 0, SuspendCode.SENT, SlurmState.PREEMPTED),
    (FINISHED, StopCode.STOP, 0, SlurmState.COMPLETED),
    (FINISHED, StopCode.STOP | StopCode.MANUAL_STOP, 0, SlurmState.CANCELLED),
    (FINISHED, StopCode.STOP | StopCode.FAILED, 0, SlurmState.FAILED),
    (FINISHED, StopCode.TIMEOUT, 0, SlurmState.FAILED),
    (FINISHED, StopCode.INTERRUPT, SuspendCode.CAN_SUSPEND, SlurmState.PREEMPTED),
    (FINISHED, StopCode.STOP | StopCode.HOOK_RESTART, 0, SlurmState.REQUEUED),  # its node drained for a fault
])
def test_slurm_state(status: str, stop: int, suspend: int, want: SlurmState) -> None:
    t = Task(id=1, chain_id=1, submitted_at=0, spec=spec(), chain_status=status, stop_code=StopCode(stop),
             suspend_code=SuspendCode(suspend))
    assert slurm_state(t) is want


@pytest.mark.parametrize(("code", "kw", "failures", "want"), [
    (StopCode.INTERRUPT, {}, 0, True),
    (StopCode.UNSCHEDULABLE, {}, 0, True),
    (StopCode.HOOK_RESTART, {}, 0, True),
    (StopCode.NODE_LOST, {}, 0, True),
    (StopCode.FAILED, {}, 0, False),
    (StopCode.FAILED, {"max_restarts": 2}, 1, True),
    (StopCode.FAILED, {"max_restarts": 2}, 2, False),
    (StopCode.TIMEOUT, {}, 0, False),
    (StopCode.INTERRUPT | StopCode.MANUAL_STOP, {}, 0, False),
    (StopCode.INTERRUPT, {"task_type": "validation"}, 0, False),
    (StopCode.STOP, {}, 0, False),
])
def test_should_requeue(code: StopCode, kw: dict[str, object], failures: int, want: bool) -> None:
    assert should_requeue(code, spec(**kw), failures) is want


def test_check_spec_accepts_a_good_spec() -> None:
    check_spec(spec(grace_ack_s=10, grace_final_s=60, signal="SIGUSR1", zone="A"), groups={"default": 4},
               zones=["A", "B"])


@pytest.mark.parametrize(("kw", "field"), [
    ({"nodes": 0}, "nodes"),
    ({"nodes": 5}, "nodes"),  # more than the group has
    ({"priority": 11}, "priority"),
    ({"group": "gpu-x"}, "group"),
    ({"command": ()}, "command"),
    ({"command": ("  ",)}, "command"),
    ({"grace_ack_s": -1}, "grace_ack_s"),
    ({"grace_final_s": 7200}, "grace_final_s"),
    ({"signal": "SIGKILL"}, "signal"),
    ({"max_restarts": -1}, "max_restarts"),
    ({"zone": "C"}, "zone"),
    ({"user": ""}, "user"),
    ({"min_runtime_s": -5}, "min_runtime_s"),
    ({"task_type": "batch"}, "task_type"),
])
def test_check_spec_names_the_bad_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        check_spec(spec(**kw), groups={"default": 4}, zones=["A", "B"])
    assert e.value.fields["field"] == field and field in str(e.value)
