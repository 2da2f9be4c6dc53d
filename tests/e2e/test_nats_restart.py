"""Issue 48 point 7 through ``ff up``: NATS killed with -9 during checkpoint commits and restarted
by hand with the command line cluster.json records comes back on the same port; the checkpoint
service finds it again and publishes every commit made meanwhile; ``ff status`` shows it running
and ``ff down`` stops it; the next ``ff up`` on the state dir uses the same port again."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

from fireflyer.ckpt import LocalFS, save
from fireflyer.ckpt.catalog import index_digest
from fireflyer.ckpt.client import CheckpointClient
from fireflyer.ckpt.index import index_name
from fireflyer.ckpt.model import CheckpointCommitted
from fireflyer.cluster.procs import alive, observe
from fireflyer.cluster.records import StatePaths, read_nats_port, read_record
from fireflyer.testing.cluster import LocalCluster, run_ff, started_cluster
from fireflyer.testing.poll import wait_until

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def _toml(local_root: Path) -> str:
    return f"""
[cluster]
ready_timeout_s = 30.0
stop_timeout_s = 5.0

[nats]
port = 0

[[service]]
name = "checkpoint"
module = "services.checkpoint"
env = {{ FF_CHECKPOINT_LOCAL_ROOT = "{local_root}", FF_GRACE_S = "1" }}
"""


def _commit(c: CheckpointClient, fs: LocalFS, job: str, step: int) -> tuple[str, float]:
    rec = c.begin(job, step, 1)
    index = save(fs, rec.directory, {"w": np.full((16,), step, dtype=np.float32)}, rank=0, shard_bytes=1 << 20,
                 align=64)
    digest = index_digest(fs.read_bytes(f"{rec.directory}/{index_name(0)}"))
    t0 = time.monotonic()
    c.commit_shard(rec.id, 0, digest, index.tensor_bytes())
    return rec.id, time.monotonic() - t0


async def _anonymous_refused(url: str) -> bool:
    from fireflyer.bus import Bus
    from fireflyer.core.errors import Unavailable
    from fireflyer.testing.nats import fast_nats_settings

    try:
        bus = await Bus.connect(fast_nats_settings(url), name="e2e-anonymous", wait_s=2.0)
    except Unavailable as e:
        return "refused the credentials" in str(e)
    await bus.close()
    return False


async def _committed(nats_url: str, job: str, expect: int, timeout_s: float,
                     token: str) -> list[CheckpointCommitted]:
    from fireflyer.bus import Bus
    from fireflyer.testing.nats import fast_nats_settings, unique_name

    # the FF_CKPT stream is the services' (docs/nats-auth.md): read it as one
    bus = await Bus.connect(fast_nats_settings(nats_url), name="e2e-reader", token=token)
    try:
        psub = await bus.js.pull_subscribe(f"ff.ckpt.v1.job.{job}.committed", durable=unique_name("r"),
                                           stream="FF_CKPT")
        got: list[CheckpointCommitted] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < expect and time.monotonic() < deadline:
            try:
                msgs = await psub.fetch(16, timeout=1.0)
            except TimeoutError:
                continue
            for m in msgs:
                got.append(msgspec.json.decode(m.data, type=CheckpointCommitted))
                await m.ack()
        return got
    finally:
        await bus.close()


def _nats_row(cluster: LocalCluster) -> dict[str, object]:
    return next(p for p in cluster.status()["processes"] if p["instance"] == "nats")


def test_nats_restarted_by_its_recorded_command_is_found_again(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    local_root = tmp_path / "ckptfs"
    paths = StatePaths(state_dir)
    restarted: subprocess.Popen[bytes] | None = None
    try:
        with started_cluster(_toml(local_root), state_dir) as cluster:
            n = cluster.record.nats
            assert n.managed and n.port == read_nats_port(paths) and n.command and n.pid is not None
            fs = LocalFS(local_root)
            ids: list[str] = []
            with CheckpointClient(cluster.address("checkpoint"), token=cluster.user_token) as c:
                ids.append(_commit(c, fs, "nr", 1)[0])

                os.kill(n.pid, signal.SIGKILL)
                wait_until(lambda: not alive(n.pid, n.start_ticks), timeout_s=10, what="nats gone")
                assert _nats_row(cluster)["state"] == "crashed"
                text = run_ff(["status", "--state-dir", str(state_dir)])
                assert text.returncode == 1 and f"restart nats on {n.url} with:" in text.stdout
                assert f"-p {n.port}" in " ".join(text.stdout.split())
                for step in (2, 3):
                    ckpt_id, took = _commit(c, fs, "nr", step)
                    assert took < 1.5, f"commit {step} waited {took:.1f}s on the dead bus"
                    ids.append(ckpt_id)

                # the user restarts NATS with its recorded command line
                restarted = subprocess.Popen(n.command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, start_new_session=True)
                wait_until(lambda: _nats_row(cluster)["state"] == "running"
                           and _nats_row(cluster)["health"] == "reachable", timeout_s=15, what="nats running again")
                row = _nats_row(cluster)
                assert row["pid"] == restarted.pid and row["address"] == n.url
                # the recorded command line brings back the same users: still no anonymous access
                assert asyncio.run(_anonymous_refused(n.url))
                assert cluster.status()["exit_code"] == 0
                ids.append(_commit(c, fs, "nr", 4)[0])

            events = asyncio.run(_committed(n.url, "nr", expect=len(ids), timeout_s=20.0,
                                            token=cluster.service_token("checkpoint")))
            assert [e.id for e in events] == ids, "every commit published once, in order, after the restart"

            down = cluster.down()
            assert down.returncode == 0, down.stdout + down.stderr
            assert restarted.wait(10) is not None  # ff down stopped the restarted server too
            assert read_record(paths) is None

        # the next ff up on this state dir: the same port again
        with started_cluster(_toml(local_root), state_dir) as again:
            assert again.record.nats.port == n.port and again.record.nats.url == n.url
    finally:
        if restarted is not None and restarted.poll() is None:
            restarted.kill()
            restarted.wait(5)
        run_ff(["down", "--state-dir", str(state_dir)])


def test_live_nats_finds_a_server_restarted_without_its_pid_file(tmp_path: Path) -> None:
    from fireflyer.bus.server import NatsServerProcess
    from fireflyer.cluster.records import NatsRecord
    from fireflyer.cluster.supervisor import live_nats

    first = NatsServerProcess(store_dir=tmp_path / "nats", pid_file=tmp_path / "nats.pid")
    first.start()
    assert first.pid is not None
    seen = observe(first.pid)
    rec = NatsRecord(url=first.url, managed=True, pid=first.pid, start_ticks=seen.start_ticks if seen else None,
                     port=first.port, pid_file=str(tmp_path / "nats.pid"), command=first.command(first.port))
    assert live_nats(rec) == rec
    first.kill()
    assert live_nats(rec) == rec  # nothing runs on the port: unchanged (and not alive)
    assert not alive(rec.pid, rec.start_ticks)
    # restarted by hand without -P (the pid file names the dead process): found by its port
    second = NatsServerProcess(store_dir=tmp_path / "nats", port=first.port, log_file=tmp_path / "n2.log")
    second.start()
    try:
        found = live_nats(rec)
        assert found.pid == second.pid and alive(found.pid, found.start_ticks)
        assert found.port == rec.port and found.url == rec.url
    finally:
        second.stop()
    assert not alive(found.pid, found.start_ticks)
