"""The agent's reports to the scheduler (services.node.schedlink): running once, the runtime's files
before the exit, the exit's state and code, the watchdog, retries only while the scheduler is away."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from fireflyer.core.errors import NotFound, Unavailable
from fireflyer.mgmt.lease import NotPrimary
from fireflyer.node import runtime as rt
from fireflyer.node.model import RankRecord, RankSpec, TaskRecord, TaskSpec, TaskState
from fireflyer.node.model import RankState as NodeRankState
from services.node.schedlink import TIMEOUT, SchedLink, exit_report


class Facts:
    name, group, zone, cpus, gpus = "node1", "default", "A", 4, 0


class Manager:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.facts = Facts()
        self.state = type("S", (), {"tasks": {}})()
        self.stopped: list[str] = []

    def task_dir(self, task_id: str) -> Path:
        d = self.root / task_id
        d.mkdir(exist_ok=True)
        return d

    def stop(self, task_id: str, grace_s: float | None = None) -> None:
        self.stopped.append(task_id)
        self.state.tasks[task_id].stop_requested = True


class Client:
    def __init__(self) -> None:
        self.reports: list[Any] = []
        self.fail: BaseException | None = None

    async def report(self, req: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.reports.append(req)

    async def register_node(self, req: Any) -> Any:
        self.reports.append(req)
        return type("R", (), {"heartbeat_interval_s": 0.5})()


class Log:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def _task(task_id: str, root: Path, *, node_rank: int = 1, env: dict[str, str] | None = None) -> TaskRecord:
    log = root / f"{task_id}.log"
    log.write_text("")
    spec = TaskSpec(task_id=task_id, command=("x",), ranks=(RankSpec(rank=node_rank, local_rank=0),),
                    node_rank=node_rank, nnodes=2, env=env or {})
    return TaskRecord(spec=spec, ranks=[RankRecord(rank=node_rank, local_rank=0, pid=1, pgid=1, start_ticks=None,
                                                   log=str(log))], started_at=time.time())


def _link(tmp_path: Path) -> tuple[SchedLink, Manager, Client]:
    m, c = Manager(tmp_path), Client()
    return SchedLink(m, c, agent_address=lambda: "127.0.0.1:5000", log=Log()), m, c  # type: ignore[arg-type]


def test_running_then_runtime_then_exit(tmp_path: Path) -> None:
    link, m, c = _link(tmp_path)
    rec = m.state.tasks["12"] = _task("12", tmp_path)
    m.state.tasks["adhoc"] = _task("adhoc", tmp_path)  # not the scheduler's: never reported
    asyncio.run(link.report_once())
    assert [(r.task_id, r.rank, r.node, r.state, r.whole_life_state) for r in c.reports] == [(12, 1, "node1", "running", -1)]
    asyncio.run(link.report_once())
    assert len(c.reports) == 1, "running is reported once"
    d = m.task_dir("12")
    rt.write_ack(d, rt.CAN_SUSPEND)
    rt.write_whole_life_state(d, 4)
    rec.state = TaskState.STOPPED
    rec.stop_requested = True
    rec.ranks[0].state, rec.ranks[0].exit_code = NodeRankState.EXITED, -15
    asyncio.run(link.report_once())
    runtime, exit_ = c.reports[1:]
    assert (runtime.suspend_code, runtime.whole_life_state, runtime.state) == (3, 4, "")
    assert (exit_.state, exit_.exit_code, exit_.whole_life_state) == ("stopped", -15, -1), "the exit leaves the state"
    asyncio.run(link.report_once())
    assert len(c.reports) == 3, "an exit is reported once"


def test_exit_states() -> None:
    def rec(codes: list[int | None], stopped: bool = False) -> TaskRecord:
        r = _task("1", Path("/tmp"))
        r.ranks = [RankRecord(rank=0, local_rank=i, pid=1, pgid=1, start_ticks=None, log="", exit_code=c)
                   for i, c in enumerate(codes)]
        r.stop_requested = stopped
        return r
    assert exit_report(rec([0, 0])) == ("succeeded", 0)
    assert exit_report(rec([0, 3])) == ("failed", 3)
    assert exit_report(rec([-15], stopped=True)) == ("stopped", -15)
    assert exit_report(rec([None])) == ("failed", -1), "an adopted rank's unknown exit"


def test_unavailable_is_retried_a_refusal_is_not(tmp_path: Path) -> None:
    link, m, c = _link(tmp_path)
    m.state.tasks["5"] = _task("5", tmp_path)
    for away in (Unavailable("no scheduler"), NotPrimary("a takeover", primary_address="")):
        c.fail = away
        asyncio.run(link.report_once())
    c.fail = None
    asyncio.run(link.report_once())
    assert [r.state for r in c.reports] == ["running"], "sent again once the scheduler answers"
    m.state.tasks["6"] = _task("6", tmp_path)
    c.fail = NotFound("no run 6")
    asyncio.run(link.report_once())
    c.fail = None
    asyncio.run(link.report_once())
    assert [r.task_id for r in c.reports] == [5], "a run the scheduler does not know is not reported again"


def test_watchdog_stops_a_silent_task_as_timeout(tmp_path: Path) -> None:
    link, m, c = _link(tmp_path)
    rec = m.state.tasks["8"] = _task("8", tmp_path, env={"FF_WATCHDOG_S": "1800"})
    asyncio.run(link.report_once())
    assert m.stopped == []
    old = time.time() - 100
    os.utime(rec.ranks[0].log, (old, old))
    rec.started_at = old
    asyncio.run(link.report_once())
    assert m.stopped == [], "100 s of silence is within 1800 s"
    rt.write_watchdog(m.task_dir("8"), 30.0)  # the runtime's set_watchdog_time(30)
    asyncio.run(link.report_once())
    assert m.stopped == ["8"] and c.reports[-1].stop_code == TIMEOUT
    asyncio.run(link.report_once())
    assert m.stopped == ["8"], "stopped once"


def test_registration_names_the_agent_address(tmp_path: Path) -> None:
    link, m, c = _link(tmp_path)
    assert asyncio.run(link.register_once()) == 0.5
    req = c.reports[0]
    assert (req.name, req.zone, req.address, req.cpus) == ("node1", "A", "127.0.0.1:5000", 4)


def test_a_scheduler_still_starting_is_info_then_a_warning(tmp_path: Path) -> None:
    """Agents and scheduler start together: an unreachable scheduler before the first registration
    is an info line inside the startup grace, a warning after it, and always after a registration."""
    lines: list[tuple[str, str]] = []

    class Rec:
        def __getattr__(self, level: str) -> Any:
            return lambda event, **k: lines.append((level, event))

    class Flaky(Client):
        down = True

        async def register_node(self, req: Any) -> Any:
            if self.down:
                raise Unavailable("no scheduler replica answered")
            return await super().register_node(req)

    m, c = Manager(tmp_path), Flaky()
    link = SchedLink(m, c, agent_address=lambda: "x:1", log=Rec(), interval_s=0.01,  # type: ignore[arg-type]
                     startup_grace_s=0.2)

    async def run_for(s: float) -> None:
        task = asyncio.ensure_future(link.register_loop())
        await asyncio.sleep(s)
        task.cancel()

    asyncio.run(run_for(0.1))
    assert lines == [("info", "node.register_waiting")], "said once, as info, while starting"
    asyncio.run(run_for(0.2))
    assert lines[1:] == [("warning", "node.register_failed")], "a warning once the grace is over"
    lines.clear()
    link._started = time.monotonic()  # a fresh start that registers, then loses the scheduler
    c.down = False
    asyncio.run(run_for(0.05))
    c.down = True
    asyncio.run(run_for(0.05))
    assert ("info", "node.registered") in lines and lines[-1] == ("warning", "node.register_failed")
