"""fireflyer.hai (and hfai.client): no-ops outside a cluster; inside one, the flag, the automatic
acknowledgement, go_suspend, the whole-life state and the watchdog go through files beside the flag."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fireflyer import hai
from fireflyer.node import runtime as rt


@pytest.fixture
def task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FF_TASK_ID", "7")
    monkeypatch.setenv("FF_SUSPEND_FILE", str(tmp_path / "suspend"))
    monkeypatch.setenv("FF_WHOLE_LIFE_STATE", "3")
    monkeypatch.setattr(hai, "_acked", False)
    monkeypatch.setattr(hai, "_local_state", {})
    return tmp_path


def test_outside_a_cluster_everything_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FF_TASK_ID", "FF_SUSPEND_FILE", "FF_HAI_SIMULATE", "FF_WHOLE_LIFE_STATE", "MARSV2_WHOLE_LIFE_STATE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hai, "_local_state", {})
    assert not hai.in_cluster()
    assert hai.receive_suspend_command() is False and hai.suspend_requested() is False
    hai.go_suspend()  # returns outside a cluster
    assert hai.get_whole_life_state() == 0
    hai.set_whole_life_state(12)
    assert hai.get_whole_life_state() == 12
    hai.set_watchdog_time(60)
    hai.set_priority("HIGH")  # no scheduler to ask: nothing happens


def test_first_sight_of_the_flag_acknowledges(task: Path) -> None:
    assert hai.receive_suspend_command() is False
    assert rt.read_ack(task) is None, "no flag, no acknowledgement"
    (task / "suspend").write_text('{"raised_at": 1.0}')
    assert hai.receive_suspend_command() is True
    assert rt.read_ack(task) == rt.RECEIVED
    assert hai.receive_suspend_command() is True  # still up; acknowledged once


def test_suspend_requested_agrees_through_a_max_allreduce(task: Path) -> None:
    class Comm:  # one rank of a world where another rank saw the flag
        def __init__(self, others: float) -> None:
            self.others, self.ops = others, []

        def allreduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
            self.ops.append(op)
            x[:] = np.maximum(x, self.others)
            return x

    assert hai.suspend_requested(Comm(1.0)) is True, "another rank's flag counts"
    comm = Comm(0.0)
    assert hai.suspend_requested(comm) is False and comm.ops == ["max"]
    assert rt.read_ack(task) is None, "only a rank that saw the flag itself acknowledges"


def test_whole_life_state_and_watchdog_are_written_for_the_agent(task: Path) -> None:
    assert hai.get_whole_life_state() == 3, "the chain's state comes in through FF_WHOLE_LIFE_STATE"
    hai.set_whole_life_state(4)
    assert rt.read_whole_life_state(task) == 4 and hai.get_whole_life_state() == 4
    for bad in (2**31, "1", True):
        with pytest.raises(ValueError):
            hai.set_whole_life_state(bad)  # type: ignore[arg-type]
    hai.set_watchdog_time(90)
    assert rt.read_watchdog(task) == 90.0 and hai.get_watchdog_time() == 90.0
    with pytest.raises(ValueError):
        hai.set_watchdog_time(0)
    with pytest.raises(ValueError):
        hai.set_priority("URGENT")


def test_acknowledgement_only_moves_forward(tmp_path: Path) -> None:
    rt.write_ack(tmp_path, rt.CAN_SUSPEND)
    rt.write_ack(tmp_path, rt.RECEIVED)
    assert rt.read_ack(tmp_path) == rt.CAN_SUSPEND
    with pytest.raises(ValueError):
        rt.write_ack(tmp_path, 1)


def test_go_suspend_marks_can_suspend_and_never_returns(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import sys
        from fireflyer import hai
        print("calling", flush=True)
        hai.go_suspend()
        print("returned", flush=True)
    """)
    env = {"FF_TASK_ID": "9", "FF_SUSPEND_FILE": str(tmp_path / "suspend"), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": ":".join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "calling"
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=1.0)
        assert rt.read_ack(tmp_path) == rt.CAN_SUSPEND
    finally:
        p.kill()
        out = p.communicate()[0]
    assert "returned" not in out


def test_hfai_client_is_the_same_api() -> None:
    import hfai
    import hfai.client

    assert hfai.client.receive_suspend_command is hai.receive_suspend_command
    assert hfai.go_suspend is hai.go_suspend and hfai.client.EXP_PRIORITY.HIGH == 30
    assert hfai.client.EXP_PRIORITY.AUTO == -1
