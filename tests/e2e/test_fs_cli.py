"""``ff fs`` end to end: ``ff up`` a cluster with the meta entry of deploy/local.toml, then
the CLI as a user runs it (addresses and tokens from the state dir).

The cluster file is built from deploy/local.toml's own ``meta`` entry (so a change
there is what gets tested) without the services that do not concern ``ff fs``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from fireflyer.cluster.config import load_cluster_config
from fireflyer.fs import MetaClient
from fireflyer.testing.cluster import REPO_ROOT, LocalCluster, run_ff, started_cluster

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def _meta_cluster_toml() -> str:
    cfg = load_cluster_config(REPO_ROOT / "deploy" / "local.toml")
    meta = next(s for s in cfg.service if s.name == "meta")
    assert meta.module == "services.meta" and meta.replicas >= 2
    env = ", ".join(f'{k} = "{v}"' for k, v in meta.env.items())
    return ("[cluster]\nready_timeout_s = 30.0\nstop_timeout_s = 5.0\n\n[nats]\nport = 0\n\n"
            f'[[service]]\nname = "meta"\nmodule = "{meta.module}"\nreplicas = {meta.replicas}\n'
            f"env = {{ {env} }}\n")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with started_cluster(_meta_cluster_toml(), tmp_path / "state") as c:
        yield c


def ff_fs(cluster: LocalCluster, *args: str, role: str = "user"):  # type: ignore[no-untyped-def]
    return run_ff(["fs", *args, "--state-dir", str(cluster.state_dir), "--role", role],
                  env={"FF_TOKEN": "", "FF_META_ADDR": ""})


def ok(res) -> str:  # type: ignore[no-untyped-def]
    assert res.returncode == 0, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    return str(res.stdout)


def test_fs_commands_against_ff_up(cluster: LocalCluster) -> None:
    # / is root's 0755: a user cannot make entries there (EACCES -> exit 1 with errno and path)
    denied = ff_fs(cluster, "mkdir", "/data")
    assert denied.returncode == 1 and "[Errno 13]" in denied.stderr and "/data" in denied.stderr
    assert "you may write under your home /home/" in denied.stderr and "ff fs chown" in denied.stderr
    ok(ff_fs(cluster, "mkdir", "-m", "777", "/data", role="admin"))

    ok(ff_fs(cluster, "mkdir", "-p", "/data/a/b"))
    exists = ff_fs(cluster, "mkdir", "/data/a")
    assert exists.returncode == 1 and "[Errno 17]" in exists.stderr and "/data/a" in exists.stderr
    assert ok(ff_fs(cluster, "ls", "/data")).split() == ["a/"]
    assert ok(ff_fs(cluster, "ls", "/")).split() == ["data/", "home/"]

    async def make_file() -> None:
        async with await MetaClient.connect(cluster.address("meta", 1), cluster.user_token) as m:
            await m.create("/data/a/f.bin")
    asyncio.run(make_file())

    long = ok(ff_fs(cluster, "ls", "-l", "/data/a")).splitlines()
    assert len(long) == 2 and long[0].startswith("drwxr-xr-x") and long[0].endswith(" b")
    assert long[1].startswith("-rw-r--r--") and long[1].endswith(" f.bin")

    text = ok(ff_fs(cluster, "stat", "/data/a/f.bin"))
    assert "type: file" in text and "layout: table 1" in text
    inode = msgspec.json.decode(ok(ff_fs(cluster, "stat", "--json", "/data/a")))
    assert inode["type"] == "dir" and inode["name"] == "a" and inode["uid"] >= 100_000  # the user's uid

    ok(ff_fs(cluster, "mv", "/data/a", "/data/c"))
    assert ok(ff_fs(cluster, "ls", "/data")).split() == ["c/"]
    ok(ff_fs(cluster, "ln", "-s", "/data/c/f.bin", "/data/link"))
    ok(ff_fs(cluster, "ln", "/data/c/f.bin", "/data/hard"))
    lines = ok(ff_fs(cluster, "ls", "-l", "/data")).splitlines()
    assert any(line.startswith("lrwxrwxrwx") and line.endswith("link -> /data/c/f.bin") for line in lines)
    assert json.loads(ok(ff_fs(cluster, "stat", "--json", "/data/hard")))["nlink"] == 2

    missing = ff_fs(cluster, "mv", "/data/nope", "/data/x")
    assert missing.returncode == 1 and "[Errno 2]" in missing.stderr and "/data/nope" in missing.stderr
    ok(ff_fs(cluster, "rm", "/data/link"))
    ok(ff_fs(cluster, "rm", "/data/hard"))
    full = ff_fs(cluster, "rm", "/data/c")
    assert full.returncode == 1 and "[Errno 39]" in full.stderr  # ENOTEMPTY without -r
    ok(ff_fs(cluster, "rm", "-r", "/data/c"))
    assert ok(ff_fs(cluster, "ls", "/data")) == ""


def test_fs_cli_survives_a_killed_meta_replica(cluster: LocalCluster) -> None:
    ok(ff_fs(cluster, "mkdir", "/srv", role="admin"))
    os.kill(next(p.pid for p in cluster.record.processes if p.instance == "meta-0"), signal.SIGKILL)
    for _ in range(3):  # whichever replica round robin picks first, the call lands on meta-1
        assert ok(ff_fs(cluster, "ls", "/")).split() == ["home/", "srv/"]


def test_fs_cli_without_a_cluster_says_what_to_do(tmp_path: Path) -> None:
    res = run_ff(["fs", "ls", "/", "--state-dir", str(tmp_path / "none")], env={"FF_META_ADDR": "", "FF_TOKEN": ""})
    assert res.returncode == 1 and "ff up" in res.stderr


def test_fs_on_the_default_local_cluster(local_cluster: LocalCluster) -> None:
    """deploy/local.toml as shipped (mgmtd, meta, ...): `ff up` then `ff fs` just works."""
    assert {p.instance for p in local_cluster.record.processes} >= {"meta-0", "meta-1"}
    ok(ff_fs(local_cluster, "mkdir", "-p", "/proj/run1", role="admin"))
    assert ok(ff_fs(local_cluster, "ls", "/proj")).split() == ["run1/"]


def test_homes_relative_paths_whoami_chmod_chown(cluster: LocalCluster) -> None:
    user = next(t.user for t in cluster.tokens.tokens if "user" in t.roles)
    home = f"/home/{user}"
    # ff up made the user's home and said so
    assert f"homes: {home}" in cluster.up_output
    assert ok(ff_fs(cluster, "ls", "/home", role="admin")).split() == [f"{user}/"]

    def whoami(*args: str, role: str = "user"):  # type: ignore[no-untyped-def]
        return run_ff(["whoami", *args, "--state-dir", str(cluster.state_dir), "--role", role],
                      env={"FF_TOKEN": "", "FF_META_ADDR": ""})

    assert ok(whoami()).splitlines() == [f"user:  {user}", "roles: user", f"home:  {home}"]
    me = json.loads(ok(whoami("--json")))
    assert (me["user"], me["roles"], me["home"]) == (user, ["user"], home) and me["uid"] >= 100_000
    assert json.loads(ok(whoami("--json", role="admin")))["roles"] == ["admin"]

    # relative paths: under the home
    ok(ff_fs(cluster, "mkdir", "-p", "data/run1"))
    assert ok(ff_fs(cluster, "ls")).split() == ["data/"]  # the home, by default
    assert ok(ff_fs(cluster, "ls", f"{home}/data")).split() == ["run1/"]
    inode = json.loads(ok(ff_fs(cluster, "stat", "--json", "data/run1")))
    assert inode["uid"] == me["uid"] and inode["mode"] == 0o755

    # mkdir -p -m on an existing directory of another mode: EEXIST naming the mode
    clash = ff_fs(cluster, "mkdir", "-p", "-m", "700", "data/run1")
    assert clash.returncode == 1 and "[Errno 17]" in clash.stderr and "mode 0755, not 0700" in clash.stderr
    ok(ff_fs(cluster, "mkdir", "-p", "-m", "755", "data/run1"))  # same mode: fine
    ok(ff_fs(cluster, "mkdir", "-p", "data/run1"))  # no -m: fine

    # chmod by the owner; chown only by an admin
    ok(ff_fs(cluster, "chmod", "700", "data/run1"))
    assert json.loads(ok(ff_fs(cluster, "stat", "--json", "data/run1")))["mode"] == 0o700
    refused = ff_fs(cluster, "chown", "someone", "data")
    assert refused.returncode == 1 and "[Errno 1]" in refused.stderr
    ok(ff_fs(cluster, "chown", "someone", f"{home}/data", role="admin"))
    assert json.loads(ok(ff_fs(cluster, "stat", "--json", "data")))["uid"] != me["uid"]
