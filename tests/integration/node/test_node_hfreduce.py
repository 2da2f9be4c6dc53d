"""Two node agents host a real HFReduce worker each and run one rank each: the ranks allreduce
through the workers the agents started (what ``ff launch`` does by itself today)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import Tokens, astart, make_agent

from fireflyer.api.node.v1 import node_pb2 as pb
from fireflyer.api.node.v1 import node_pb2_grpc as pb_grpc
from fireflyer.cluster.procs import free_ports
from fireflyer.rpc import connect
from fireflyer.testing.poll import wait_for

REAL_WORKER = f"{sys.executable} -m fireflyer.hfreduce.worker"


@pytest.mark.slow  # two real workers and ranks: numba compiles on a cold cache (~30 s on 2 cores)
async def test_two_agents_run_an_allreduce_through_their_workers(tmp_path: Path, nats_mod,  # type: ignore[no-untyped-def]
                                                                 tokens: Tokens) -> None:
    agents = [make_agent(tmp_path, nats_mod, tokens, instance=f"node-{i}", FF_AGENT_WORKER_COMMAND=REAL_WORKER)
              for i in range(2)]
    try:
        for a in agents:
            await astart(a)
        peers = [f"127.0.0.{i + 1}:{free_ports(1, f'127.0.0.{i + 1}')[0]}" for i in range(2)]
        for i, a in enumerate(agents):
            async with connect(a.address, token=tokens.service) as ch:
                await pb_grpc.NodeAgentStub(ch).StartTask(pb.StartTaskRequest(
                    task_id="ar", command=[sys.executable, "-m", "fireflyer.cli.demo_rank"], nnodes=2, node_rank=i,
                    world_size=2, grace_s=2.0, ranks=[pb.Rank(rank=i, local_rank=0)],
                    hfreduce=pb.HFReduceSpec(peers=peers, timeout_s=60)))
        for a in agents:
            async with connect(a.address, token=tokens.service) as ch:
                stub = pb_grpc.NodeAgentStub(ch)

                async def done(stub: pb_grpc.NodeAgentStub = stub) -> pb.TaskInfo | None:
                    t = (await stub.TaskStatus(pb.TaskStatusRequest(task_id="ar"))).task
                    return t if t.state not in ("running", "stopping") else None

                info = await wait_for(done, timeout_s=90, interval_s=0.1, what="allreduce task ended")
                tail = stub.TailLog(pb.TailLogRequest(task_id="ar", rank=info.ranks[0].rank))
                out = b"".join([c.data async for c in tail])
                assert info.state == "succeeded", out.decode()
                assert b"allreduce ok" in out
    finally:
        for a in agents:
            a.stop()
