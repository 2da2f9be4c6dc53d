"""``ff up`` with mgmtd, then ``ff admin`` as an operator runs it: set up chains, inspect, offline a target.

Two mgmtd replicas (the lease is real); the fake storage nodes are not needed: the
admin names each target's node.  A user (non-admin) token is refused with
PERMISSION_DENIED; a bad argument with INVALID_ARGUMENT, and nothing changes.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from fireflyer.mgmt.model import Chain, ChainTable, RoutingInfo
from fireflyer.testing.cluster import LocalCluster, run_ff, started_cluster

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

CLUSTER = """
[cluster]
ready_timeout_s = 30.0
stop_timeout_s = 5.0

[nats]
port = 0

[[service]]
name = "mgmtd"
module = "services.mgmtd"
replicas = 2
env = { FF_MGMTD_LEASE_S = "2", FF_MGMTD_RENEW_S = "0.5", FF_MGMTD_STEP_DOWN_MARGIN_S = "0.5" }
"""


def _admin(cluster: LocalCluster, *args: str, token: str | None = None):
    extra = ["--token", token] if token else []
    return run_ff(["admin", "--state-dir", str(cluster.state_dir), *extra, *args], env=cluster.env, timeout_s=60)


def _ok(res) -> str:
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_ff_admin_against_a_running_cluster(tmp_path: Path) -> None:
    with started_cluster(CLUSTER, tmp_path / "state") as cluster:
        _ok(_admin(cluster, "primary"))  # answers once a replica holds the lease (writes wait for one)
        out = _ok(_admin(cluster, "init-chains", "--replicas", "3", "--table-id", "1",
                         "--targets", "101@storage-1,102@storage-2,103@storage-3,"
                                      "104@storage-2,105@storage-3,106@storage-1"))
        assert "routing version" in out

        chains = msgspec.json.decode(_ok(_admin(cluster, "--json", "chains")), type=list[Chain])
        assert [(c.chain_id, c.target_ids) for c in chains] == [(1, (101, 102, 103)), (2, (104, 105, 106))]
        out = _ok(_admin(cluster, "create-chain-table", "--table-id", "2", "--chains", "2,1", "--desc", "swapped"))
        assert "swapped" in out
        tables = msgspec.json.decode(_ok(_admin(cluster, "--json", "chain-tables")), type=list[ChainTable])
        assert [(t.table_id, t.version, t.chain_ids) for t in tables] == [(1, 1, (1, 2)), (2, 1, (2, 1))]

        before = msgspec.json.decode(_ok(_admin(cluster, "--json", "routing")), type=RoutingInfo)
        chain = msgspec.json.decode(_ok(_admin(cluster, "--json", "offline-target", "101")), type=Chain)
        assert chain.target_ids == (102, 103, 101) and chain.version == 2
        after = msgspec.json.decode(_ok(_admin(cluster, "--json", "routing")), type=RoutingInfo)
        assert after.version == before.version + 1
        rows = {line.split()[0]: line.split() for line in _ok(_admin(cluster, "targets")).splitlines()[1:]}
        assert rows["101"][3] == "offline" and rows["102"][3] == "serving"  # PUBLIC column

        # a user token may read but not change anything
        _ok(_admin(cluster, "chains", token=cluster.user_token))
        res = _admin(cluster, "create-chain-table", "--table-id", "3", "--chains", "1", token=cluster.user_token)
        assert res.returncode == 1 and "PERMISSION_DENIED" in res.stderr, res.stdout + res.stderr
        res = _admin(cluster, "offline-target", "102", token=cluster.user_token)
        assert res.returncode == 1 and "PERMISSION_DENIED" in res.stderr

        # bad input is refused and nothing is written
        res = _admin(cluster, "create-chain", "--chain-id", "3", "--targets", "107@storage-1,107@storage-2")
        assert res.returncode == 1 and "INVALID_ARGUMENT" in res.stderr, res.stdout + res.stderr
        res = _admin(cluster, "create-chain-table", "--table-id", "3", "--chains", "9")
        assert res.returncode == 1 and "NOT_FOUND" in res.stderr
        final = msgspec.json.decode(_ok(_admin(cluster, "--json", "routing")), type=RoutingInfo)
        assert final.version == after.version
