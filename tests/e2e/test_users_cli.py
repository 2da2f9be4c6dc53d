"""``ff admin users`` against a running cluster: a user added with ``ff admin users add`` is
accepted by meta (gRPC and its wire endpoint, through ``ff whoami``), mgmtd and the checkpoint
service within seconds, without a restart; once revoked, and once expired, it is refused
saying so.  Every wait polls with a deadline."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fireflyer.core.errors import Unauthenticated
from fireflyer.fs import connect
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
replicas = 1
env = { FF_GRACE_S = "1" }

[[service]]
name = "meta"
module = "services.meta"
replicas = 1
env = { FF_GRACE_S = "1" }

[[service]]
name = "checkpoint"
module = "services.checkpoint"
replicas = 1
env = { FF_GRACE_S = "1" }
"""

#: services check the tokens file at most once a second; a few seconds covers a slow CI box
WITHIN_S = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(CLUSTER, tmp_path_factory.mktemp("users") / "state") as c:
        yield c


def _ff(cluster: LocalCluster, *args: str, token: str | None = None):
    env = dict(cluster.env)
    if token is not None:
        env["FF_TOKEN"] = token
    return run_ff(list(args), env=env, timeout_s=60)


def _users(cluster: LocalCluster, *args: str):
    return _ff(cluster, "admin", "--state-dir", str(cluster.state_dir), "users", *args)


def _poll(check: Callable[[], tuple[bool, str]], what: str, timeout_s: float = WITHIN_S) -> float:
    """Run ``check`` until it says done; the seconds it took.  Fails naming the last output."""
    start = time.monotonic()
    while True:
        done, last = check()
        if done:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s}s: {what}; last output:\n{last}")
        time.sleep(0.2)


def _calls(cluster: LocalCluster, token: str) -> dict[str, object]:
    sd = str(cluster.state_dir)
    return {
        "meta": _ff(cluster, "whoami", "--state-dir", sd, "--json", token=token),
        "mgmtd": _ff(cluster, "admin", "--state-dir", sd, "--json", "primary", token=token),
        "checkpoint": _ff(cluster, "ckpt", "--state-dir", sd, "jobs", token=token),
    }


def test_added_user_works_at_once_and_revoked_or_expired_ones_are_refused(cluster: LocalCluster) -> None:
    res = _users(cluster, "add", "bob")
    assert res.returncode == 0, res.stdout + res.stderr
    token = res.stdout.splitlines()[1].strip()
    assert token.startswith("fft_")

    def bob_accepted() -> tuple[bool, str]:
        res = _ff(cluster, "whoami", "--state-dir", str(cluster.state_dir), "--json", token=token)
        return res.returncode == 0, res.stdout + res.stderr

    took = _poll(bob_accepted, "meta accepts the added user")
    results = _calls(cluster, token)
    for name, r in results.items():
        assert r.returncode == 0, f"{name}: {r.stdout}{r.stderr}"
    me = json.loads(results["meta"].stdout)
    assert me["user"] == "bob" and me["home"] == "/home/bob", me
    print(f"bob accepted after {took:.1f}s")

    ls = _users(cluster, "ls", "--json")
    assert ls.returncode == 0 and token not in ls.stdout
    assert [r["state"] for r in json.loads(ls.stdout) if r["user"] == "bob"] == ["active"]

    # a connection opened before the revocation (meta's wire endpoint, as fireflyer.fs uses it)
    fs = connect(state_dir=cluster.state_dir, token=token)
    fs.stat("/home/bob")  # answered over the open connection

    assert _users(cluster, "revoke", "bob").returncode == 0

    def bob_refused_everywhere() -> tuple[bool, str]:
        results = _calls(cluster, token)
        out = "\n".join(f"{n}: rc={r.returncode} {r.stdout}{r.stderr}" for n, r in results.items())
        return all(r.returncode != 0 and "revoked" in r.stderr for r in results.values()), out

    took = _poll(bob_refused_everywhere, "meta, mgmtd and checkpoint refuse the revoked user")
    print(f"bob refused after {took:.1f}s")

    def open_connection_refused() -> tuple[bool, str]:
        try:
            fs.stat("/home/bob")
        except Unauthenticated as e:
            return "revoked" in str(e), str(e)
        return False, "stat still answered"

    try:
        _poll(open_connection_refused, "the connection opened before the revocation refuses bob")
    finally:
        fs.close()

    # an expired token: added with a 3 s life, accepted, then refused saying it expired
    res = _users(cluster, "add", "erin", "--expires-in", "3s")
    assert res.returncode == 0, res.stdout + res.stderr
    erin = res.stdout.splitlines()[1].strip()

    def erin_expired() -> tuple[bool, str]:
        res = _ff(cluster, "whoami", "--state-dir", str(cluster.state_dir), token=erin)
        return res.returncode != 0 and "expired" in res.stderr, res.stdout + res.stderr

    _poll(erin_expired, "meta refuses the expired token")
    rows = json.loads(_users(cluster, "ls", "--json").stdout)
    assert {r["user"]: r["state"] for r in rows}["erin"] == "expired"

    # the cluster's own tokens still work, and bob can be added again with a new token
    assert _ff(cluster, "whoami", "--state-dir", str(cluster.state_dir), token=cluster.user_token).returncode == 0
    res = _users(cluster, "add", "bob")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[1].strip() != token
