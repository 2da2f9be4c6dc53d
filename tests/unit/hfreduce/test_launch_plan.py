"""The pure launch plan: addresses, worker argv, the rank environment, option validation."""

from __future__ import annotations

import socket

import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.hfreduce.launch import exit_code_of
from fireflyer.hfreduce.launch_plan import (
    WORKER_MODULE,
    LaunchOptions,
    coord_note,
    make_plan,
    node_address,
    node_cpus,
    parse_zones,
)


def plan(nodes: int = 2, local: int = 3, **kw):  # type: ignore[no-untyped-def]
    opts = LaunchOptions(nodes=nodes, local_ranks=local, **{k: v for k, v in kw.items() if k in
                                                            ("zones", "chunk_size", "timeout_s", "job_id",
                                                                             "cpu_bind")})
    return make_plan(opts, run_dir="/tmp/ffrun", ports=[5000 + i for i in range(nodes)], master_port=4999,
                     job_id="job-gen", token=kw.get("token"), base_env=kw.get("base_env", {"FF_NATS_URL": "nats://x"}),
                     worker_prefix=kw.get("worker_prefix"), cpus=kw.get("cpus", ()))


def arg(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_node_addresses_are_distinct_loopback_and_bindable() -> None:
    assert [node_address(i) for i in range(3)] == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    # all of 127/8 is loopback on Linux: the launcher relies on binding these
    for i in range(4):
        with socket.create_server((node_address(i), 0)) as s:
            assert s.getsockname()[0] == node_address(i)
    with pytest.raises(InvalidArgument):
        node_address(254)


def test_workers_get_full_peer_list_own_socket_and_options() -> None:
    p = plan(3, 2, zones=("A", "A", "B"), chunk_size="4M", timeout_s=30.0, token="tok")
    peers = "127.0.0.1:5000,127.0.0.2:5001,127.0.0.3:5002"
    assert [n.listen for n in p.nodes] == peers.split(",")
    for i, n in enumerate(p.nodes):
        assert n.argv[1:3] == ("-m", WORKER_MODULE)
        assert arg(n.argv, "--node-rank") == str(i)
        assert arg(n.argv, "--nnodes") == "3"
        assert arg(n.argv, "--local-world-size") == "2"
        assert arg(n.argv, "--peers") == peers
        assert arg(n.argv, "--socket") == n.socket_path == f"/tmp/ffrun/node{i}.sock"
        assert arg(n.argv, "--zones") == "A,A,B"
        assert arg(n.argv, "--chunk-size") == "4M"
        assert arg(n.argv, "--timeout-s") == "30"
        assert arg(n.argv, "--token") == "tok"
        assert arg(n.argv, "--job-id") == "job-gen"
    bare = plan(1, 1, worker_prefix=["py", "stand_in.py"]).nodes[0].argv
    assert bare[:2] == ("py", "stand_in.py")
    assert "--zones" not in bare and "--chunk-size" not in bare and "--token" not in bare


def test_rank_environment_follows_the_contract() -> None:
    p = plan(2, 3)
    assert p.world_size == 6 and [r.rank for r in p.ranks] == list(range(6))
    r = p.ranks[4]  # node 1, local 1
    assert (r.node_rank, r.local_rank) == (1, 1)
    want = {
        "FF_JOB_ID": "job-gen", "FF_RANK": "4", "FF_WORLD_SIZE": "6", "FF_LOCAL_RANK": "1",
        "FF_LOCAL_WORLD_SIZE": "3", "FF_NODE_RANK": "1", "FF_NNODES": "2", "FF_NODE_NAME": "node1",
        "FF_HFREDUCE_SOCKET": "/tmp/ffrun/node1.sock", "FF_RESTART_COUNT": "0",
        "RANK": "4", "WORLD_SIZE": "6", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4999",
        "FF_NATS_URL": "nats://x",  # service addresses pass through
    }
    assert {k: r.env[k] for k in want} == want
    assert {x.env["FF_HFREDUCE_SOCKET"] for x in p.ranks[:3]} == {"/tmp/ffrun/node0.sock"}


def test_given_job_id_wins_and_rank_vars_override_inherited_ones() -> None:
    p = plan(1, 2, job_id="mine", base_env={"RANK": "99", "FF_RANK": "99"})
    assert {r.env["FF_JOB_ID"] for r in p.ranks} == {"mine"}
    assert [r.env["RANK"] for r in p.ranks] == ["0", "1"]
    assert "--job-id" in p.nodes[0].argv and arg(p.nodes[0].argv, "--job-id") == "mine"


def test_zone_count_must_match_nodes() -> None:
    assert parse_zones("A,A,B", 3) == ("A", "A", "B")
    assert parse_zones(None, 3) is None
    with pytest.raises(InvalidArgument) as e:
        parse_zones("A,B", 3)
    assert "2 zone(s)" in str(e.value) and "--nodes is 3" in str(e.value)
    with pytest.raises(InvalidArgument, match="empty zone"):
        parse_zones("A,,B", 3)
    with pytest.raises(InvalidArgument, match="--nodes is 2"):
        plan(2, 1, zones=("A",))


@pytest.mark.parametrize("kw, match", [
    ({"nodes": 0}, "--nodes"), ({"nodes": 255}, "--nodes"), ({"local": 0}, "--local-ranks"),
    ({"chunk_size": "lots"}, "--chunk-size: expected a size"), ({"chunk_size": "0"}, "positive"), ({"timeout_s": 0.0}, "positive"),
    ({"cpu_bind": "socket"}, "--cpu-bind must be one of node, none"),
])
def test_bad_options_are_rejected(kw: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidArgument, match=match):
        plan(**kw)


def test_node_cpus_split_the_allowed_cpus_and_bind_nothing_when_nodes_outnumber_them() -> None:
    assert node_cpus(2, [0, 1]) == [(0,), (1,)]
    # contiguous shares, sizes differing by at most one; the order of the mask does not matter
    assert node_cpus(3, [7, 0, 1, 2, 3, 4, 5, 6]) == [(0, 1, 2), (3, 4, 5), (6, 7)]
    assert node_cpus(2, [2, 3, 8, 9, 10]) == [(2, 3, 8), (9, 10)]
    # more nodes than CPUs (they would share CPUs anyway), or nothing to split: no binding
    assert node_cpus(5, [0, 1]) == [None] * 5 and node_cpus(3, [5]) == [None, None, None]
    assert node_cpus(1, [0, 1, 2, 3]) == [None]
    for n in range(1, 20):
        for ncpu in range(1, 12):
            shares = node_cpus(n, list(range(ncpu)))
            assert len(shares) == n
            if n == 1 or n > ncpu:
                assert shares == [None] * n
            else:  # a partition of every allowed CPU
                flat = [c for s in shares for c in s]  # type: ignore[union-attr]
                assert sorted(flat) == list(range(ncpu)) and len(set(flat)) == ncpu
                assert max(map(len, shares)) - min(map(len, shares)) <= 1  # type: ignore[arg-type]


def test_plan_binds_nodes_only_when_asked_and_given_cpus() -> None:
    bound = plan(2, 1, cpus=[0, 1])
    assert [n.cpus for n in bound.nodes] == [(0,), (1,)]
    assert [n.cpus for n in plan(2, 1, cpus=[0, 1], cpu_bind="none").nodes] == [None, None]
    assert [n.cpus for n in plan(2, 1).nodes] == [None, None]  # the platform could not say


def test_socket_path_too_long_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgument, match="shorter --run-dir"):
        make_plan(LaunchOptions(nodes=1, local_ranks=1), run_dir="/tmp/" + "x" * 120, ports=[1],
                  master_port=2, job_id="j")


def test_coord_note_only_when_set() -> None:
    assert coord_note({}) is None
    note = coord_note({"FF_COORD_ADDR": "127.0.0.1:7000"})
    assert note is not None and "coordination service at 127.0.0.1:7000" in note


def test_exit_codes() -> None:
    assert exit_code_of(3) == 3 and exit_code_of(-9) == 137 and exit_code_of(0) == 0
