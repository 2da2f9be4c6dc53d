"""The environment of a task's rank (DESIGN.md §3) and the suspend flag."""

from __future__ import annotations

from pathlib import Path

from fireflyer.node.env import inherited_env, rank_env
from fireflyer.node.model import RankSpec, TaskSpec
from fireflyer.node.suspend import encode_flag, read_flag, suspend_requested


def test_rank_env_sets_ff_torch_and_slurm_variables_over_the_tasks() -> None:
    spec = TaskSpec(task_id="t7", job_id="job", command=("x",), nnodes=3, node_rank=2, restart_count=1,
                    ranks=(RankSpec(rank=4, local_rank=0), RankSpec(rank=5, local_rank=1, env={"R": "1"})),
                    env={"FF_RANK": "999", "T": "t"}, master_port=1234)
    env = rank_env(spec, spec.ranks[1], base={"PATH": "/bin", "T": "base"}, node_name="node2",
                   node_address="127.0.0.3", hfreduce_socket="/s.sock", suspend_file="/f", sched_addr="h:1")
    assert env["PATH"] == "/bin" and env["T"] == "t" and env["R"] == "1"
    # the agent's numbering wins over a task's attempt to set it
    assert env["FF_RANK"] == env["RANK"] == env["SLURM_PROCID"] == "5"
    assert env["FF_WORLD_SIZE"] == env["WORLD_SIZE"] == "6"  # 2 ranks here x 3 nodes
    assert (env["FF_LOCAL_RANK"], env["LOCAL_RANK"], env["FF_LOCAL_WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == \
        ("1", "1", "2", "2")
    assert (env["FF_NODE_RANK"], env["SLURM_NODEID"], env["FF_NNODES"], env["SLURM_NNODES"]) == ("2", "2", "3", "3")
    assert (env["FF_JOB_ID"], env["SLURM_JOB_ID"], env["FF_TASK_ID"]) == ("job", "job", "t7")
    assert (env["FF_RESTART_COUNT"], env["FF_NODE_NAME"], env["FF_SCHED_ADDR"]) == ("1", "node2", "h:1")
    # no master address given: this node's
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.3", "1234")
    assert (env["FF_HFREDUCE_SOCKET"], env["FF_SUSPEND_FILE"]) == ("/s.sock", "/f")


def test_the_agents_credential_never_reaches_a_task() -> None:
    got = inherited_env({"FF_TOKEN": "svc", "FF_AUTH_TOKENS_FILE": "/t", "FF_RPC_PORT": "1", "FF_INSTANCE": "node-0",
                         "FF_AGENT_ZONES": "A", "FF_NATS_URL": "nats://x", "FF_COORD_ADDR": "c:1", "HOME": "/h"})
    assert got == {"FF_NATS_URL": "nats://x", "FF_COORD_ADDR": "c:1", "HOME": "/h"}


def test_suspend_flag_round_trip(tmp_path: Path) -> None:
    flag = tmp_path / "suspend"
    env = {"FF_SUSPEND_FILE": str(flag)}
    assert not suspend_requested(env) and read_flag(flag) is None
    assert not suspend_requested({})  # outside a task: never
    flag.write_bytes(encode_flag("preempted", now=5.0))
    assert suspend_requested(env)
    got = read_flag(flag)
    assert got is not None and got.reason == "preempted" and got.raised_at == 5.0
