"""A run's life after the decision (fireflyer.sched.lifecycle): start, the interrupt handshake and
its grace times, reports, the end and the chain's next run; and the spec file reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.sched import lifecycle
from fireflyer.sched.model import (
    FINISHED,
    RUNNING,
    SUSPENDED,
    Priority,
    RankState,
    SchedConfig,
    StopCode,
    SuspendCode,
    Task,
    TaskSpec,
)
from fireflyer.sched.policy import Start
from fireflyer.sched.records import RunRecord
from fireflyer.sched.specfile import read_spec_file, spec_fields

CFG = SchedConfig(grace_ack_s=5.0, grace_final_s=10.0)


def _running(nodes: int = 2, **spec: object) -> RunRecord:
    s = TaskSpec(user="alice", nodes=nodes, command=("x",), **spec)  # type: ignore[arg-type]
    rec = RunRecord(task=Task(id=1, chain_id=1, spec=s, submitted_at=0.0))
    names = tuple(f"n{i}" for i in range(nodes))
    return lifecycle.start(rec, Start(task=1, nodes=names, priority=Priority.NORMAL, zones=("A",)), now=100.0)


def test_start_puts_ranks_on_nodes() -> None:
    rec = _running()
    t = rec.task
    assert t.chain_status == RUNNING and t.started_at == 100.0 and t.priority == Priority.NORMAL
    assert [(r.rank, r.node, r.state) for r in t.ranks] == [(0, "n0", RankState.CREATED), (1, "n1", RankState.CREATED)]


def test_unacknowledged_interrupt_is_stopped_after_the_ack_grace() -> None:
    rec = lifecycle.interrupt(_running(), 200.0, "for run 2")
    assert rec.task.suspend_code == SuspendCode.SENT and rec.task.stop_code & StopCode.INTERRUPT
    assert lifecycle.stop_due(rec, 204.9, CFG) is None
    assert lifecycle.stop_due(rec, 205.0, CFG) == 10.0  # then SIGTERM -> SIGKILL after the final grace
    # a second interrupt of a releasing run changes nothing
    assert lifecycle.interrupt(rec, 201.0, "again").suspend_sent_at == 200.0


def test_acknowledged_interrupt_gets_the_final_grace_and_go_suspend_stops_at_once() -> None:
    rec = lifecycle.interrupt(_running(), 200.0, "x")
    rec = lifecycle.report(rec, 0, None, None, SuspendCode.RECEIVED, None, 203.0)
    assert rec.ack_at == 203.0 and lifecycle.stop_due(rec, 212.9, CFG) is None
    assert lifecycle.stop_due(rec, 213.0, CFG) == 10.0
    gone = lifecycle.report(rec, 0, None, None, SuspendCode.CAN_SUSPEND, 9, 204.0)
    assert lifecycle.stop_due(gone, 204.0, CFG) == 0.0 and gone.task.whole_life_state == 9
    # per-task grace overrides the cluster's
    own = lifecycle.interrupt(_running(grace_ack_s=1.0), 200.0, "x")
    assert lifecycle.stop_due(own, 201.0, CFG) == 10.0


def test_a_failed_rank_fails_the_run_and_the_chain_requeues_per_max_restarts() -> None:
    rec = _running(max_restarts=1)
    rec = lifecycle.report(rec, 0, RankState.RUNNING, None, None, None, 101.0)
    rec = lifecycle.report(rec, 1, RankState.FAILED, 2, None, None, 102.0)
    assert rec.task.stop_code == StopCode.FAILED and lifecycle.stop_due(rec, 102.0, CFG) == 10.0
    assert not lifecycle.all_ended(rec)
    rec = lifecycle.report(rec, 0, RankState.STOPPED, -15, None, None, 103.0)
    # a late "running" does not revive an ended rank
    assert lifecycle.report(rec, 0, RankState.RUNNING, None, None, None, 104.0).task.ranks[0].state == RankState.STOPPED
    done, nxt = lifecycle.finish(rec, 105.0, next_id=7)
    assert done.task.chain_status == FINISHED and done.finished_at == 105.0
    assert nxt is not None and nxt.task.id == 7 and nxt.task.chain_id == 1 and nxt.task.restart_count == 1
    assert nxt.task.chain_status == SUSPENDED and nxt.failures == 1 and nxt.task.submitted_at == 0.0
    # the second failure: max_restarts spent
    again = lifecycle.start(nxt, Start(task=7, nodes=("n0",), priority=Priority.NORMAL, zones=("A",)), 110.0)
    again = lifecycle.report(again, 0, RankState.FAILED, 1, None, None, 111.0)
    assert lifecycle.finish(again, 112.0, next_id=8)[1] is None


def test_user_stop_of_a_waiting_run_ends_it_at_once_and_never_requeues() -> None:
    s = TaskSpec(user="alice", command=("x",))
    waiting = RunRecord(task=Task(id=1, chain_id=1, spec=s, submitted_at=0.0))
    stopped = lifecycle.request_stop(waiting, StopCode.MANUAL_STOP, 5.0, "stopped by alice")
    assert stopped.task.chain_status == FINISHED and stopped.finished_at == 5.0
    running = lifecycle.request_stop(_running(nodes=1), StopCode.MANUAL_STOP, 5.0, "x")
    running = lifecycle.report(running, 0, RankState.STOPPED, -15, None, None, 6.0)
    assert lifecycle.finish(running, 6.0, 2)[1] is None


def test_interrupted_run_requeues_held_when_the_user_suspended_it() -> None:
    rec = lifecycle.interrupt(_running(nodes=1), 200.0, "suspended by alice", hold=True)
    rec = lifecycle.report(rec, 0, RankState.STOPPED, -15, None, None, 201.0)
    _, nxt = lifecycle.finish(rec, 201.0, 2)
    assert nxt is not None and nxt.held and nxt.reason_code == "held"
    assert lifecycle.stop_reasons(int(StopCode.INTERRUPT | StopCode.MANUAL_STOP)) == ["INTERRUPT", "MANUAL_STOP"]


def test_spec_file_in_toml_and_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    toml = tmp_path / "exp.toml"
    toml.write_text('name = "n"\npriority = "HIGH"\n[spec]\nentrypoint = "run.sh"\nparameters = ["-x", "1"]\n'
                    '[resource]\ngroup = "g"\nnode_count = 3\n[options]\nwatchdog_time = 60\nmax_restarts = 2\n')
    assert read_spec_file(toml) == {"name": "n", "priority": "HIGH", "command": ["bash", "run.sh", "-x", "1"],
                                    "group": "g", "nodes": 3, "watchdog_s": 60, "max_restarts": 2}
    js = tmp_path / "exp.json"
    js.write_text(json.dumps({"spec": {"entrypoint": "./a.out", "parameters": "--n 2"}}))
    assert read_spec_file(js) == {"command": ["./a.out", "--n", "2"]}
    assert spec_fields({"spec": {"entrypoint": "t.py", "entrypoint_executable": True}}) == {"command": ["t.py"]}
    for data, field in (({"resource": {"image": "x"}}, "resource.image"), ({"workspace": "/w"}, "workspace")):
        with pytest.raises(InvalidArgument, match=field.replace(".", r"\.")):
            spec_fields(data)
    (tmp_path / "bad.toml").write_text("name = ")
    with pytest.raises(InvalidArgument, match="not valid TOML"):
        read_spec_file(tmp_path / "bad.toml")
    with pytest.raises(InvalidArgument, match="cannot read"):
        read_spec_file(tmp_path / "missing.toml")


def test_a_yaml_spec_file_reads_hais_v2_layout(tmp_path: Path) -> None:
    yml = tmp_path / "exp.yml"
    yml.write_text("name: llama\npriority: 40\nspec:\n  entrypoint: train.py\n  parameters: --lr 3e-4 --bs 8\n"
                   "resource:\n  group: g\n  node_count: 2\n  zone: A\noptions:\n  whole_life_state: 3\n"
                   "  watchdog_time: 1800\n  grace_ack_s: 5.0\n")
    assert read_spec_file(yml) == {"name": "llama", "priority": "40", "group": "g", "nodes": 2, "zone": "A",
                                   "command": ["python", "train.py", "--lr", "3e-4", "--bs", "8"],
                                   "whole_life_state": 3, "watchdog_s": 1800, "grace_ack_s": 5.0}
    # an empty section is no section; a list of parameters stays a list
    (tmp_path / "e.yaml").write_text("spec:\n  entrypoint: ./a.out\n  parameters: [-x, 'two words']\noptions:\n")
    assert read_spec_file(tmp_path / "e.yaml") == {"command": ["./a.out", "-x", "two words"]}
    # HAI fields we do not run are refused by name, as from TOML
    (tmp_path / "img.yaml").write_text("resource:\n  image: default\n  node_count: 1\n")
    with pytest.raises(InvalidArgument, match=r"resource\.image is not supported"):
        read_spec_file(tmp_path / "img.yaml")


def test_a_bad_yaml_spec_file_is_refused_with_its_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nspec:\n  entrypoint: a.py\n  parameters: [1, 2\nresource:\n  node_count: 1\n")
    with pytest.raises(InvalidArgument) as e:
        read_spec_file(bad)
    assert f"{bad}:5:" in str(e.value) and "not valid YAML" in str(e.value), e.value
    # safe_load: a tag that would build a Python object is an error, not an object
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(InvalidArgument, match=rf"{evil}:1:.*not valid YAML"):
        read_spec_file(evil)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(InvalidArgument, match="must hold a mapping"):
        read_spec_file(tmp_path / "list.yaml")


def test_unschedulable_runs_back_off() -> None:
    rec = _running(nodes=1)
    delays = []
    for i in range(8):
        rec = lifecycle.request_stop(rec, StopCode.UNSCHEDULABLE, 100.0, "agent down")
        rec = lifecycle.report(rec, 0, RankState.STOPPED, -1, None, None, 100.0)
        _, nxt = lifecycle.finish(rec, 100.0, next_id=i + 2)
        assert nxt is not None and nxt.not_before is not None
        delays.append(nxt.not_before - 100.0)
        rec = lifecycle.start(nxt, Start(task=i + 2, nodes=("n0",), priority=Priority.NORMAL, zones=("A",)), 100.0)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    # a run that ended otherwise resets the count
    rec = lifecycle.interrupt(rec, 100.0, "x")
    rec = lifecycle.report(rec, 0, RankState.STOPPED, -15, None, None, 100.0)
    _, nxt = lifecycle.finish(rec, 100.0, next_id=20)
    assert nxt is not None and nxt.not_before is None and nxt.unschedulable == 0
