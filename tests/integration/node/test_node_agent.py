"""The node agent as a real process: ranks, their environment, logs, suspend, stop, exits, auth,
the HFReduce worker, heartbeats, and adoption of running ranks after an agent crash."""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from pathlib import Path

import pytest
from conftest import PROG, Tokens, astart, make_agent

from fireflyer.api.node.v1 import node_pb2 as pb
from fireflyer.api.node.v1 import node_pb2_grpc as pb_grpc
from fireflyer.bus import Bus
from fireflyer.cluster.procs import observe
from fireflyer.core.errors import FireFlyerError
from fireflyer.node.events import NodeHeartbeat, TaskExited, heartbeat_subject, task_exit_subject
from fireflyer.rpc import connect
from fireflyer.testing.nats import fast_nats_settings
from fireflyer.testing.poll import wait_for
from fireflyer.testing.services import ServiceProcess


def tid() -> str:
    return "t" + uuid.uuid4().hex[:10]


def start_req(task: str, mode: list[str], *, ranks: int = 2, user: str = "alice", grace_s: float = 5.0,
              **kw: object) -> pb.StartTaskRequest:
    fields: dict[str, object] = dict(
        task_id=task, command=[sys.executable, PROG, *mode], user=user, grace_s=grace_s, nnodes=2, node_rank=1,
        world_size=4, restart_count=3, master_addr="127.0.0.1", master_port=29555, env={"TASK_VAR": "t"},
        ranks=[pb.Rank(rank=2 + i, local_rank=i, env={"RANK_VAR": f"r{i}"}) for i in range(ranks)])
    fields.update(kw)
    return pb.StartTaskRequest(**fields)  # type: ignore[arg-type]


async def status(stub: pb_grpc.NodeAgentStub, task: str) -> pb.TaskInfo:
    return (await stub.TaskStatus(pb.TaskStatusRequest(task_id=task))).task


async def ended(stub: pb_grpc.NodeAgentStub, task: str, timeout_s: float = 15.0) -> pb.TaskInfo:
    async def done() -> pb.TaskInfo | None:
        t = await status(stub, task)
        return t if t.state not in ("running", "stopping") else None

    return await wait_for(done, timeout_s=timeout_s, interval_s=0.05, what=f"task {task} ended")


async def log_text(stub: pb_grpc.NodeAgentStub, task: str, rank: int) -> str:
    out = b""
    async for c in stub.TailLog(pb.TailLogRequest(task_id=task, rank=rank)):
        out += c.data
    return out.decode()


async def test_ranks_get_the_training_environment_and_exit_codes_are_reported(
        agent: ServiceProcess, tokens: Tokens, nats_mod) -> None:  # type: ignore[no-untyped-def]
    task = tid()
    async with await Bus.connect(fast_nats_settings(nats_mod.url), name="t") as bus:
        exits: list[TaskExited] = []
        beats: list[NodeHeartbeat] = []

        async def on_exit(ev: TaskExited, _msg: object) -> None:
            exits.append(ev)

        async def on_beat(ev: NodeHeartbeat, _msg: object) -> None:
            beats.append(ev)

        await bus.subscribe(task_exit_subject("node1"), on_exit, types=TaskExited)
        await bus.subscribe(heartbeat_subject("node1"), on_beat, types=NodeHeartbeat)
        async with connect(agent.address, token=tokens.service) as ch:
            stub = pb_grpc.NodeAgentStub(ch)
            labels = (await stub.Describe(pb.DescribeRequest())).labels
            assert (labels.name, labels.zone, labels.group, labels.address, labels.gpus) == \
                ("node1", "A", "default", "127.0.0.2", 8)
            assert labels.cpus >= 1 and labels.agent_address == agent.address
            await stub.StartTask(start_req(task, ["env"], env={"TASK_VAR": "t", "FF_TOKEN": "user-token"}))
            info = await ended(stub, task)
            assert info.state == "succeeded"
            assert [(r.rank, r.state, r.has_exit_code, r.exit_code) for r in info.ranks] == \
                [(2, "exited", True, 0), (3, "exited", True, 0)]
            for i, rank in enumerate((2, 3)):
                env = json.loads((await log_text(stub, task, rank)).strip())
                assert env == {
                    "FF_JOB_ID": task, "FF_TASK_ID": task, "FF_RANK": str(rank), "FF_WORLD_SIZE": "4",
                    "FF_LOCAL_RANK": str(i), "FF_LOCAL_WORLD_SIZE": "2", "FF_NODE_RANK": "1", "FF_NNODES": "2",
                    "FF_NODE_NAME": "node1", "FF_RESTART_COUNT": "3", "FF_SCHED_ADDR": "127.0.0.1:1",
                    "FF_SUSPEND_FILE": env["FF_SUSPEND_FILE"], "FF_HFREDUCE_SOCKET": None,
                    "SLURM_JOB_ID": task, "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_PROCID": str(rank),
                    "RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555",
                    # the task's own token, never the agent's service credential
                    "FF_TOKEN": "user-token", "TASK_VAR": "t", "RANK_VAR": f"r{i}"}
                assert env["FF_SUSPEND_FILE"].endswith(f"/node/node1/tasks/{task}/suspend")

            failing = tid()
            await stub.StartTask(start_req(failing, ["exit", "7"], ranks=1))
            info = await ended(stub, failing)
            assert info.state == "failed" and info.ranks[0].exit_code == 7
        await wait_for(lambda: {e.task_id for e in exits} >= {task, failing}, timeout_s=10, what="task_exit events")
        by = {e.task_id: e for e in exits}
        assert by[task].state == "succeeded" and by[task].exit_codes == {"2": 0, "3": 0}
        assert by[failing].state == "failed" and by[failing].exit_codes == {"2": 7}
        await wait_for(lambda: beats, timeout_s=5, what="a heartbeat")
        assert beats[-1].zone == "A" and beats[-1].address == "127.0.0.2" and beats[-1].gpus == 8


async def test_log_follow_streams_new_lines_until_the_rank_ends(agent: ServiceProcess, tokens: Tokens,
                                                                tmp_path: Path) -> None:
    task, go = tid(), tmp_path / "go"
    async with connect(agent.address, token=tokens.service) as ch:
        stub = pb_grpc.NodeAgentStub(ch)
        await stub.StartTask(start_req(task, ["wait", str(go)], ranks=1))
    # the task's user follows its log
    async with connect(agent.address, token=tokens.alice) as ch:
        stub = pb_grpc.NodeAgentStub(ch)
        got, eof = b"", False
        async for chunk in stub.TailLog(pb.TailLogRequest(task_id=task, rank=2, follow=True)):
            got += chunk.data
            if got == b"start\n" and not go.exists():
                go.touch()  # the rank prints its second line only now: follow must deliver it
            if chunk.eof:
                eof = True
        assert got == b"start\nmore\n" and eof
        tail = [c async for c in stub.TailLog(pb.TailLogRequest(task_id=task, rank=2, offset=6))]
        assert b"".join(c.data for c in tail) == b"more\n" and tail[0].offset == 6
    # another user may neither read it nor see it
    async with connect(agent.address, token=tokens.bob) as ch:
        stub = pb_grpc.NodeAgentStub(ch)
        with pytest.raises(FireFlyerError) as e:
            await log_text(stub, task, 2)
        assert e.value.code == "PERMISSION_DENIED"
        with pytest.raises(FireFlyerError) as e:
            await status(stub, task)
        assert e.value.code == "PERMISSION_DENIED"
        assert task not in [t.task_id for t in (await stub.ListTasks(pb.ListTasksRequest())).tasks]


async def test_suspend_flag_reaches_every_rank(agent: ServiceProcess, tokens: Tokens) -> None:
    task = tid()
    async with connect(agent.address, token=tokens.service) as ch:
        stub = pb_grpc.NodeAgentStub(ch)
        await stub.StartTask(start_req(task, ["suspend"]))
        for r in (2, 3):
            await wait_for(lambda r=r: _read(stub, task, r, "ready"), timeout_s=10, what=f"rank {r} ready")
        reply = await stub.Suspend(pb.SuspendRequest(task_id=task, reason="preempted by t9"))
        assert reply.task.suspend_requested
        info = await ended(stub, task)
        assert info.state == "succeeded"
        for r in (2, 3):
            assert "suspend seen: preempted by t9" in await log_text(stub, task, r)
        # with a signal (Slurm's --signal), every rank's process group gets it as well
        sig = tid()
        await stub.StartTask(start_req(sig, ["usr1"]))
        for r in (2, 3):
            await wait_for(lambda r=r: _read(stub, sig, r, "ready"), timeout_s=10, what=f"rank {r} ready")
        await stub.Suspend(pb.SuspendRequest(task_id=sig, signal=signal.SIGUSR1))
        assert (await ended(stub, sig)).state == "succeeded"
        for r in (2, 3):
            assert "got SIGUSR1" in await log_text(stub, sig, r)


async def _read(stub: pb_grpc.NodeAgentStub, task: str, rank: int, what: str) -> bool:
    return what in await log_text(stub, task, rank)


async def test_stop_escalates_to_sigkill_after_the_grace(agent: ServiceProcess, tokens: Tokens) -> None:
    task = tid()
    async with connect(agent.address, token=tokens.admin) as ch:
        stub = pb_grpc.NodeAgentStub(ch)
        await stub.StartTask(start_req(task, ["stubborn"], ranks=1, grace_s=0.5))
        await stub.StartTask(start_req(task + "b", ["sleep"], ranks=1, grace_s=5.0))
        await wait_for(lambda: _read(stub, task, 2, "ready"), timeout_s=10, what="stubborn rank ready")
        await wait_for(lambda: _read(stub, task + "b", 2, "ready"), timeout_s=10, what="sleeping rank ready")
        # a rank that ignores SIGTERM is killed after the grace ...
        info = (await stub.StopTask(pb.StopTaskRequest(task_id=task, wait=True))).task
        assert info.state == "stopped" and info.ranks[0].exit_code == -signal.SIGKILL
        # ... and one that honours it ends with SIGTERM
        info = (await stub.StopTask(pb.StopTaskRequest(task_id=task + "b", wait=True))).task
        assert info.state == "stopped" and info.ranks[0].exit_code == -signal.SIGTERM
        assert observe(info.ranks[0].pid) is None or observe(info.ranks[0].pid).zombie  # type: ignore[union-attr]


async def test_users_may_not_start_stop_or_suspend(agent: ServiceProcess, tokens: Tokens) -> None:
    async with connect(agent.address, token=tokens.alice) as ch:
        stub = pb_grpc.NodeAgentStub(ch)
        for call in (stub.StartTask(start_req(tid(), ["env"])), stub.StopTask(pb.StopTaskRequest(task_id="x")),
                     stub.Suspend(pb.SuspendRequest(task_id="x"))):
            with pytest.raises(FireFlyerError) as e:
                await call
            assert e.value.code == "PERMISSION_DENIED"
        assert (await stub.Describe(pb.DescribeRequest())).labels.name == "node1"
    async with connect(agent.address, token=tokens.service) as ch:
        stub = pb_grpc.NodeAgentStub(ch)
        bad = start_req(tid(), ["env"])
        del bad.command[:]
        with pytest.raises(FireFlyerError) as e:
            await stub.StartTask(bad)
        assert e.value.code == "INVALID_ARGUMENT" and "command" in str(e.value)
        with pytest.raises(FireFlyerError) as e:
            await stub.TaskStatus(pb.TaskStatusRequest(task_id="nope"))
        assert e.value.code == "NOT_FOUND"


async def test_hfreduce_worker_is_restarted_after_it_dies(agent: ServiceProcess, tokens: Tokens) -> None:
    task = tid()
    async with connect(agent.address, token=tokens.service) as ch:
        stub = pb_grpc.NodeAgentStub(ch)
        hf = pb.HFReduceSpec(peers=["127.0.0.1:1", "127.0.0.2:1"])
        await stub.StartTask(start_req(task, ["sleep"], ranks=1, hfreduce=hf))
        first = (await status(stub, task)).worker_pid
        assert first > 0
        os.kill(first, signal.SIGKILL)
        info = await wait_for(lambda: _restarted(stub, task, first), timeout_s=10, what="worker restarted")
        assert info.worker_restarts == 1 and observe(info.worker_pid) is not None
        assert "node.worker_restarted" in agent.log()
        await stub.StopTask(pb.StopTaskRequest(task_id=task, wait=True))
        # the worker goes with its task
        await wait_for(lambda: observe(info.worker_pid) is None or observe(info.worker_pid).zombie,  # type: ignore[union-attr]
                       timeout_s=5, what="worker stopped with the task")


async def _restarted(stub: pb_grpc.NodeAgentStub, task: str, old: int) -> pb.TaskInfo | None:
    t = await status(stub, task)
    return t if t.worker_pid not in (0, old) else None


async def test_agent_killed_and_restarted_adopts_its_running_ranks(tmp_path: Path, nats_mod,  # type: ignore[no-untyped-def]
                                                                    tokens: Tokens) -> None:
    svc = await astart(make_agent(tmp_path, nats_mod, tokens, instance="node-2"))
    task, short = tid(), tid()
    try:
        async with connect(svc.address, token=tokens.service) as ch:
            stub = pb_grpc.NodeAgentStub(ch)
            assert (await stub.Describe(pb.DescribeRequest())).labels.zone == "B"
            await stub.StartTask(start_req(task, ["sleep"], hfreduce=pb.HFReduceSpec(peers=["a:1", "b:1"])))
            await stub.StartTask(start_req(short, ["sleep"], ranks=1))
            await wait_for(lambda: _read(stub, task, 3, "ready"), timeout_s=10, what="ranks ready")
            pids = [r.pid for r in (await status(stub, task)).ranks]
            worker = (await status(stub, task)).worker_pid
            short_pid = (await status(stub, short)).ranks[0].pid
        svc.signal(signal.SIGKILL)
        svc.wait(10)
        os.kill(short_pid, signal.SIGKILL)  # this one dies while no agent watches
        assert all(observe(p) is not None for p in pids)
        await astart(svc)
        async with connect(svc.address, token=tokens.service) as ch:
            stub = pb_grpc.NodeAgentStub(ch)
            info = await status(stub, task)
            assert info.state == "running" and [r.pid for r in info.ranks] == pids
            assert all(r.state == "running" for r in info.ranks)
            assert info.worker_pid == worker and info.worker_restarts == 0  # its worker adopted too
            lost = await status(stub, short)
            assert lost.state == "lost" and lost.ranks[0].state == "lost"
            # the adopted ranks are still under its control: stop reaches them
            info = (await stub.StopTask(pb.StopTaskRequest(task_id=task, grace_s=2.0, wait=True))).task
            assert info.state == "stopped" and all(r.state == "exited" for r in info.ranks)
            assert all(observe(p) is None or observe(p).zombie for p in pids + [worker])  # type: ignore[union-attr]
    finally:
        svc.stop()


async def test_sigterm_to_the_agent_stops_its_tasks(tmp_path: Path, nats_mod, tokens: Tokens) -> None:  # type: ignore[no-untyped-def]
    svc = await astart(make_agent(tmp_path, nats_mod, tokens, instance="node-0"))
    task = tid()
    async with connect(svc.address, token=tokens.service) as ch:
        stub = pb_grpc.NodeAgentStub(ch)
        await stub.StartTask(start_req(task, ["stubborn"], grace_s=30.0))
        await wait_for(lambda: _read(stub, task, 3, "ready"), timeout_s=10, what="ranks ready")
        pids = [r.pid for r in (await status(stub, task)).ranks]
    assert svc.stop(timeout_s=20) == 0  # shutdown_grace_s (5 s) caps the task's 30 s grace
    assert all(observe(p) is None or observe(p).zombie for p in pids)  # type: ignore[union-attr]
