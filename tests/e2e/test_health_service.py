"""The health service end to end on an ``ff up`` cluster (issue 51): a scheduler, three node agents
and the health service.

- ``ff health validate node1 --level 1`` runs the checks on node1's agent and passes;
- an incident reported against the node running a task drains it at the scheduler (``ff nodes``
  shows it drained), the task is requeued onto another node (HOOK_RESTART, not finished), the node
  is validated once free and returns to service;
- a 2-node task with one node made slow (``hai_resumable.py --slow-file``): the health service's C4
  detector names that node from the HFReduce telemetry within a few operations, drains it, the task
  restarts from its checkpoint on the two healthy nodes, and the node returns after validation;
- a fault-injected validation fails and leaves the node drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fireflyer.api.health.v1 import health_pb2 as hpb
from fireflyer.api.scheduler.v1 import scheduler_pb2 as spb
from fireflyer.health.client import HealthClient
from fireflyer.sched.client import SchedClient
from fireflyer.testing.cluster import REPO_ROOT, LocalCluster, run_ff, started_cluster

pytestmark = pytest.mark.timeout(300)

EXAMPLE = REPO_ROOT / "docs" / "examples" / "hai_resumable.py"

CLUSTER_TOML = """
[cluster]
ready_timeout_s = 60.0
stop_timeout_s = 10.0

[nats]
port = 0

[[service]]
name = "coord"
module = "services.coord"
replicas = 1

[[service]]
name = "scheduler"
module = "services.scheduler"
replicas = 1
env = { FF_SCHEDULER_LEASE_S = "10", FF_SCHEDULER_RENEW_S = "1", FF_SCHEDULER_STEP_DOWN_MARGIN_S = "2", FF_SCHEDULER_MIN_RUNTIME_S = "0", FF_SCHEDULER_TICK_S = "0.3", FF_SCHEDULER_GRACE_FINAL_S = "1", FF_GRACE_S = "1" }

[[service]]
name = "node"
module = "services.node"
replicas = 3
env = { FF_AGENT_ZONES = "A,A,B", FF_GRACE_S = "2", FF_HFREDUCE_TIMEOUT_S = "4" }

[[service]]
name = "health"
module = "services.health"
replicas = 1
env = { FF_HEALTH_SIZES = "quick", FF_HEALTH_BASELINE_FRACTION = "0.05", FF_HEALTH_TICK_S = "0.3", FF_HEALTH_C4_DEADLINE_S = "4", FF_HEALTH_QUARANTINE_S = "3", FF_GRACE_S = "1" }
"""

#: the HFReduce op timeout of the node agents' workers, and the health service's C4 deadline (above)
OP_DEADLINE_S = 4.0

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


def _task_log(cluster: LocalCluster, task: int, rank: int = 0) -> str:
    async def go(c: SchedClient) -> str:
        return b"".join([d async for d in c.logs(task, rank)]).decode(errors="replace")
    return str(_sched(cluster, go))


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


def test_a_slow_node_is_named_drained_and_the_task_restarts_from_its_checkpoint(
        cluster: LocalCluster, tmp_path: Path) -> None:
    slow = tmp_path / "slow-node"
    ckpts = tmp_path / "ckpts"
    cmd = [sys.executable, str(EXAMPLE), "--steps", "2000", "--step-s", "0.1", "--save-every", "5",
           "--local", str(ckpts), "--name", "e2e-c4", "--slow-file", str(slow)]
    chain = _sched(cluster, lambda c: c.submit(spb.TaskSpec(name="c4", nodes=2, priority="NORMAL", command=cmd,
                                                            max_restarts=3)))
    tid = int(chain.chain_id)

    def stepping() -> Any:
        r = _sched(cluster, lambda c: c.get(tid)).runs[-1]
        return r if (r.ranks and all(k.state == "running" for k in r.ranks)
                     and "rank 0 saved step 5" in _task_log(cluster, tid)) else None
    try:
        first = _poll(stepping, "the 2-node task steps and saves", 90, 0.5)
        victim = first.nodes[1]
        slow.write_text(f"{victim}\n0.6\n")
        t0 = time.monotonic()

        async def incidents() -> list[hpb.Incident]:
            async with HealthClient(cluster.address("health"), token=cluster.admin_token) as c:
                return list(await c.incidents())
        inc = _poll(lambda: next((i for i in asyncio.run(incidents()) if i.kind.startswith("c4.")), None),
                    "a C4 incident", 60, 0.5)
        named_s = time.monotonic() - t0
        evidence = json.loads(inc.evidence_json)
        assert (inc.kind, inc.node, inc.job) == ("c4.noncomm_slow", victim, str(tid)), inc
        assert len(evidence["ops"]) >= 3 and evidence["ops"][-1] - evidence["ops"][0] <= 11, evidence
        slow.unlink()  # the node "recovers", so its validation can pass

        def moved() -> Any:
            runs = _sched(cluster, lambda c: c.get(tid)).runs
            r = runs[-1]
            return runs if (len(runs) >= 2 and r.ranks and all(k.state == "running" for k in r.ranks)) else None
        runs = _poll(moved, "the task restarts on the healthy nodes", 60, 0.5)
        restarted_s = time.monotonic() - t0
        assert "HOOK_RESTART" in runs[-2].stop_reasons and victim not in runs[-1].nodes, runs[-1]
        assert _sched_nodes(cluster)[victim]["state"] in ("drained", "enabled")
        resumed = _poll(lambda: re.search(r"rank 0 start at step (\d+) restart 1", _task_log(cluster, tid)),
                        "the new run loads the checkpoint", 60, 0.5)
        assert int(resumed.group(1)) >= 5, "it resumed from a checkpoint, not from step 0"
        _poll(lambda: _health_nodes(cluster)[victim]["state"] == "healthy", f"{victim} validated and back", 90, 0.5)
        assert _sched_nodes(cluster)[victim]["state"] == "enabled"
        print(f"C4: {victim} named {named_s:.1f} s after it was slowed, over ops {evidence['ops']}; "
              f"the task ran again on {', '.join(runs[-1].nodes)} {restarted_s:.1f} s after, from step {resumed.group(1)}")
    finally:  # a failure here must not leave its task holding two nodes for the next test
        _sched(cluster, lambda c: c.stop(tid))


def _worker_pid(cluster: LocalCluster, node: str) -> int:
    """The pid of the HFReduce worker the node agent started for the task running on ``node`` (from
    the agent's state file, ``<state_dir>/node/<node>/state.json``: one task runs there)."""
    [path] = list(Path(cluster.state_dir).glob(f"**/node/{node}/state.json"))
    tasks = json.loads(path.read_text())["tasks"].values()
    [pid] = [t["worker"]["pid"] for t in tasks if t["state"] == "running" and t.get("worker")]
    return int(pid)


def test_a_stalled_hfreduce_link_names_the_node_within_the_op_deadline_and_the_task_restarts(
        cluster: LocalCluster, tmp_path: Path) -> None:
    """One node's HFReduce worker stops (SIGSTOP: every connection to the node stalls, its heartbeats
    and its telemetry stop): the other node's worker fails the op in flight -- coord aborts the
    communicator once the node missed its heartbeats (3 s), or the op deadline passes (4 s here),
    whichever comes first -- and C4 names the node that never entered that op."""
    ckpts = tmp_path / "ckpts"
    cmd = [sys.executable, str(EXAMPLE), "--steps", "2000", "--step-s", "0.1", "--save-every", "5",
           "--local", str(ckpts), "--name", "e2e-stall"]
    chain = _sched(cluster, lambda c: c.submit(spb.TaskSpec(name="stall", nodes=2, priority="NORMAL", command=cmd,
                                                            max_restarts=3)))
    tid = int(chain.chain_id)

    def stepping() -> Any:
        r = _sched(cluster, lambda c: c.get(tid)).runs[-1]
        return r if (r.ranks and all(k.state == "running" for k in r.ranks)
                     and "rank 0 saved step 5" in _task_log(cluster, tid)) else None
    try:
        first = _poll(stepping, "the 2-node task steps and saves", 90, 0.5)
        victim = first.nodes[1]
        healthy = sorted({"node0", "node1", "node2"} - {victim})
        pid = _worker_pid(cluster, victim)
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()

        async def incidents() -> list[hpb.Incident]:
            async with HealthClient(cluster.address("health"), token=cluster.admin_token) as c:
                return list(await c.incidents())
        try:
            inc = _poll(lambda: next((i for i in asyncio.run(incidents()) if i.job == str(tid)), None),
                        "a C4 incident for the stalled task", OP_DEADLINE_S + 10, 0.2)
            named_s = time.monotonic() - t0
        finally:
            # the link comes back, so the node's validation can pass (the worker may already be gone:
            # the agent kills it when the run on the node ends)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        evidence = json.loads(inc.evidence_json)
        assert inc.kind in ("c4.noncomm_hang", "c4.comm_hang") and inc.node == victim, (inc.kind, inc.node, inc.summary)
        assert len(evidence["node_ranks"]) == 1 and evidence["generation"] >= 1, evidence
        assert named_s <= OP_DEADLINE_S + 5.0, f"named {named_s:.1f} s after the stall"

        def moved() -> Any:
            runs = _sched(cluster, lambda c: c.get(tid)).runs
            r = runs[-1]
            return runs if (r.restart_count >= 1 and r.ranks and all(k.state == "running" for k in r.ranks)
                            and sorted(r.nodes) == healthy) else None
        runs = _poll(moved, f"the task runs again on {healthy}", 60, 0.5)
        restarted_s = time.monotonic() - t0
        # (which run the drain stopped is a race: the first one fails by itself when its ranks' op fails,
        # and the scheduler may requeue it onto the stalled node once more before the incident drains it)
        on_victim = [r.id for r in runs[:-1] if victim in r.nodes]
        assert on_victim and (inc.task == 0 or inc.task in on_victim), (inc.task, on_victim)
        resumed = _poll(lambda: re.search(rf"rank 0 start at step (\d+) restart {runs[-1].restart_count}",
                                          _task_log(cluster, tid)), "the new run loads the checkpoint", 60, 0.5)
        assert int(resumed.group(1)) >= 5, "it resumed from a checkpoint, not from step 0"
        _poll(lambda: _health_nodes(cluster)[victim]["state"] == "healthy", f"{victim} validated and back", 60, 0.5)
        assert _sched_nodes(cluster)[victim]["state"] == "enabled"
        show = _ff(cluster, "health", "show", inc.id)
        assert show.returncode == 0 and "PASS" in show.stdout and f"enabled {victim} at the scheduler" in show.stdout, \
            show.stdout + show.stderr
        print(f"HFReduce stall: {victim} named ({inc.kind}) {named_s:.1f} s after its worker stopped "
              f"(op deadline {OP_DEADLINE_S:g} s): {inc.summary}; runs "
              f"{[(r.id, list(r.nodes), r.slurm_state, list(r.stop_reasons)) for r in runs]}; the task ran again on "
              f"{', '.join(runs[-1].nodes)} {restarted_s:.1f} s after, from step {resumed.group(1)}")
    finally:  # a failure here must not leave its task holding two nodes for the next test
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
