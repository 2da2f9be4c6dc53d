"""The node agent's decisions: restart backoff, stop escalation, rediscovery, the worker command."""

from __future__ import annotations

import signal

import pytest

from fireflyer.cluster.decisions import ProcInfo
from fireflyer.node.model import (
    HFReduceSpec,
    RankRecord,
    RankSpec,
    RankState,
    TaskSpec,
    TaskState,
    task_state_of,
)
from fireflyer.node.policy import (
    RestartPolicy,
    classify_rank,
    due_signals,
    next_attempt,
    restart_delay,
    stop_plan,
    worker_argv,
)

P = RestartPolicy(base_s=0.5, max_s=4.0, stable_s=30.0)


def test_restart_backoff_doubles_up_to_the_cap() -> None:
    assert [restart_delay(a, P) for a in range(0, 7)] == [0.0, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_worker_that_ran_long_enough_starts_the_backoff_over() -> None:
    assert next_attempt(0, 0.1, P) == 1
    assert next_attempt(3, 0.1, P) == 4
    assert next_attempt(5, 30.0, P) == 1


def test_stop_plan_term_then_kill_after_grace() -> None:
    plan = stop_plan(2.0)
    assert due_signals(plan, 0.0, 0) == ([signal.SIGTERM], 1)
    assert due_signals(plan, 1.9, 1) == ([], 1)
    assert due_signals(plan, 2.0, 1) == ([signal.SIGKILL], 2)
    assert due_signals(plan, 9.0, 2) == ([], 2)
    # a late first look sends both at once, in order
    assert due_signals(plan, 5.0, 0) == ([signal.SIGTERM, signal.SIGKILL], 2)
    assert due_signals(stop_plan(0.0), 0.0, 0) == ([signal.SIGKILL], 1)


def rec(state: RankState = RankState.RUNNING, ticks: int | None = 100, code: int | None = None) -> RankRecord:
    return RankRecord(rank=0, local_rank=0, pid=42, pgid=42, start_ticks=ticks, log="x", state=state, exit_code=code)


@pytest.mark.parametrize(("record", "seen", "want"), [
    (rec(), ProcInfo(42, 100), RankState.RUNNING),
    (rec(), ProcInfo(42, 101), RankState.LOST),          # pid recycled by another process
    (rec(), None, RankState.LOST),                       # gone while no agent watched
    (rec(), ProcInfo(42, 100, zombie=True), RankState.LOST),
    (rec(ticks=None), ProcInfo(42, None), RankState.RUNNING),  # no /proc: the pid is all there is
    (rec(RankState.EXITED, code=0), None, RankState.EXITED),
])
def test_rediscovery(record: RankRecord, seen: ProcInfo | None, want: RankState) -> None:
    assert classify_rank(record, seen) is want


def test_task_state_from_ranks() -> None:
    ok, bad = rec(RankState.EXITED, code=0), rec(RankState.EXITED, code=3)
    assert task_state_of([ok, rec()], stop_requested=False) is TaskState.RUNNING
    assert task_state_of([ok, rec()], stop_requested=True) is TaskState.STOPPING
    assert task_state_of([ok, ok], stop_requested=False) is TaskState.SUCCEEDED
    assert task_state_of([ok, bad], stop_requested=False) is TaskState.FAILED
    assert task_state_of([ok, bad], stop_requested=True) is TaskState.STOPPED
    assert task_state_of([ok, rec(RankState.LOST)], stop_requested=False) is TaskState.LOST


def spec(**kw: object) -> TaskSpec:
    base: dict[str, object] = dict(task_id="t1", command=("python", "train.py"), nnodes=2, node_rank=1,
                                   ranks=(RankSpec(rank=2, local_rank=0), RankSpec(rank=3, local_rank=1)))
    base.update(kw)
    return TaskSpec(**base)  # type: ignore[arg-type]


def test_worker_argv_with_peers_and_with_coord() -> None:
    s = spec()
    argv = worker_argv(s, HFReduceSpec(peers=("127.0.0.1:5", "127.0.0.2:6"), chunk_size="1M"), socket="/s",
                       node_name="node1", node_address="127.0.0.2", zone="A", prefix=["w"])
    assert argv == ["w", "--nnodes", "2", "--local-world-size", "2", "--socket", "/s", "--job-id", "t1",
                    "--node-rank", "1", "--peers", "127.0.0.1:5,127.0.0.2:6", "--chunk-size", "1M"]
    argv = worker_argv(spec(restart_count=2, job_id="j"), HFReduceSpec(coord_addr="c:1", timeout_s=5), socket="/s",
                       node_name="node1", node_address="127.0.0.2", zone="B", token="tok", prefix=["w"])
    assert argv == ["w", "--nnodes", "2", "--local-world-size", "2", "--socket", "/s", "--job-id", "j",
                    "--coord", "c:1", "--node-name", "node1", "--listen", "127.0.0.2:0", "--restart-count", "2",
                    "--zone", "B", "--timeout-s", "5", "--token", "tok"]
