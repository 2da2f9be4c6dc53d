"""A real local cluster for tests: ``ff up`` on a temp state dir, ``ff down`` after.

    def test_echo(local_cluster):
        addr = local_cluster.address("echo")
        token = local_cluster.user_token

    with started_cluster(CLUSTER_TOML, tmp_path / "state") as cluster:
        ...

Both run the real ``ff`` command as a subprocess, so the test sees exactly
what a user does (start-up reporting, detached processes, cluster.json).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fireflyer.cluster.records import ClusterRecord, StatePaths, TokensFile, read_record, read_tokens
from fireflyer.core.errors import FailedPrecondition

__all__ = ["FF", "run_ff", "LocalCluster", "started_cluster", "local_cluster", "REPO_ROOT"]



#: how tests invoke ``ff``
FF = [sys.executable, "-m", "fireflyer.cli.main"]
REPO_ROOT = Path(__file__).resolve().parents[3]


def run_ff(args: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
           timeout_s: float = 90.0) -> subprocess.CompletedProcess[str]:
    """Run ``ff <args>``; stdout and stderr captured as text.  ``env`` adds to os.environ."""
    full_env = dict(os.environ)
    # a developer's own cluster settings must not leak into a test's
    for key in ("FF_STATE_DIR", "FF_NATS_URL"):
        full_env.pop(key, None)
    full_env.update(env or {})
    return subprocess.run([*FF, *args], env=full_env, cwd=cwd or REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout_s, check=False)


class LocalCluster:
    """A running cluster started by ``ff up``: its record, tokens and addresses."""

    def __init__(self, state_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self.env = dict(env or {})
        record = read_record(StatePaths(state_dir))
        if record is None:
            raise FailedPrecondition(f"no cluster.json in {state_dir}", state_dir=str(state_dir))
        self.record: ClusterRecord = record
        self.tokens: TokensFile = read_tokens(Path(record.tokens_file))
        #: what ``ff up`` printed (set by ``started_cluster``)
        self.up_output = ""

    @property
    def nats_url(self) -> str:
        return self.record.nats.url

    @property
    def admin_token(self) -> str:
        entry = self.tokens.for_role("admin")
        assert entry is not None
        return entry.token

    @property
    def user_token(self) -> str:
        entry = self.tokens.for_role("user")
        assert entry is not None
        return entry.token

    def service_token(self, name: str = "storage") -> str:
        """The credential ``ff up`` gave service ``name``'s processes (user ``svc-<name>``, role service)."""
        entry = self.tokens.for_service(name)
        assert entry is not None, f"no service credential for {name!r} in {self.record.tokens_file}"
        return entry.token

    def address(self, name: str, replica: int = 0) -> str:
        for p in self.record.processes:
            if p.instance == f"{name}-{replica}":
                return p.address
        raise KeyError(f"no instance {name}-{replica} in {[p.instance for p in self.record.processes]}")

    def status(self) -> dict[str, Any]:
        """``ff status --json`` as a dict (its exit code under ``"exit_code"``)."""
        res = run_ff(["status", "--state-dir", str(self.state_dir), "--json"], env=self.env)
        doc: dict[str, Any] = msgspec.json.decode(res.stdout)
        doc["exit_code"] = res.returncode
        return doc

    def addresses(self, name: str) -> list[str]:
        """Every instance's address of service ``name``, in instance order."""
        return [p.address for p in self.record.processes if p.name == name]

    def wait_chains_serving(self, count: int, *, timeout_s: float = 30.0) -> None:
        """Block until mgmtd's routing shows ``count`` chains with every target SERVING
        (a fresh cluster serves data a little after ``ff up`` returns)."""
        from fireflyer.storage.serving import wait_chains_serving

        wait_chains_serving(self.addresses("mgmtd"), self.admin_token, count=count, timeout_s=timeout_s)

    def down(self, timeout_s: float = 10.0) -> subprocess.CompletedProcess[str]:
        return run_ff(["down", "--state-dir", str(self.state_dir), "--timeout", str(timeout_s)], env=self.env)


@contextlib.contextmanager
def started_cluster(config: str | Path, state_dir: Path, *, env: Mapping[str, str] | None = None
                    ) -> Iterator[LocalCluster]:
    """``ff up`` with ``config`` (a path, or TOML text written next to the state dir); ``ff down`` after."""
    if isinstance(config, str) and "\n" in config:
        path = state_dir.parent / f"{state_dir.name}-cluster.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config)
    else:
        path = Path(config)
    res = run_ff(["up", "--config", str(path), "--state-dir", str(state_dir)], env=env)
    if res.returncode != 0:
        raise FailedPrecondition(f"ff up failed ({res.returncode}):\n{res.stdout}\n{res.stderr}",
                                 state_dir=str(state_dir))
    cluster = LocalCluster(state_dir, env)
    cluster.up_output = res.stdout
    try:
        yield cluster
    finally:
        res = cluster.down()
        if res.returncode != 0:
            raise FailedPrecondition(f"ff down failed ({res.returncode}):\n{res.stdout}\n{res.stderr}",
                                     state_dir=str(state_dir))


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """The default cluster (deploy/local.toml) on a temp state dir."""
    with started_cluster(REPO_ROOT / "deploy" / "local.toml", tmp_path / "ff-state") as cluster:
        yield cluster
