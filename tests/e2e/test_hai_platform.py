"""The HAI Platform end to end on an ``ff up`` cluster (issue 49): two scheduler replicas, three node
agents (zones A, A, B) that register with them, HFReduce through coord, checkpoints through the
checkpoint service and 3FS as the task's user.

A LOW 2-node task (docs/examples/hai_resumable.py: loops steps, agrees on the suspend flag through
HFReduce, saves through ``fireflyer.ckpt`` and calls ``go_suspend()``) is preempted by a HIGH 3-node
task, which runs and finishes; the LOW task comes back as its chain's next run (restart_count 1,
whole-life state 1) and continues from the step it saved.  Another user can neither see nor read it.
One cluster serves the whole file.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.core.errors import FailedPrecondition, NotFound, PermissionDenied
from fireflyer.sched.client import SchedClient
from fireflyer.testing.cluster import REPO_ROOT, LocalCluster, run_ff, started_cluster

pytestmark = pytest.mark.timeout(600)

EXAMPLE = REPO_ROOT / "docs" / "examples" / "hai_resumable.py"

CLUSTER_TOML = """
[cluster]
ready_timeout_s = 60.0
stop_timeout_s = 10.0

[nats]
port = 0

[[service]]
name = "mgmtd"
module = "services.mgmtd"
replicas = 1
env = { FF_MGMTD_HEARTBEAT_FAIL_INTERVAL_S = "30", FF_MGMTD_SCAN_INTERVAL_S = "1", FF_GRACE_S = "1" }

[[service]]
name = "meta"
module = "services.meta"
replicas = 1
env = { FF_META_ROOT_STRIPE_SIZE = "2", FF_GRACE_S = "1" }

[[service]]
name = "storage"
module = "services.storage"
replicas = 3
env = { FF_STORAGE_TARGET_COUNT = "2", FF_STORAGE_FSYNC = "false", FF_STORAGE_HEARTBEAT_INTERVAL_S = "1", FF_STORAGE_ROUTING_PULL_S = "1", FF_STORAGE_INIT_CHAINS = "nodes=3,replicas=3,table=1", FF_GRACE_S = "1" }

[[service]]
name = "checkpoint"
module = "services.checkpoint"
replicas = 1
env = { FF_GRACE_S = "1" }

[[service]]
name = "coord"
module = "services.coord"
replicas = 1

[[service]]
name = "scheduler"
module = "services.scheduler"
replicas = 2
env = { FF_SCHEDULER_LEASE_S = "10", FF_SCHEDULER_RENEW_S = "2", FF_SCHEDULER_STEP_DOWN_MARGIN_S = "2", FF_SCHEDULER_MIN_RUNTIME_S = "0", FF_SCHEDULER_TICK_S = "0.5", FF_SCHEDULER_NODE_TIMEOUT_S = "8", FF_GRACE_S = "1" }

[[service]]
name = "node"
module = "services.node"
replicas = 3
env = { FF_AGENT_ZONES = "A,A,B", FF_GRACE_S = "2" }
"""

T = TypeVar("T")


def _poll(check: Callable[[], T | None], what: str, timeout_s: float, interval_s: float = 0.1) -> T:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"not within {timeout_s} s: {what} (last: {last!r})")


def _sched(cluster: LocalCluster, token: str, fn: Callable[[SchedClient], Any]) -> Any:
    async def go() -> Any:
        async with SchedClient(cluster.addresses("scheduler"), token=token) as c:
            return await fn(c)
    return asyncio.run(go())


def _log(cluster: LocalCluster, token: str, task: int, rank: int, restart: int | None = None) -> str:
    async def go(c: SchedClient) -> str:
        return b"".join([d async for d in c.logs(task, rank, restart=restart)]).decode(errors="replace")
    return str(_sched(cluster, token, go))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(CLUSTER_TOML, tmp_path_factory.mktemp("hai") / "state") as c:
        c.wait_chains_serving(2, timeout_s=60)
        # the agents register with the scheduler as their heartbeat
        nodes = _poll(lambda: (ns := _sched(c, c.admin_token, lambda s: s.nodes())) and len(ns) == 3 and ns,
                      "three node agents registered with the scheduler", 60)
        assert sorted((n.name, n.zone) for n in nodes) == [("node0", "A"), ("node1", "A"), ("node2", "B")]
        yield c


def _submit(cluster: LocalCluster, token: str, **fields: Any) -> int:
    chain = _sched(cluster, token, lambda c: c.submit(pb.TaskSpec(**fields)))
    return int(chain.chain_id)


def _chain(cluster: LocalCluster, token: str, task: int) -> Any:
    return _sched(cluster, token, lambda c: c.get(task))


def test_low_task_is_preempted_saves_and_resumes_where_it_stopped(cluster: LocalCluster) -> None:
    user = cluster.user_token
    py = sys.executable
    low = _submit(cluster, user, name="low", nodes=2, priority="LOW", grace_ack_s=20.0, grace_final_s=60.0,
                  command=[py, str(EXAMPLE), "--steps", "50", "--step-s", "0.3", "--name", "e2e-hai-low"])

    def low_stepping() -> bool:
        r = _chain(cluster, user, low).runs[-1]
        return (r.slurm_state == "RUNNING" and all(k.state == "running" for k in r.ranks)
                and "step 3 restart 0" in _log(cluster, user, low, 0))
    _poll(low_stepping, "the LOW task runs on two nodes and steps", 120, 0.5)
    first = _chain(cluster, user, low).runs[-1]
    assert sorted(first.nodes) == ["node0", "node1"], "a 2-node task packs inside zone A"

    t_submit = time.monotonic()
    high = _submit(cluster, user, name="high", nodes=3, priority="HIGH",
                   command=[py, "-c", "import time, os; print('high rank', os.environ['FF_NODE_RANK'], "
                                      "'token set', bool(os.environ.get('FF_TOKEN'))); time.sleep(3)"])

    def high_running() -> Any:
        r = _chain(cluster, user, high).runs[-1]
        return r if r.ranks and all(k.state in ("running", "succeeded") for k in r.ranks) else None
    _poll(high_running, "the HIGH task's ranks run", 120, 0.05)
    latency = time.monotonic() - t_submit

    # the LOW run was interrupted: it acknowledged, saved and called go_suspend (not killed by the grace)
    runs = _chain(cluster, user, low).runs
    assert runs[0].suspend_code == 3 and "INTERRUPT" in runs[0].stop_reasons, runs[0]
    # (the chain id names the newest run once the resumed one starts: restart=0 picks the first)
    first_log = _log(cluster, user, low, 0, restart=0)
    saved = re.findall(r"rank 0 saved step (\d+) in ([\d.]+) s", first_log)
    assert saved, first_log
    saved_step, save_s = int(saved[0][0]), float(saved[0][1])
    # both ranks agreed on the step (HFReduce max of the flag)
    assert f"rank 1 saved step {saved_step} " in _log(cluster, user, low, 1, restart=0)
    print(f"preemption: HIGH submit -> its ranks running {latency:.2f} s; the LOW task's save took {save_s:.2f} s")

    done = _poll(lambda: (r := _chain(cluster, user, high).runs[-1]).slurm_state == "COMPLETED" and r,
                 "the HIGH task finishes", 120, 0.5)
    assert "token set True" in _log(cluster, user, done.id, 0)

    def resumed_and_done() -> Any:
        rs = _chain(cluster, user, low).runs
        return rs if len(rs) == 2 and rs[-1].slurm_state == "COMPLETED" else None
    runs = _poll(resumed_and_done, "the LOW task resumes and completes", 240, 1.0)
    second = runs[-1]
    assert second.restart_count == 1 and second.whole_life_state == 1, second
    log = _log(cluster, user, second.id, 0)
    assert f"rank 0 start at step {saved_step} restart 1 whole_life_state 1" in log, log
    assert f"step {saved_step} restart 1" in log and "rank 0 done at step 50" in log, log
    assert f"step {saved_step - 1} restart 1" not in log, "the resumed run repeats no step"


def test_another_user_cannot_see_or_read_a_task(cluster: LocalCluster) -> None:
    res = run_ff(["admin", "--state-dir", str(cluster.state_dir), "users", "add", "bob"], timeout_s=60)
    assert res.returncode == 0, res.stdout + res.stderr
    bob = res.stdout.splitlines()[1].strip()
    task = _submit(cluster, cluster.user_token, name="mine", nodes=1, priority="LOW",
                   command=[sys.executable, "-c", "print('hello')"])

    def bob_refused() -> bool:
        try:
            _chain(cluster, bob, task)
        except PermissionDenied:
            return True
        except Exception:  # noqa: BLE001 -- bob's token not yet known to the scheduler replicas
            return False
        raise AssertionError("bob could read alice's task")
    _poll(bob_refused, "the scheduler refuses bob the task", 30, 0.5)
    assert task not in [c.chain_id for c in _sched(cluster, bob, lambda c: c.list(include_finished=True))]
    with pytest.raises(PermissionDenied):
        _log(cluster, bob, task, 0)
    r = run_ff(["task", "--state-dir", str(cluster.state_dir), "stop", str(task)], env={"FF_TOKEN": bob})
    assert r.returncode != 0 and "bob may not stop it" in r.stderr, r
    assert _chain(cluster, cluster.user_token, task).runs[-1].stop_code & 1024 == 0, "bob's stop changed nothing"


def test_an_unacknowledged_interrupt_is_stopped_after_the_grace_and_requeued(cluster: LocalCluster) -> None:
    """A task that never looks at the flag is stopped grace_ack_s after the interrupt (HAI: forced
    after 5 s), and still requeued (the interrupt was the cluster's doing)."""
    user = cluster.user_token
    deaf = _submit(cluster, user, name="deaf", nodes=2, priority="LOW", grace_ack_s=1.0, grace_final_s=1.0,
                   command=[sys.executable, "-c", "import time\nwhile True:\n    print('busy', flush=True)\n"
                                                  "    time.sleep(0.5)"])
    def deaf_running() -> bool:
        r = _chain(cluster, user, deaf).runs[-1]
        return bool(r.ranks) and all(k.state == "running" for k in r.ranks)
    _poll(deaf_running, "the deaf task runs", 60, 0.3)
    high = _submit(cluster, user, name="high2", nodes=3, priority="HIGH",
                   command=[sys.executable, "-c", "print('ok')"])
    _poll(lambda: _chain(cluster, user, high).runs[-1].slurm_state == "COMPLETED", "the HIGH task completes", 60, 0.3)
    runs = _chain(cluster, user, deaf).runs
    assert runs[0].suspend_code == 1 and "INTERRUPT" in runs[0].stop_reasons, runs[0]
    assert len(runs) == 2 and runs[1].restart_count == 1
    _sched(cluster, user, lambda c: c.stop(deaf))
    _poll(lambda: _chain(cluster, user, deaf).runs[-1].chain_status == "finished", "the deaf task stops", 60, 0.3)


def test_the_watchdog_fails_a_silent_task(cluster: LocalCluster) -> None:
    """hai.set_watchdog_time(2) then silence: the node agent stops it and the scheduler fails it as
    TIMEOUT (not requeued)."""
    user = cluster.user_token
    code = ("from fireflyer import hai; import time\nhai.set_watchdog_time(2)\nprint('going quiet', flush=True)\n"
            "time.sleep(120)")
    task = _submit(cluster, user, name="quiet", nodes=1, priority="LOW", command=[sys.executable, "-c", code])
    t0 = time.monotonic()
    done = _poll(lambda: (c := _chain(cluster, user, task)).runs[-1].chain_status == "finished" and c,
                 "the silent task is stopped", 60, 0.3)
    assert time.monotonic() - t0 < 40
    assert len(done.runs) == 1 and "TIMEOUT" in done.runs[0].stop_reasons and done.runs[0].slurm_state == "FAILED"


def test_a_crashing_task_is_requeued_only_within_its_max_restarts(cluster: LocalCluster) -> None:
    """A user-code failure (exit 3 on every run) ends the chain FAILED at once without
    max_restarts, and after exactly max_restarts more runs with it (HAI's restart rule)."""
    user = cluster.user_token
    crash = [sys.executable, "-c", "import os, sys\nprint('run', os.environ['FF_RESTART_COUNT'], flush=True)\n"
                                   "sys.exit(3)"]
    plain = _submit(cluster, user, name="crash0", nodes=1, priority="LOW", command=crash)
    retried = _submit(cluster, user, name="crash2", nodes=1, priority="LOW", max_restarts=2, command=crash)
    for task, runs in ((plain, 1), (retried, 3)):
        done = _poll(lambda t=task: (c := _chain(cluster, user, t)).runs[-1].chain_status == "finished" and c,
                     f"task {task} ends", 90, 0.3)
        assert len(done.runs) == runs, done.runs
        assert [r.restart_count for r in done.runs] == list(range(runs))
        assert all(r.slurm_state == "FAILED" for r in done.runs), [r.slurm_state for r in done.runs]
    assert "run 2" in _log(cluster, user, retried, 0)  # the last run saw its restart count


def test_a_task_changes_its_own_priority_with_its_users_token(cluster: LocalCluster) -> None:
    """hai.set_priority from inside a rank: UpdatePriority with the task's FF_TOKEN (its user's)."""
    user = cluster.user_token
    code = "from fireflyer import hai\nhai.set_priority(hai.EXP_PRIORITY.VERY_HIGH)\nprint('raised', flush=True)"
    task = _submit(cluster, user, name="climber", nodes=1, priority="LOW", command=[sys.executable, "-c", code])
    done = _poll(lambda: (c := _chain(cluster, user, task)).runs[-1].chain_status == "finished" and c,
                 "the task ends", 60, 0.3)
    assert done.runs[-1].slurm_state == "COMPLETED", _log(cluster, user, task, 0)
    assert done.runs[-1].spec.priority == "VERY_HIGH" and "raised" in _log(cluster, user, task, 0)


def _ff_admin(cluster: LocalCluster, *args: str) -> str:
    """``ff VERB --state-dir <cluster> ARGS``: the CLI uses the cluster's admin token for admin verbs."""
    res = run_ff([args[0], "--state-dir", str(cluster.state_dir), *args[1:]], timeout_s=60)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def _idle(cluster: LocalCluster) -> None:
    """No chain of any user holds or waits for nodes: the tests below each start from an idle cluster."""
    _poll(lambda: not _sched(cluster, cluster.admin_token, lambda c: c.list(include_finished=False)),
          "no unfinished task left by an earlier test", 60, 0.3)


def _stop_all(cluster: LocalCluster, token: str, *tasks: int) -> None:
    for t in tasks:
        try:
            _sched(cluster, token, lambda c, t=t: c.stop(t))
        except FailedPrecondition:  # already finished
            pass
    _idle(cluster)


def _sleeper(seconds: float) -> list[str]:
    return [sys.executable, "-c", f"import time; print('up', flush=True); time.sleep({seconds})"]


def _all_ranks_running(cluster: LocalCluster, token: str, task: int) -> Any:
    r = _chain(cluster, token, task).runs[-1]
    return r if r.ranks and all(k.state == "running" for k in r.ranks) else None


def _waiting(cluster: LocalCluster, token: str, task: int, what: str) -> Any:
    """The run once a decision has given it a reason to wait (the submit's own reason is a placeholder)."""
    return _poll(lambda: (r := _chain(cluster, token, task).runs[-1]).reason_code not in ("", "submitted") and r,
                 what, 30, 0.3)


def test_a_drained_node_gets_no_task_until_enabled(cluster: LocalCluster) -> None:
    """Drain node2 (admin, through the CLI): a 3-node task, which fits only with node2, stays PENDING
    with the drain as its reason; ``--enable`` lets it start on all three nodes."""
    user = cluster.user_token
    _idle(cluster)
    _ff_admin(cluster, "nodes", "--drain", "node2", "--reason", "fan failure")
    task = 0
    try:
        task = _submit(cluster, user, name="needs-node2", nodes=3, priority="NORMAL", command=_sleeper(60))
        r = _waiting(cluster, user, task, "the 3-node task waits for the drained node")
        assert r.slurm_state == "PENDING" and not r.nodes, r
        assert "drained" in r.reason and "node2: fan failure" in r.reason, r.reason
        listed = _ff_admin(cluster, "nodes")
        assert "fan failure" in listed, listed
        _ff_admin(cluster, "nodes", "--enable", "node2")
        run = _poll(lambda: _all_ranks_running(cluster, user, task), "the task runs after --enable", 60, 0.3)
        assert sorted(run.nodes) == ["node0", "node1", "node2"], run.nodes
    finally:
        _ff_admin(cluster, "nodes", "--enable", "node2")
        if task:
            _stop_all(cluster, user, task)


def test_only_one_running_task_spans_zones(cluster: LocalCluster) -> None:
    """Zones A, A, B: a 3-node task must span A and B, and does; while it runs, a second task that
    would also have to span zones waits with the zone rule as its reason (not merely for nodes),
    and starts once the first is stopped."""
    user = cluster.user_token
    _idle(cluster)
    first = second = 0
    try:
        first = _submit(cluster, user, name="spans", nodes=3, priority="NORMAL", command=_sleeper(60))
        run = _poll(lambda: _all_ranks_running(cluster, user, first), "the cross-zone task runs", 60, 0.3)
        assert sorted(run.nodes) == ["node0", "node1", "node2"], run.nodes
        second = _submit(cluster, user, name="spans-too", nodes=3, priority="NORMAL", command=_sleeper(60))
        r = _waiting(cluster, user, second, "the second cross-zone task waits")
        assert r.slurm_state == "PENDING" and not r.nodes, r
        assert f"run {run.id} already spans zones and only one may" in r.reason, r.reason
        _sched(cluster, user, lambda c: c.stop(first))
        again = _poll(lambda: _all_ranks_running(cluster, user, second), "the second runs after the first stops",
                      60, 0.3)
        assert sorted(again.nodes) == ["node0", "node1", "node2"], again.nodes
    finally:
        _stop_all(cluster, user, *[t for t in (first, second) if t])


def test_a_run_over_its_users_quota_waits(cluster: LocalCluster) -> None:
    """An admin sets the user's quota at ABOVE_NORMAL to 1 node: a 2-node submit at that level waits
    as over quota although nodes are free; removing the quota lets it run."""
    user = cluster.user_token
    entry = cluster.tokens.for_role("user")
    assert entry is not None
    owner = entry.user
    _idle(cluster)
    _ff_admin(cluster, "quota", "--set", owner, "default", "ABOVE_NORMAL", "1")
    task = 0
    try:
        task = _submit(cluster, user, name="too-big", nodes=2, priority="ABOVE_NORMAL", command=_sleeper(60))
        r = _waiting(cluster, user, task, "the over-quota task waits")
        assert r.slurm_state == "PENDING" and not r.nodes, r
        assert r.reason.startswith("over quota:") and "its 1-node quota at ABOVE_NORMAL" in r.reason, r.reason
        _ff_admin(cluster, "quota", "--remove", owner, "default", "ABOVE_NORMAL")
        run = _poll(lambda: _all_ranks_running(cluster, user, task), "the task runs once the quota is removed",
                    60, 0.3)
        assert len(run.nodes) == 2
    finally:
        _ff_admin(cluster, "quota", "--remove", owner, "default", "ABOVE_NORMAL")
        if task:
            _stop_all(cluster, user, task)


def test_bench_sched_preempt_measures_against_the_save_in_the_same_run(cluster: LocalCluster) -> None:
    """``ff bench sched --preempt`` on this cluster, one iteration: the latency from the HIGH submit to
    its ranks running, beside the LOW run's save time and the goal (save + 2 s) of the same run."""
    import json

    _idle(cluster)
    res = run_ff(["bench", "sched", "--preempt", "--state-dir", str(cluster.state_dir), "--iterations", "1",
                  "--json"], timeout_s=400)
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["bench"] == "sched" and out["mode"] == "preempt", out
    p = out["preemption"]
    assert p["iterations"] == 1 and p["nodes"] == 3 and p["slack_s"] == 2.0 and len(p["runs"]) == 1, p
    (run,) = p["runs"]
    assert 0 < run["save_s"] < run["latency_s"], "the HIGH run waits at least for the LOW run's save"
    assert run["goal_s"] == round(run["save_s"] + 2.0, 3) and run["met"] == (run["latency_s"] <= run["goal_s"])
    assert run["saved_step"] >= 3
    (goal,) = out["goals"]
    assert goal["value"] == p["latency_s_median"] and goal["target"] == p["goal_s_median"], goal
    print(f"bench sched --preempt: latency {run['latency_s']} s, save {run['save_s']} s, goal {run['goal_s']} s")
    # both runs ended and the LOW chain (requeued as its next run) was stopped: the cluster is idle again
    low = _chain(cluster, cluster.user_token, run["low_task"])
    assert low.runs[0].suspend_code == 3 and low.runs[-1].chain_status == "finished", low
    _idle(cluster)


def _leader_pid(cluster: LocalCluster) -> int:
    from fireflyer.kv import open_kv
    from services.scheduler import store

    kv = open_kv(f"sqlite:///{cluster.state_dir.absolute() / 'scheduler.db'}")
    try:
        lease = kv.run(lambda t: store.load_lease(t, snapshot=True))
    finally:
        kv.close()
    assert lease is not None
    (pid,) = [p.pid for p in cluster.record.processes if p.name == "scheduler" and p.address == lease.address]
    return pid


def test_the_leader_killed_mid_preemption_loses_nothing(cluster: LocalCluster) -> None:
    """SIGKILL the scheduler leader right after a HIGH submit that preempts a LOW task: the other
    replica takes over within the lease, re-sends what was in flight, the agents' reports reach it,
    and both tasks end as they would have (the LOW one resumed at its saved step).  Last in the
    file: the cluster keeps one scheduler replica afterwards."""
    import os
    import signal

    user = cluster.user_token
    py = sys.executable
    low = _submit(cluster, user, name="low-failover", nodes=2, priority="LOW", grace_ack_s=30.0, grace_final_s=60.0,
                  command=[py, str(EXAMPLE), "--steps", "40", "--step-s", "0.3", "--name", "e2e-hai-failover"])
    _poll(lambda: _all_ranks_running(cluster, user, low) and "step 3 restart 0" in _log(cluster, user, low, 0),
          "the LOW task steps", 120, 0.5)
    high = _submit(cluster, user, name="high-failover", nodes=3, priority="HIGH",
                   command=[py, "-c", "import time; time.sleep(2); print('high done')"])
    os.kill(_leader_pid(cluster), signal.SIGKILL)
    t0 = time.monotonic()
    done = _poll(lambda: (r := _chain(cluster, user, high).runs[-1]).slurm_state == "COMPLETED" and r,
                 "the HIGH task completes under the new leader", 120, 0.5)
    print(f"failover: HIGH completed {time.monotonic() - t0:.1f} s after the leader was killed")
    assert "high done" in _log(cluster, user, done.id, 0)

    def low_resumed_and_done() -> Any:
        rs = _chain(cluster, user, low).runs
        return rs if len(rs) == 2 and rs[-1].slurm_state == "COMPLETED" else None
    first, second = _poll(low_resumed_and_done, "the LOW task resumes and completes", 240, 1.0)
    assert "INTERRUPT" in first.stop_reasons and second.restart_count == 1, (first, second)
    first_log = _log(cluster, user, low, 0, restart=0)
    saved = re.findall(r"rank 0 saved step (\d+)", first_log)
    assert saved, first_log
    assert _log(cluster, user, low, 0) == _log(cluster, user, second.id, 0), "the chain id names its newest run"
    with pytest.raises(NotFound, match="no run with restart 5"):
        _log(cluster, user, low, 0, restart=5)
    log = _log(cluster, user, second.id, 0)
    assert f"rank 0 start at step {saved[0]} restart 1" in log and "rank 0 done at step 40" in log, log


def test_a_killed_node_agents_task_is_requeued_on_another_node(cluster: LocalCluster) -> None:
    """SIGKILL a node agent: its node goes silent, the scheduler marks it lost after node_timeout_s
    (8 s here) and requeues its run elsewhere (NODE_LOST, restart_count 1).  Last in the file: the
    cluster keeps two nodes afterwards.  (The killed agent's rank keeps running, as a crashed agent
    leaves it for the next agent to adopt; the test ends it.)"""
    import json
    import os
    import signal

    user = cluster.user_token
    code = ("import os, time\nprint('on', os.environ['FF_NODE_NAME'], 'restart', os.environ['FF_RESTART_COUNT'], "
            "flush=True)\ntime.sleep(600)")
    task = _submit(cluster, user, name="survivor", nodes=1, priority="LOW", command=[sys.executable, "-c", code])
    first = _poll(lambda: (r := _chain(cluster, user, task).runs[-1]).ranks and r.ranks[0].state == "running" and r,
                  "the task runs", 60, 0.3)
    victim = first.nodes[0]
    (agent,) = [p for p in cluster.record.processes if p.instance == f"node-{victim.removeprefix('node')}"]
    os.kill(agent.pid, signal.SIGKILL)
    t0 = time.monotonic()
    try:
        def moved() -> Any:
            rs = _chain(cluster, user, task).runs
            return rs if len(rs) == 2 and rs[-1].ranks and rs[-1].ranks[0].state == "running" else None
        runs = _poll(moved, "the task is requeued on another node", 90, 0.5)
        print(f"node loss: requeued and running elsewhere {time.monotonic() - t0:.1f} s after the agent was killed")
        assert "NODE_LOST" in runs[0].stop_reasons and runs[1].restart_count == 1, runs[0]
        assert runs[1].nodes[0] != victim
        assert f"on {runs[1].nodes[0]} restart 1" in _log(cluster, user, runs[1].id, 0)
        nodes = {n.name: n for n in _sched(cluster, cluster.admin_token, lambda c: c.nodes())}
        assert nodes[victim].lost
    finally:
        _sched(cluster, user, lambda c: c.stop(task))
        state = json.loads((cluster.state_dir / "node" / victim / "state.json").read_text())
        for rank in state["tasks"][str(first.id)]["ranks"]:
            try:
                os.killpg(rank["pgid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
