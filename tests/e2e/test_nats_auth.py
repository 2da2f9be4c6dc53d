"""NATS has credentials on an ``ff up`` cluster (issue 48 point 4, docs/nats-auth.md).

Against the real nats-server ``ff up`` started: no anonymous client gets in; a user's token may use
only its own namespace (no ``>``, no JetStream API, so no look at the checkpoint stream FF_CKPT); a
service's token may do everything; ``ff admin users add|revoke`` changes who may connect within
seconds; and a user's ``ff launch`` job with HFReduce still rendezvouses through coord, its workers'
telemetry reaching coord from the user's namespace.  Every wait polls with a deadline."""

from __future__ import annotations

import asyncio
import re
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest

from fireflyer.bus.auth import nats_credentials
from fireflyer.bus.subjects import owned, subject
from fireflyer.coord import CoordClient
from fireflyer.testing.cluster import LocalCluster, run_ff, started_cluster
from fireflyer.testing.poll import wait_for

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

CLUSTER = """
[cluster]
ready_timeout_s = 30.0
stop_timeout_s = 5.0

[nats]
port = 0

[[service]]
name = "coord"
module = "services.coord"
replicas = 1

[[service]]
name = "checkpoint"
module = "services.checkpoint"
replicas = 1
env = { FF_CHECKPOINT_LOCAL_ROOT = "@ROOT@", FF_GRACE_S = "1" }
"""

WITHIN_S = 10.0

RANKS = textwrap.dedent("""
    import os, numpy as np
    from fireflyer import hfreduce
    comm = hfreduce.init(timeout_s=30)
    r, n = int(os.environ["FF_RANK"]), int(os.environ["FF_WORLD_SIZE"])
    x = comm.empty(1024, np.float32)
    for _ in range(8):
        x[:] = r + 1
        comm.allreduce(x)
        assert np.all(x == n * (n + 1) / 2), x[:4]
    comm.barrier(); comm.close()
    print("rank", r, "done", flush=True)
""")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base = tmp_path_factory.mktemp("natsauth")
    with started_cluster(CLUSTER.replace("@ROOT@", str(base / "ckpt")), base / "state") as c:
        yield c


class Conn:
    """A raw nats-py connection that keeps the server's asynchronous errors (permission violations)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: Any = None

    async def open(self, url: str, token: str | None) -> Conn:
        async def on_error(e: Exception) -> None:
            self.errors.append(str(e))

        auth: dict[str, Any] = {}
        if token is not None:
            c = nats_credentials(token)
            auth = {"user": c.user, "password": c.password, "inbox_prefix": c.inbox_prefix}
        self.nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2,
                                     error_cb=on_error, **auth)
        return self

    async def violations(self, what: str, timeout_s: float = 5.0) -> list[str]:
        await wait_for(lambda: any(what in e for e in self.errors), timeout_s=timeout_s,
                       what=f"a permissions violation for {what}")
        return self.errors


async def _connect(url: str, token: str | None) -> Conn:
    return await Conn().open(url, token)


async def _refused(url: str, token: str | None) -> str:
    try:
        c = await _connect(url, token)
    except (nats.errors.Error, OSError, TimeoutError) as e:
        return str(e)
    await c.nc.close()
    raise AssertionError("the connection was accepted")


def test_anonymous_and_unknown_clients_are_refused(cluster: LocalCluster) -> None:
    assert "Authorization Violation" in asyncio.run(_refused(cluster.nats_url, None))
    assert "Authorization Violation" in asyncio.run(_refused(cluster.nats_url, "not-a-token-of-this-cluster"))
    conf = cluster.state_dir / "nats-auth.conf"
    assert conf.stat().st_mode & 0o777 == 0o600
    text = conf.read_text()
    assert cluster.user_token not in text and "$2b$" in text  # bcrypt hashes, never a token


def test_a_user_uses_its_own_namespace_only(cluster: LocalCluster) -> None:
    user = cluster.tokens.for_role("user")
    assert user is not None

    async def go() -> None:
        c = await _connect(cluster.nats_url, cluster.user_token)
        try:
            # its own subjects: publish and receive
            mine = owned(user.user, subject("coord", "comm", "j1-main", "telemetry"))
            sub = await c.nc.subscribe(mine)
            await c.nc.publish(mine, b"x")
            assert (await sub.next_msg(timeout=5)).data == b"x"
            # everything: refused
            await c.nc.subscribe(">")
            await c.nc.flush()
            await c.violations('subscription to ">"')
            # the cluster's own subjects and another user's namespace: refused
            await c.nc.subscribe(subject("node", "node", "n3", "heartbeat"))
            await c.nc.publish(owned("someone-else", subject("coord", "comm", "j9-main", "telemetry")), b"x")
            await c.nc.flush()
            await c.violations("ff.node.v1.node.n3.heartbeat")
            await c.violations("someone-else")
            # the JetStream API of the system streams: refused (the request never reaches JetStream)
            js = c.nc.jetstream()
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.stream_info("FF_CKPT")
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await js.streams_info()
            await c.violations("$js.api.stream.info.ff_ckpt")
            assert c.nc.is_connected  # a violation is refused, not a disconnect
        finally:
            await c.nc.close()

    asyncio.run(go())


def test_an_admin_watches_cluster_events_but_not_the_streams(cluster: LocalCluster) -> None:
    async def go() -> None:
        c = await _connect(cluster.nats_url, cluster.admin_token)
        try:
            await c.nc.subscribe("ff.>")
            await c.nc.subscribe(">")
            await c.nc.flush()
            await c.violations('subscription to ">"')
            assert not any('"ff.>"' in e for e in c.errors), c.errors
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await c.nc.jetstream().stream_info("FF_CKPT")
        finally:
            await c.nc.close()

    asyncio.run(go())


def test_a_service_may_do_everything(cluster: LocalCluster) -> None:
    async def go() -> None:
        c = await _connect(cluster.nats_url, cluster.service_token("checkpoint"))
        try:
            sub = await c.nc.subscribe(">")
            await c.nc.publish("ff.test.v1.x.y.z", b"y")
            msg = await sub.next_msg(timeout=5)
            assert msg.subject == "ff.test.v1.x.y.z"
            info = await c.nc.jetstream().stream_info("FF_CKPT")
            assert info.config.name == "FF_CKPT"
            assert c.errors == []
        finally:
            await c.nc.close()

    asyncio.run(go())


def _poll(check: Any, what: str, timeout_s: float = WITHIN_S) -> float:
    start = time.monotonic()
    while True:
        if check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.2)


def _connects(url: str, token: str) -> bool:
    async def go() -> bool:
        try:
            c = await _connect(url, token)
        except (nats.errors.Error, OSError, TimeoutError):
            return False
        await c.nc.close()
        return True

    return asyncio.run(go())


def test_added_user_connects_and_revoked_one_is_refused_within_seconds(cluster: LocalCluster) -> None:
    sd = str(cluster.state_dir)
    add = run_ff(["admin", "--state-dir", sd, "users", "add", "natsbob"], env=cluster.env, timeout_s=60)
    assert add.returncode == 0, add.stdout + add.stderr
    token = re.search(r"\b([A-Za-z0-9_-]{40,})\b", add.stdout)
    assert token is not None, add.stdout
    _poll(lambda: _connects(cluster.nats_url, token.group(1)), "the added user connects to NATS")
    assert "natsbob" in (cluster.state_dir / "nats-auth.conf").read_text()

    async def revoke_while_connected() -> None:
        # a connection the user already holds is cut too: nats-server re-checks every open
        # client against the reloaded users
        held = await _connect(cluster.nats_url, token.group(1))
        try:
            revoke = await asyncio.to_thread(run_ff, ["admin", "--state-dir", sd, "users", "revoke", "natsbob"],
                                             env=cluster.env, timeout_s=60)
            assert revoke.returncode == 0, revoke.stdout + revoke.stderr
            await wait_for(lambda: not held.nc.is_connected, timeout_s=WITHIN_S,
                           what="the revoked user's open NATS connection is closed")
        finally:
            await held.nc.close()

    asyncio.run(revoke_while_connected())
    _poll(lambda: not _connects(cluster.nats_url, token.group(1)), "the revoked user is refused")
    assert _connects(cluster.nats_url, cluster.user_token)  # the others are untouched


def test_a_users_launch_with_hfreduce_works_and_its_telemetry_reaches_coord(cluster: LocalCluster,
                                                                            tmp_path: Path) -> None:
    prog = tmp_path / "ranks.py"
    prog.write_text(RANKS)
    env = {k: v for k, v in cluster.env.items() if k != "FF_TOKEN"}
    # the user token from the state dir, as a user's shell finds it
    p = run_ff(["launch", "--state-dir", str(cluster.state_dir), "--nodes", "2", "--local-ranks", "1", "--job",
                "natsjob", "--timeout-s", "30", "--", sys.executable, str(prog)], env=env, timeout_s=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rendezvous through the coordination service" in p.stderr, p.stderr
    assert sum(f"rank {r} done" in p.stdout for r in range(2)) == 2, p.stdout
    assert "permissions violation" not in (p.stdout + p.stderr).lower()

    async def telemetry() -> None:
        async with CoordClient(cluster.address("coord"), token=cluster.user_token) as c:
            async def have_stats() -> bool:
                rep, _ = await c.op_stats("natsjob/default")
                return rep.ops >= 8 and len(rep.nodes) == 2

            await wait_for(have_stats, timeout_s=15, what="the job's telemetry in coord")

    asyncio.run(telemetry())
