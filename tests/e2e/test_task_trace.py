"""One task submission is one trace (docs/tracing.md): a local cluster exports OTLP/gRPC to a receiver
in this test, a task is submitted, and the spans that arrive form one tree -- the scheduler's
``task.submit`` and ``scheduler.start_rank``, the node agent's StartTask and ``node.start_rank``, the
rank process's checkpoint phases and its RPC back to the scheduler -- with every parent link inside
the trace.  ``ff trace show`` draws the same tree from a span file.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tpb_grpc

from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.cluster.procs import free_ports
from fireflyer.sched.client import SchedClient
from fireflyer.testing.cluster import LocalCluster, started_cluster

pytestmark = pytest.mark.timeout(120)

RANK = Path(__file__).with_name("trace_rank.py")

CLUSTER_TOML = """
[cluster]
ready_timeout_s = 40.0
stop_timeout_s = 5.0

[nats]
port = 0

[[service]]
name = "scheduler"
module = "services.scheduler"
replicas = 1
env = { FF_SCHEDULER_TICK_S = "0.2", FF_GRACE_S = "1" }

[[service]]
name = "node"
module = "services.node"
replicas = 1
env = { FF_AGENT_ZONES = "A", FF_GRACE_S = "1" }
"""


class Receiver(tpb_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver: keeps every span it is sent, with its resource's service name."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def Export(self, request: tpb.ExportTraceServiceRequest, context: Any) -> tpb.ExportTraceServiceResponse:
        with self.lock:
            for rs in request.resource_spans:
                attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append({"trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                           "parent": s.parent_span_id.hex() or None, "name": s.name,
                                           "service": attrs.get("service.name", ""),
                                           "instance": attrs.get("service.instance.id", "")})
        return tpb.ExportTraceServiceResponse()

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.spans)


@pytest.fixture()
def receiver() -> Iterator[tuple[Receiver, str]]:
    port = free_ports(1)[0]
    server = grpc.server(futures.ThreadPoolExecutor(4))
    rec = Receiver()
    tpb_grpc.add_TraceServiceServicer_to_server(rec, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield rec, f"http://127.0.0.1:{port}"
    server.stop(0)


def _sched(cluster: LocalCluster, token: str, fn: Any) -> Any:
    async def go() -> Any:
        async with SchedClient(cluster.addresses("scheduler"), token=token) as c:
            return await fn(c)
    return asyncio.run(go())


def _poll(check: Any, what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what} (last: {last!r})")


def test_a_task_submission_is_one_trace_from_scheduler_to_rank(receiver: tuple[Receiver, str],
                                                                 tmp_path: Path) -> None:
    rec, endpoint = receiver
    # export every 200 ms instead of 5 s, so the test does not wait for batches
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    with started_cluster(CLUSTER_TOML, tmp_path / "state", env=env) as cluster:
        user = cluster.user_token
        _poll(lambda: _sched(cluster, user, lambda c: c.nodes()), "the node agent registered", 30)
        chain = _sched(cluster, user, lambda c: c.submit(pb.TaskSpec(
            name="traced", nodes=1, command=[sys.executable, str(RANK), str(tmp_path / "ckpt")])))
        task = int(chain.chain_id)
        _poll(lambda: _sched(cluster, user, lambda c: c.get(task)).runs[-1].slurm_state == "COMPLETED",
              "the task completes", 40)

        def submit_trace() -> list[dict[str, Any]] | None:
            spans = rec.snapshot()
            submit = [s for s in spans if s["name"] == "task.submit"]
            if not submit:
                return None
            tid = submit[0]["trace_id"]
            mine = [s for s in spans if s["trace_id"] == tid]
            names = {s["name"] for s in mine}
            want = {"task.submit", "scheduler.start_rank", "node.start_rank", "ckpt.save", "ckpt.write"}
            # the rank's call back to the scheduler: its CLIENT span and the scheduler's SERVER span
            calls = [s for s in mine if s["name"] == "ff.scheduler.v1.TaskService/Get"]
            return mine if want <= names and len(calls) >= 2 else None
        try:
            spans = _poll(submit_trace, "the task's trace with scheduler, agent and rank spans", 20)
        except AssertionError:
            got = sorted({(s["service"], s["name"], s["trace_id"][:8]) for s in rec.snapshot()})
            print(*got, sep="\n")
            print(cluster.state_dir)
            raise

    by_id = {s["span_id"]: s for s in spans}
    roots = [s for s in spans if s["parent"] is None]
    # the untraced caller's Create call is itself recorded now and then (the server's root sampling):
    # then it is the root and task.submit its child, else task.submit is the root
    assert [r["name"] for r in roots] in (["task.submit"], ["ff.scheduler.v1.TaskService/Create"]), roots
    # every parent link stays inside the trace
    assert all(s["parent"] in by_id for s in spans if s["parent"]), spans

    def parent(name: str, service: str) -> dict[str, Any]:
        s = next(x for x in spans if x["name"] == name and x["service"] == service)
        return by_id[s["parent"]]

    services = {s["service"] for s in spans}
    assert {"scheduler", "node", "task"} <= services, services
    assert parent("scheduler.start_rank", "scheduler")["name"] == "task.submit"
    # the agent's StartTask SERVER span is the child of the scheduler's CLIENT call inside start_rank
    start_task = next(s for s in spans if s["service"] == "node" and s["name"].endswith("/StartTask"))
    client_call = by_id[start_task["parent"]]
    assert client_call["service"] == "scheduler" and by_id[client_call["parent"]]["name"] == "scheduler.start_rank"
    assert parent("node.start_rank", "node")["span_id"] == start_task["span_id"]
    # the rank process's spans hang from the agent's node.start_rank (TRACEPARENT)
    node_start = next(s for s in spans if s["name"] == "node.start_rank")
    rank_spans = [s for s in spans if s["service"] == "task"]
    assert rank_spans and all(s["instance"].startswith(f"task{task}/rank0:") for s in rank_spans)
    tops = [s for s in rank_spans if by_id[s["parent"]]["service"] != "task"]
    assert tops and all(s["parent"] == node_start["span_id"] for s in tops), tops
    assert parent("ckpt.write", "task")["name"] == "ckpt.save"
    # and the scheduler's answer to the rank's call is in the same trace, under the rank's CLIENT span
    get_server = next(s for s in spans if s["service"] == "scheduler" and s["name"].endswith("/Get"))
    assert by_id[get_server["parent"]]["service"] == "task"
