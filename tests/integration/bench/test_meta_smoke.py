"""``ff bench meta`` runs end to end and prints the figures it promises (tiny counts)."""

from __future__ import annotations

import msgspec
import pytest

from fireflyer.testing.cluster import run_ff


@pytest.mark.slow
def test_bench_meta_prints_one_json_object() -> None:
    res = run_ff(["bench", "meta", "--clients", "2", "--count", "20", "--ops", "create,stat,rename,readdir,unlink",
                  "--json", "--client-procs", "1", "--transport", "both"], env={"FF_TEST_PG_DSN": ""}, timeout_s=120)
    assert res.returncode == 0, res.stderr
    doc = msgspec.json.decode(res.stdout)
    sqlite = doc["backends"]["sqlite"]
    ops = ["create", "stat", "rename", "readdir", "unlink"]
    assert set(sqlite["ops_per_s"]) == set(ops) and all(v > 0 for v in sqlite["ops_per_s"].values())
    assert set(doc["anchor"]["ops_per_s"]) == set(ops)
    assert set(sqlite["ratio_to_local_fs"]) == set(ops)
    assert sqlite["store_direct"]["ops_per_s"]["create"] > 0
    assert doc["goal"]["target"] == 2000 and doc["goal"]["measured"] == sqlite["creates_stats_per_s"]
    assert doc["cpu_count"] >= 1 and "git_sha" in doc and "postgres" not in doc["backends"]
    # the set-up is part of the figure: two replicas (as deploy/local.toml), one client process as asked
    assert (doc["replicas"], doc["client_processes"]) == (2, 1)
    assert (sqlite["replicas"], sqlite["client_processes"]) == (2, 1)
    # the clients used the replicas' wire endpoints, and the same run measured gRPC alone
    assert doc["transport"] == "both" and sqlite["transport"] == "wire"
    assert sqlite["grpc"]["transport"] == "grpc" and set(sqlite["grpc"]["ops_per_s"]) == set(ops)


def test_default_client_processes_carry_four_clients_each() -> None:
    from fireflyer.bench.meta import default_client_procs

    assert [default_client_procs(n) for n in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
