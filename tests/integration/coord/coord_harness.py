"""Helpers for coord integration tests: coord as a process, workers joining through it, rank programs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from fireflyer.cluster.procs import free_ports
from fireflyer.testing.poll import wait_until

#: fast liveness so a dead node is noticed within about a second
TIMING = {"FF_COORD_HEARTBEAT_INTERVAL_S": "0.3", "FF_COORD_HEARTBEAT_MISSES": "3"}

#: runs ``argv[1]`` allreduces (10 ms apart; the count, not a time, so every rank issues the same ops);
#: prints "running" after the first op, "done N" at the end,
#: "RAISED <message>" (exit 3) when a collective fails
RANK_LOOP = textwrap.dedent("""
    import os, sys, time, numpy as np
    from fireflyer import hfreduce
    count = int(sys.argv[1])
    comm = hfreduce.init(timeout_s=30)
    r, n = int(os.environ["FF_RANK"]), int(os.environ["FF_WORLD_SIZE"])
    x = comm.empty(4096, np.float32)
    i = 0
    try:
        while i < count:
            x[:] = r + 1
            comm.allreduce(x)
            assert np.all(x == n * (n + 1) / 2), x[:4]
            if i == 0:
                print("running", flush=True)
            i += 1
            time.sleep(0.01)
        comm.barrier(); comm.close()
    except Exception as e:
        print("RAISED", type(e).__name__, str(e).replace(chr(10), " "), flush=True)
        sys.exit(3)
    print("done", i, flush=True)
""")


class Proc:
    """A child process whose merged output is collected line by line."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def has(self, text: str) -> bool:
        return any(text in ln for ln in self.lines)

    def text(self) -> str:
        return "\n".join(self.lines)


class CoordJob:
    """``nnodes`` real HFReduce workers joining coord (node i = ``node{i}``) and one rank per node."""

    def __init__(self, tmp: Path, coord_addr: str, env: dict[str, str], nnodes: int, *, job: str,
                 zones: list[str] | None = None) -> None:
        self.tmp, self.coord_addr, self.env, self.nnodes, self.job = tmp, coord_addr, env, nnodes, job
        self.zones = zones or [""] * nnodes
        self.workers: list[Proc] = []
        self.ranks: list[Proc] = []
        self.node_rank: dict[int, int] = {}
        self.sock_dir = Path(os.path.realpath(f"/tmp/ffc-{os.getpid()}-{job}"))
        self.sock_dir.mkdir(exist_ok=True)

    def start_workers(self) -> CoordJob:
        for i in range(self.nnodes):
            host = f"127.0.0.{i + 1}"
            port = free_ports(1, host)[0]
            argv = [sys.executable, "-m", "fireflyer.hfreduce.worker", "--nnodes", str(self.nnodes),
                    "--local-world-size", "1", "--socket", str(self.sock_dir / f"n{i}.sock"), "--job-id", self.job,
                    "--coord", self.coord_addr, "--node-name", f"node{i}", "--listen", f"{host}:{port}",
                    "--zone", self.zones[i], "--timeout-s", "20", "--coord-timeout-s", "30"]
            self.workers.append(Proc(argv, self.env))
        for i, w in enumerate(self.workers):
            wait_until(lambda w=w: w.has("hfreduce worker ready") or w.p.poll() is not None, timeout_s=40,
                       what=f"worker {i} ready")
            assert w.p.poll() is None, w.text()
            line = next(ln for ln in w.lines if "hfreduce worker ready" in ln)
            self.node_rank[i] = int(re.search(r"node=(\d+)", line).group(1))  # type: ignore[union-attr]
        return self

    def start_ranks(self, prog: Path, count: int) -> CoordJob:
        for i in range(self.nnodes):
            nr = self.node_rank[i]
            env = dict(self.env, FF_RANK=str(nr), FF_WORLD_SIZE=str(self.nnodes), FF_LOCAL_RANK="0",
                       FF_LOCAL_WORLD_SIZE="1", FF_NODE_RANK=str(nr), FF_NNODES=str(self.nnodes),
                       FF_HFREDUCE_SOCKET=str(self.sock_dir / f"n{i}.sock"), FF_JOB_ID=self.job)
            self.ranks.append(Proc([sys.executable, str(prog), str(count)], env))
        return self

    def stop(self) -> None:
        for p in self.ranks + self.workers:
            if p.p.poll() is None:
                p.p.kill()
            p.p.wait(10)
