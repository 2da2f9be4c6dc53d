"""``ff up`` / ``ff status`` / ``ff down`` as a user runs them: the real CLI, real processes.

Each test has its own state dir; no fixed ports; waits poll with deadlines.
Whether a process is gone is checked by scanning /proc for anything that still
carries the test's state dir (services have it in FF_STATE_DIR, nats in its
command line), so a leak is caught even when cluster.json is already removed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from fireflyer.bus.server import NatsServerProcess
from fireflyer.cluster.procs import observe
from fireflyer.cluster.records import StatePaths, read_record
from fireflyer.testing.cluster import LocalCluster, run_ff, started_cluster
from fireflyer.testing.crasher import CRASH_MESSAGE
from fireflyer.testing.poll import wait_until

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

#: a service that serves gRPC health (the diagnostic service every deployment runs)
SERVICE = "fireflyer.testing.echo"


def _toml(*services: str, nats: str = "port = 0", ready_timeout_s: float = 20.0) -> str:
    return (f"[cluster]\nready_timeout_s = {ready_timeout_s}\nstop_timeout_s = 5.0\n\n[nats]\n{nats}\n\n"
            + "\n".join(services))


def _service(name: str, module: str = SERVICE, replicas: int = 1, args: str = "[]") -> str:
    return f'[[service]]\nname = "{name}"\nmodule = "{module}"\nreplicas = {replicas}\nargs = {args}\n'


def _procs_of(state_dir: Path) -> list[int]:
    """Live (non-zombie) pids whose environment or command line names ``state_dir``."""
    needle = str(state_dir.absolute()).encode()
    me = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            blob = (entry / "environ").read_bytes() + (entry / "cmdline").read_bytes()
        except OSError:
            continue
        seen = observe(int(entry.name))
        if needle in blob and seen is not None and not seen.zombie:
            out.append(int(entry.name))
    return out


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "state"
    yield d
    # whatever a test left behind, no process of it may outlive it
    leftover = _procs_of(d)
    if leftover:
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"processes left running for {d}: {leftover}")


def _up(config: str, state_dir: Path, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    path = state_dir.parent / "cluster.toml"
    path.write_text(config)
    return run_ff(["up", "--config", str(path), "--state-dir", str(state_dir)], env=env)


def test_up_status_refuse_down(state_dir: Path) -> None:
    res = _up(_toml(_service("echo", replicas=2)), state_dir)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "echo-0" in res.stdout and "echo-1" in res.stdout

    cluster = LocalCluster(state_dir)
    rec = cluster.record
    assert rec.nats.managed and rec.nats.pid and [p.instance for p in rec.processes] == ["echo-0", "echo-1"]
    paths = StatePaths(state_dir)
    assert stat.S_IMODE(paths.tokens.stat().st_mode) == 0o600
    assert (paths.nats_store / "jetstream").is_dir()  # JetStream store under the state dir
    env = _environ(rec.processes[1].pid)
    # each service runs with its own credential (svc-echo, role service), not the admin token
    assert env["FF_INSTANCE"] == "echo-1" and env["FF_TOKEN"] == cluster.service_token("echo")
    assert env["FF_TOKEN"] != cluster.admin_token
    assert env["FF_RPC_PORT"] == rec.processes[1].address.rsplit(":", 1)[1]
    assert env["FF_NATS_URL"] == rec.nats.url and env["FF_STATE_DIR"] == str(state_dir.absolute())
    assert env["FF_TELEMETRY_SPAN_FILE"] == str(paths.spans)

    status = cluster.status()
    assert status["exit_code"] == 0 and status["healthy"]
    assert {(p["instance"], p["state"], p["health"]) for p in status["processes"]} == {
        ("nats", "running", "reachable"), ("echo-0", "running", "SERVING"), ("echo-1", "running", "SERVING")}
    text = run_ff(["status", "--state-dir", str(state_dir)])
    assert text.returncode == 0 and "SERVING" in text.stdout

    again = _up(_toml(_service("echo")), state_dir)
    assert again.returncode == 1
    assert "already running" in again.stderr and str(state_dir.absolute()) in again.stderr
    assert "ff down" in again.stderr
    assert read_record(paths) == rec  # the running cluster's record is untouched

    down = cluster.down()
    assert down.returncode == 0, down.stdout + down.stderr
    assert down.stdout.count("stopped") >= 3
    assert _procs_of(state_dir) == []
    assert read_record(paths) is None
    assert paths.log_for("echo-0").exists()  # logs are kept

    assert run_ff(["status", "--state-dir", str(state_dir)]).returncode == 1
    assert run_ff(["down", "--state-dir", str(state_dir)]).returncode == 0  # nothing to stop: fine


def test_crash_at_start_is_reported_and_the_rest_stopped(state_dir: Path) -> None:
    config = _toml(_service("echo"), _service("crasher", module="fireflyer.testing.crasher", args='["--lines", "30"]'))
    res = _up(config, state_dir)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "crasher-0 exited with code 3 during start-up" in out
    assert CRASH_MESSAGE in out  # the tail of its log
    assert "start-up step 29" in out and "start-up step 5\n" not in out  # ~20 lines, not the whole log
    assert _procs_of(state_dir) == []  # echo and nats were stopped
    assert "echo-0" in out and "nats" in out and "stopped" in out
    assert read_record(StatePaths(state_dir)) is None


def test_not_healthy_by_deadline(state_dir: Path) -> None:
    config = _toml(_service("stuck", module="fireflyer.testing.crasher", args='["--hang"]'), ready_timeout_s=1.0)
    res = _up(config, state_dir)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "stuck-0 not healthy after 1s" in out and "hanging in start-up" in out
    assert _procs_of(state_dir) == []


def test_nats_that_cannot_start_fails_up(state_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        res = _up(_toml(_service("echo"), nats=f"port = {busy.getsockname()[1]}"), state_dir)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "nats-server exited" in out and "address already in use" in out
    assert _procs_of(state_dir) == [] and read_record(StatePaths(state_dir)) is None


def test_killed_service_shows_as_crashed(state_dir: Path) -> None:
    with started_cluster(_toml(_service("echo", replicas=2)), state_dir) as cluster:
        victim = cluster.record.processes[0]
        os.kill(victim.pid, signal.SIGKILL)
        wait_until(lambda: cluster.status()["exit_code"] == 1, timeout_s=10, what="status to notice the kill")
        rows = {p["instance"]: p for p in cluster.status()["processes"]}
        assert rows["echo-0"]["state"] == "crashed" and rows["echo-0"]["log_tail"]
        assert rows["echo-1"]["health"] == "SERVING"
        text = run_ff(["status", "--state-dir", str(state_dir)])
        assert text.returncode == 1
        assert "crashed" in text.stdout and f"last lines of {victim.log}" in text.stdout

        # up refuses while the others run; down then reports the dead one as such
        assert _up(_toml(_service("echo")), state_dir).returncode == 1
    # (started_cluster ran ff down)
    assert _procs_of(state_dir) == []


def test_stale_record_is_replaced(state_dir: Path) -> None:
    res = _up(_toml(_service("echo")), state_dir)
    assert res.returncode == 0, res.stdout + res.stderr
    for pid in _procs_of(state_dir):
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: _procs_of(state_dir) == [], timeout_s=10, what="cluster killed")
    res = _up(_toml(_service("echo")), state_dir)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "stale" in res.stdout
    assert run_ff(["down", "--state-dir", str(state_dir)]).returncode == 0


def test_external_nats_from_env(state_dir: Path, tmp_path: Path) -> None:
    with NatsServerProcess(store_dir=tmp_path / "external-nats") as nats:
        res = _up(_toml(_service("echo")), state_dir, env={"FF_NATS_URL": nats.url})
        assert res.returncode == 0, res.stdout + res.stderr
        rec = read_record(StatePaths(state_dir))
        assert rec is not None and not rec.nats.managed and rec.nats.url == nats.url
        assert not (StatePaths(state_dir).nats_store / "jetstream").exists()  # no server of our own
        assert _environ(rec.processes[0].pid)["FF_NATS_URL"] == nats.url
        status = msgspec.json.decode(run_ff(["status", "--state-dir", str(state_dir), "--json"]).stdout)
        assert status["healthy"] and status["processes"][0]["state"] == "external"
        down = run_ff(["down", "--state-dir", str(state_dir)])
        assert down.returncode == 0 and "external" in down.stdout
        assert nats.is_running()  # not ours to stop


def test_local_cluster_fixture(local_cluster: LocalCluster) -> None:
    # the default cluster file, as `make up` runs it
    status = local_cluster.status()
    assert status["healthy"]
    assert local_cluster.address("echo").startswith("127.0.0.1:")
    # one node agent per simulated machine, with ff launch's names, addresses and zones A, A, B
    assert {(p["instance"], p["health"]) for p in status["processes"] if p["name"] == "node"} == {
        ("node-0", "SERVING"), ("node-1", "SERVING"), ("node-2", "SERVING")}
    labels, pid = asyncio.run(_node_agents(local_cluster))
    assert labels == [("node0", "A", "127.0.0.1"), ("node1", "A", "127.0.0.2"), ("node2", "B", "127.0.0.3")]
    # `ff down` stops the agents, and each agent the tasks it runs: nothing is left behind
    assert local_cluster.down().returncode == 0
    wait_until(lambda: observe(pid) is None or observe(pid).zombie, timeout_s=10,  # type: ignore[union-attr]
               what="the task's rank stopped by ff down")


async def _node_agents(cluster: LocalCluster) -> tuple[list[tuple[str, str, str]], int]:
    """Every agent's labels, and the pid of a rank started on node0 (with the agents' service credential)."""
    import sys

    from fireflyer.api.node.v1 import node_pb2 as pb
    from fireflyer.api.node.v1 import node_pb2_grpc as pb_grpc
    from fireflyer.rpc import connect

    labels = []
    for address in cluster.addresses("node"):
        async with connect(address, token=cluster.user_token) as ch:
            got = (await pb_grpc.NodeAgentStub(ch).Describe(pb.DescribeRequest())).labels
            labels.append((got.name, got.zone, got.address))
    async with connect(cluster.addresses("node")[0], token=cluster.service_token("node")) as ch:
        reply = await pb_grpc.NodeAgentStub(ch).StartTask(pb.StartTaskRequest(
            task_id="e2e", command=[sys.executable, "-c", "import time; time.sleep(600)"], grace_s=2.0,
            ranks=[pb.Rank(rank=0)]))
    return labels, reply.task.ranks[0].pid
