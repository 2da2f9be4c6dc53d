"""One trace: ff echo (CLI) -> gRPC -> echo-0 -> NATS -> echo-1, read back from the span file."""

from __future__ import annotations

from fireflyer.telemetry import read_spans
from fireflyer.testing.cluster import run_ff, started_cluster

CLUSTER = """
[nats]
port = 0
[[service]]
name = "echo"
module = "fireflyer.testing.echo"
replicas = 2
"""


def test_one_trace_spans_a_grpc_call_a_nats_event_and_another_process(tmp_path):
    state = tmp_path / "state"
    with started_cluster(CLUSTER, state) as cluster:
        address = cluster.address("echo", 0)
        res = run_ff(["echo", "hello", "--state-dir", str(state), "--address", address, "--publish", "t1"])
        assert res.returncode == 0, res.stderr
        trace_id = res.stdout.rsplit("trace=", 1)[1].strip(" )\n")
        assert len(trace_id) == 32
    # ff down has stopped the services, which flushed their spans
    spans = [s for s in read_spans(state / "spans.jsonl") if s.trace_id == trace_id]
    by_id = {s.span_id: s for s in spans}
    instances = {s.instance.split(":")[0] for s in spans}
    assert {"ff-echo", "echo-0", "echo-1"} <= instances
    server = next(s for s in spans if s.instance == "echo-0" and s.kind == "SERVER")
    client = by_id[server.parent_span_id]
    assert client.kind == "CLIENT" and client.instance.startswith("ff-echo")
    # echo-1 handled the event inside the same trace, under its consumer span
    received = next(s for s in spans if s.instance == "echo-1" and s.name == "echo.received")
    consumer = by_id[received.parent_span_id]
    assert consumer.kind == "CONSUMER" and consumer.instance == "echo-1"
    assert by_id[consumer.parent_span_id].instance == "echo-0"
