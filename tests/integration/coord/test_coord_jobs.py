"""coord with real HFReduce workers: ff launch through coord, kill -9 of a node's worker, coord restart."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from coord_harness import RANK_LOOP, TIMING, CoordJob

from fireflyer.coord import CoordClient
from fireflyer.testing.poll import wait_until
from fireflyer.testing.services import ServiceProcess


def ff(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fireflyer.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


async def test_launch_through_coord_and_cli_tables(tmp_path: Path, job_env: dict[str, str], coord_proc) -> None:  # type: ignore[no-untyped-def]
    await coord_proc.wait_healthy()
    prog = tmp_path / "loop.py"
    prog.write_text(RANK_LOOP)
    # zones B,A: coord ranks zone A first, so node1 becomes node rank 0 and the launcher must renumber
    p = await asyncio.to_thread(ff, "launch", "--nodes", "2", "--local-ranks", "2", "--zones", "B,A", "--job-id",
                                "lj", "--timeout-s", "20", "--", sys.executable, str(prog), "30", env=job_env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rendezvous through the coordination service" in p.stderr
    assert sum(f"[rank {r}] done" in p.stdout for r in range(4)) == 4, p.stdout
    async with CoordClient(coord_proc.address, token=job_env["FF_TOKEN"]) as c:
        view = await c.get("lj/default")
        assert view.state == "ended" and [(n.node, n.zone) for n in view.nodes] == [("node1", "A"), ("node0", "B")]
        assert view.cross_zone_pairs == 1

        async def have_stats() -> bool:
            rep, _ = await c.op_stats("lj/default")
            return rep.ops > 3 and len(rep.nodes) == 2 and bool(rep.edges)
        from fireflyer.testing.poll import wait_for
        await wait_for(have_stats, timeout_s=10, what="telemetry in coord")
    comms = await asyncio.to_thread(ff, "coord", "comms", env=job_env)
    assert comms.returncode == 0 and "lj/default" in comms.stdout and "ended" in comms.stdout, comms.stderr
    stats = await asyncio.to_thread(ff, "coord", "stats", "lj/default", "--last", "50", env=job_env)
    assert stats.returncode == 0, stats.stderr
    assert "LAG_MEAN" in stats.stdout and "SRC\\DST" in stats.stdout and "node1" in stats.stdout


async def test_kill9_of_a_worker_all_ranks_raise_naming_it(tmp_path: Path, job_env: dict[str, str],
                                                           coord_proc) -> None:  # type: ignore[no-untyped-def]
    await coord_proc.wait_healthy()
    prog = tmp_path / "loop.py"
    prog.write_text(RANK_LOOP)
    job = CoordJob(tmp_path, coord_proc.address, job_env, 3, job="k9").start_workers()
    try:
        job.start_ranks(prog, 100000)
        wait_until(lambda: all(r.has("running") for r in job.ranks), timeout_s=30, what="ranks running")
        victim = next(i for i, nr in job.node_rank.items() if nr == 1)  # node rank 1
        t0 = time.monotonic()
        os.kill(job.workers[victim].p.pid, signal.SIGKILL)
        wait_until(lambda: all(r.p.poll() is not None for r in job.ranks), timeout_s=15, what="every rank raised")
        took = time.monotonic() - t0
        for i, r in enumerate(job.ranks):
            assert r.p.returncode == 3 and r.has("RAISED"), r.text()
            if i != victim:
                msg = next(ln for ln in r.lines if ln.startswith("RAISED"))
                assert "node 1" in msg or "node1" in msg, msg
        assert took < 10
        async with CoordClient(coord_proc.address, token=job_env["FF_TOKEN"]) as c:
            async def aborted() -> bool:
                return (await c.get("k9/default")).state == "aborted"
            from fireflyer.testing.poll import wait_for
            await wait_for(aborted, timeout_s=10, what="coord aborted the communicator")
            view = await c.get("k9/default")
            assert view.culprit == f"node{victim}" and "missed heartbeats" in view.reason
    finally:
        job.stop()


async def test_coord_restart_during_a_running_job(tmp_path: Path, job_env: dict[str, str], nats_server,
                                                  token_file, coord_proc) -> None:  # type: ignore[no-untyped-def]
    await coord_proc.wait_healthy()
    prog = tmp_path / "loop.py"
    prog.write_text(RANK_LOOP)
    job = CoordJob(tmp_path, coord_proc.address, job_env, 2, job="rs").start_workers()
    try:
        job.start_ranks(prog, 300)
        wait_until(lambda: all(r.has("running") for r in job.ranks), timeout_s=30, what="ranks running")
        coord_proc.signal(signal.SIGKILL)
        coord_proc.wait(10)
        await asyncio.sleep(1.0)  # collectives keep running with coord gone
        again = ServiceProcess("services.coord", state_dir=tmp_path, nats_url=nats_server.url,
                               tokens_file=token_file[0], instance="coord-1",
                               env={**TIMING, "FF_COORD_KV_URL": f"sqlite:///{tmp_path}/coord.db",
                                    "FF_RPC_PORT": str(coord_proc.port)})
        again.port, again.address = coord_proc.port, coord_proc.address
        again.start()
        try:
            await again.wait_healthy()
            async with CoordClient(again.address, token=job_env["FF_TOKEN"]) as c:
                view = await c.get("rs/default")
                assert view.state == "active" and view.generation == 1
                assert [x.comm for x in await c.list("rs")] == ["rs/default"]
            wait_until(lambda: all(r.p.poll() is not None for r in job.ranks), timeout_s=30, what="ranks done")
            for r in job.ranks:
                assert r.p.returncode == 0 and r.has("done"), r.text()
            async with CoordClient(again.address, token=job_env["FF_TOKEN"]) as c:
                assert (await c.get("rs/default")).state == "active"  # heartbeats resumed: nothing aborted
        finally:
            job.stop()
            again.stop()
    finally:
        job.stop()


FAIL_ONCE = textwrap.dedent("""
    import os, sys, numpy as np
    from fireflyer import hfreduce
    comm = hfreduce.init(timeout_s=30)
    x = comm.empty(1024, np.float32)
    x[:] = 1
    comm.allreduce(x)
    restart = os.environ["FF_RESTART_COUNT"]
    if os.environ["FF_RANK"] == "1" and restart == "0" and len(sys.argv) > 1:
        os._exit(3)  # dies with the communicator open, as a crashing trainer does
    comm.barrier(); comm.close()
    print("done", os.environ["FF_JOB_ID"], restart, int(x[0]), flush=True)
""")


async def test_restarts_and_relaunches_of_a_named_job_through_coord(tmp_path: Path, job_env: dict[str, str],
                                                                   coord_proc) -> None:  # type: ignore[no-untyped-def]
    """--job NAME with --max-restarts: the relaunched attempt and a later launch of the same job join
    coord as newer runs of it (coord refuses joins it takes for an older run)."""
    await coord_proc.wait_healthy()
    prog = tmp_path / "once.py"
    prog.write_text(FAIL_ONCE)
    base = ["launch", "--nodes", "2", "--local-ranks", "1", "--job", "rj", "--timeout-s", "20"]
    p = await asyncio.to_thread(ff, *base, "--max-restarts", "1", "--", "python", str(prog), "fail", env=job_env,
                                timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ff launch: rank 1 exited with 3; restarting (1/1)" in p.stderr
    assert all(f"[rank {r}] done rj 1 2" in p.stdout for r in range(2)), p.stdout
    async with CoordClient(coord_proc.address, token=job_env["FF_TOKEN"]) as c:
        first = await c.get("rj/default")
        assert first.state == "ended" and first.restart_count >= 1
    p = await asyncio.to_thread(ff, *base, "--", "python", str(prog), env=job_env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert all(f"[rank {r}] done rj 0 2" in p.stdout for r in range(2)), p.stdout
    async with CoordClient(coord_proc.address, token=job_env["FF_TOKEN"]) as c:
        second = await c.get("rj/default")
        assert second.state == "ended" and second.generation > first.generation
        assert second.restart_count > first.restart_count
