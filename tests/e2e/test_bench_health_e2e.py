"""``ff bench health --e2e`` on an ``ff up`` cluster (issue 51): a scheduler, coord, three node agents
(zones A, A, B) and the health service.  One iteration: a node of a 2-node task made slow is named
by C4, drained, and the task runs again from its checkpoint on the other two nodes; the JSON carries
the times from the fault, the steps lost and the checkpoint interval, and the cluster is idle and
every node enabled afterwards."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from fireflyer.testing.cluster import LocalCluster, run_ff, started_cluster

pytestmark = pytest.mark.timeout(240)

SAVE_EVERY = 5

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
env = { FF_SCHEDULER_LEASE_S = "10", FF_SCHEDULER_RENEW_S = "1", FF_SCHEDULER_STEP_DOWN_MARGIN_S = "2", FF_SCHEDULER_TICK_S = "0.3", FF_SCHEDULER_GRACE_FINAL_S = "1", FF_GRACE_S = "1" }

[[service]]
name = "node"
module = "services.node"
replicas = 3
env = { FF_AGENT_ZONES = "A,A,B", FF_GRACE_S = "2" }

[[service]]
name = "health"
module = "services.health"
replicas = 1
env = { FF_HEALTH_SIZES = "quick", FF_HEALTH_BASELINE_FRACTION = "0.05", FF_HEALTH_TICK_S = "0.3", FF_HEALTH_QUARANTINE_S = "3", FF_GRACE_S = "1" }
"""


def _nodes(cluster: LocalCluster) -> list[dict]:
    res = run_ff(["nodes", "--state-dir", str(cluster.state_dir), "--json"])
    assert res.returncode == 0, res.stderr
    return list(json.loads(res.stdout))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(CLUSTER_TOML, tmp_path_factory.mktemp("bench-health") / "state") as c:
        deadline = time.monotonic() + 30
        while len(_nodes(c)) < 3 and time.monotonic() < deadline:
            time.sleep(0.3)
        yield c


def test_bench_health_e2e_times_fault_to_restart_against_the_checkpoint_interval(cluster: LocalCluster) -> None:
    t0 = time.monotonic()
    res = run_ff(["bench", "health", "--e2e", "--state-dir", str(cluster.state_dir), "--iterations", "1",
                  "--save-every", str(SAVE_EVERY), "--timeout", "60", "--json"], timeout_s=200)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["bench"] == "health" and out["mode"] == "e2e", out
    e = out["e2e"]
    assert e["iterations"] == 1 and e["nodes"] == 3 and e["save_every"] == SAVE_EVERY and len(e["runs"]) == 1, e
    (r,) = e["runs"]
    # the slow node was named by C4 within seconds, and the run that replaced the slow one avoids it
    assert r["victim"] in r["slow_nodes"] and r["victim"] not in r["new_nodes"] and len(r["new_nodes"]) == 2, r
    assert r["incident"] and len(r["incident_ops"]) >= 3, r
    assert 0 < r["named_s"] < 20 and abs(r["named_at_service_s"] - r["named_s"]) < 2, r
    assert "HOOK_RESTART" in r["slow_run_stop_reasons"], r
    # events in order: named, then the new run's ranks running, then its rank 0 loading the checkpoint
    assert r["named_s"] <= r["ranks_running_s"] + 0.5 and r["ranks_running_s"] <= r["restart_s"] < 40, r
    assert r["named_s"] < r["back_s"] < 60 and 0 < r["first_startup_s"] < 30, r
    # it resumed from a checkpoint (a multiple of K; the slow run may have saved after the fault),
    # losing at most the steps since the last save and those the slow run made until it was stopped
    assert r["start_step"] >= SAVE_EVERY and r["start_step"] % SAVE_EVERY == 0, r
    assert r["step_reached"] >= r["step_at_fault"] and r["step_reached"] >= r["start_step"], r
    assert 0 <= r["steps_lost"] == r["step_reached"] - r["start_step"] <= SAVE_EVERY + 6, r
    # the anchor: K steps at the measured pace (0.1 s of work a step plus the HFReduce flag per step)
    assert 0.1 <= r["seconds_per_step"] < 1.0, r
    assert r["checkpoint_interval_s"] == pytest.approx(SAVE_EVERY * r["seconds_per_step"], abs=0.01), r
    assert r["restart_over_interval"] == pytest.approx(r["restart_s"] / r["checkpoint_interval_s"], rel=0.01), r
    assert e["restart_over_interval_median"] == r["restart_over_interval"], e
    # the cluster is left as found: every node enabled, none holding a run
    nodes = {n["name"]: (n["state"], n["task"]) for n in _nodes(cluster)}
    assert all(state == "enabled" and not int(task) for state, task in nodes.values()), nodes
    print(f"bench health --e2e ({took:.0f} s): {r['victim']} named after {r['named_s']} s, ranks running "
          f"{r['ranks_running_s']} s, restart {r['restart_s']} s = {r['restart_over_interval']} x the checkpoint "
          f"interval {r['checkpoint_interval_s']} s; {r['steps_lost']} steps lost; back after {r['back_s']} s")
