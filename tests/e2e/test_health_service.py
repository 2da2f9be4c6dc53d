"""The health service end to end on an ``ff up`` cluster (issue 51): a scheduler, three node agents
and the health service.

- ``ff health validate node1 --level 1`` runs the checks on node1's agent and passes;
- an incident reported against the node running a task drains it at the scheduler (``ff nodes``
  shows it drained), the task is requeued onto another node (HOOK_RESTART, not finished), the node
  is validated once free and returns to service;
- a fault-injected validation fails and leaves the node drained.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from fireflyer.api.health.v1 import health_pb2 as hpb
from fireflyer.api.scheduler.v1 import scheduler_pb2 as spb
from fireflyer.health.client import HealthClient
from fireflyer.sched.client import SchedClient
from fireflyer.testing.cluster import LocalCluster, run_ff, started_cluster

pytestmark = pytest.mark.timeout(300)

CLUSTER_TOML = """
[cluster]
ready_timeout_s = 60.0
stop_timeout_s = 10.0

[nats]
port = 0

[[service]]
name = "scheduler"
module = "services.scheduler"
replicas = 1
env = { FF_SCHEDULER_LEASE_S = "10", FF_SCHEDULER_RENEW_S = "1", FF_SCHEDULER_STEP_DOWN_MARGIN_S = "2", FF_SCHEDULER_MIN_RUNTIME_S = "0", FF_SCHEDULER_TICK_S = "0.3", FF_SCHEDULER_GRACE_FINAL_S = "1", FF_GRACE_S = "1" }

[[service]]
name = "node"
module = "services.node"
replicas = 3
env = { FF_AGENT_ZONES = "A,A,B", FF_GRACE_S = "2" }

[[service]]
name = "health"
module = "services.health"
replicas = 1
env = { FF_HEALTH_SIZES = "quick", FF_HEALTH_BASELINE_FRACTION = "0.05", FF_HEALTH_TICK_S = "0.3", FF_GRACE_S = "1" }
"""

T = TypeVar("T")


def _poll(check: Callable[[], T | None], what: str, timeout_s: float, interval_s: float = 0.2) -> T:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"not within {timeout_s} s: {what} (last: {last!r})")


def _ff(cluster: LocalCluster, *args: str, timeout_s: float = 60.0) -> Any:
    return run_ff([*args[:2], "--state-dir", str(cluster.state_dir), *args[2:]], timeout_s=timeout_s)


def _sched_nodes(cluster: LocalCluster) -> dict[str, Any]:
    res = run_ff(["nodes", "--state-dir", str(cluster.state_dir), "--json"])
    assert res.returncode == 0, res.stderr
    return {n["name"]: n for n in json.loads(res.stdout)}


def _health_nodes(cluster: LocalCluster) -> dict[str, Any]:
    res = _ff(cluster, "health", "nodes", "--json")
    assert res.returncode == 0, res.stderr
    return {n["name"]: n for n in json.loads(res.stdout)}


def _sched(cluster: LocalCluster, fn: Callable[[SchedClient], Any]) -> Any:
    async def go() -> Any:
        async with SchedClient(cluster.addresses("scheduler"), token=cluster.user_token) as c:
            return await fn(c)
    return asyncio.run(go())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(CLUSTER_TOML, tmp_path_factory.mktemp("health") / "state") as c:
        _poll(lambda: len(_sched_nodes(c)) == 3, "three node agents registered with the scheduler", 30)
        _poll(lambda: sorted(_health_nodes(c)) == ["node0", "node1", "node2"], "the health service knows them", 30)
        yield c


def test_validate_a_node_at_level_1(cluster: LocalCluster) -> None:
    t0 = time.monotonic()
    res = _ff(cluster, "health", "validate", "node1", "--level", "1")
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "of node1 at level 1: PASS" in out, out
    for check in ("hardware", "cpu", "memory_bandwidth", "memory_pattern", "gemm"):
        assert f"PASS   {check}" in out, out
    assert "gemm_gflops=" in out and "node node1 is now healthy" in out, out
    print(f"ff health validate node1 --level 1: {took:.1f} s")


def test_an_incident_drains_the_node_requeues_its_task_and_validation_returns_it(cluster: LocalCluster) -> None:
    chain = _sched(cluster, lambda c: c.submit(spb.TaskSpec(
        name="victim", nodes=1, priority="NORMAL", command=[sys.executable, "-c", "import time; time.sleep(120)"])))
    tid = int(chain.chain_id)

    def running() -> Any:
        r = _sched(cluster, lambda c: c.get(tid)).runs[-1]
        return r if r.ranks and all(k.state == "running" for k in r.ranks) else None
    first = _poll(running, "the task runs", 30)
    bad = first.nodes[0]

    async def report() -> hpb.Incident:
        async with HealthClient(cluster.address("health"), token=cluster.service_token("node")) as c:
            return await c.report(hpb.Incident(kind="xid.79", node=bad, summary="GPU has fallen off the bus",
                                               evidence_json=json.dumps({"xid": 79, "pci": "0000:3b:00"})))
    inc = asyncio.run(report())
    assert inc.id and inc.task == first.id and inc.reporter == "svc-node"

    # the scheduler shows it drained (the health service's own credential drained it) ...
    drained = _poll(lambda: (n := _sched_nodes(cluster)[bad])["state"] == "drained" and n, "ff nodes: drained", 10)
    assert inc.id in drained["reason"]
    # ... and the task was stopped there and requeued elsewhere, not finished
    def requeued() -> Any:
        runs = _sched(cluster, lambda c: c.get(tid)).runs
        return runs if len(runs) == 2 and runs[-1].ranks and runs[-1].ranks[0].state == "running" else None
    runs = _poll(requeued, "the task requeued onto another node", 30)
    assert "HOOK_RESTART" in runs[0].stop_reasons and runs[1].restart_count == 1 and runs[1].nodes[0] != bad

    # the node is validated once free and returns to service
    _poll(lambda: _health_nodes(cluster)[bad]["state"] == "healthy", f"{bad} healthy again", 40)
    assert _sched_nodes(cluster)[bad]["state"] == "enabled"
    show = _ff(cluster, "health", "show", inc.id)
    assert show.returncode == 0, show.stderr
    assert f"drained {bad} at the scheduler (its run {first.id} stopped to be requeued elsewhere)" in show.stdout
    assert "(level 2) PASS" in show.stdout and f"enabled {bad} at the scheduler" in show.stdout, show.stdout
    listed = _ff(cluster, "health", "incidents", "--json")
    assert inc.id in [i["id"] for i in json.loads(listed.stdout)]
    _sched(cluster, lambda c: c.stop(tid))


def test_a_fault_injected_validation_leaves_the_node_drained(cluster: LocalCluster) -> None:
    res = _ff(cluster, "health", "validate", "node2", "--level", "1", "--inject", "gemm=corrupt")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "level 1: FAIL" in res.stdout and "FAIL   gemm" in res.stdout, res.stdout
    assert "node node2 is now drained" in res.stdout
    assert _sched_nodes(cluster)["node2"]["state"] == "drained"
    time.sleep(1.0)  # a few ticks: nothing brings it back by itself
    assert _health_nodes(cluster)["node2"]["state"] == "drained"
    assert _sched_nodes(cluster)["node2"]["state"] == "drained"
    # users may read the health states, not validate
    res = run_ff(["health", "validate", "node0", "--state-dir", str(cluster.state_dir), "--token",
                  cluster.user_token])
    assert res.returncode == 1 and ("admin" in res.stderr.lower() or "permission" in res.stderr.lower()), res.stderr
