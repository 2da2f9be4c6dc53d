"""A real HFReduce cluster on this machine for tests: n worker processes + forked ranks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fireflyer.cluster.procs import free_ports
from fireflyer.testing.poll import wait_until

HERE = Path(__file__).resolve().parent
LIBS = HERE.parents[2] / "libs"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(LIBS), str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("FF_NATS_URL", None)
    env.update(extra or {})
    return env


class Cluster:
    """``nnodes`` workers with ``k`` local ranks each; sockets in a short temp dir."""

    def __init__(self, nnodes: int, k: int, *, chunk: str = "1k", timeout_s: float = 20.0,
                 env: dict[str, str] | None = None) -> None:
        self.nnodes, self.k, self.chunk, self.timeout_s = nnodes, k, chunk, timeout_s
        self.dir = Path(tempfile.mkdtemp(prefix="hfr", dir="/tmp"))
        self.extra_env = env or {}
        self.workers: list[subprocess.Popen[str]] = []
        self.lines: list[list[str]] = []
        self.peers = ",".join(f"127.0.0.1:{p}" for p in free_ports(nnodes))

    def socket(self, node: int) -> str:
        return str(self.dir / f"w{node}.sock")

    def start(self) -> Cluster:
        for node in range(self.nnodes):
            self.workers.append(self._start_worker(node))
        for node in range(self.nnodes):
            wait_until(lambda n=node: any(line.startswith("hfreduce worker ready") for line in self.lines[n])
                       or self.workers[n].poll() is not None, timeout_s=30, what=f"worker {node} ready")
            assert self.workers[node].poll() is None, "\n".join(self.lines[node])
        return self

    def _start_worker(self, node: int) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "fireflyer.hfreduce.worker", "--node-rank", str(node), "--nnodes",
                str(self.nnodes), "--local-world-size", str(self.k), "--socket", self.socket(node),
                "--peers", self.peers, "--chunk-size", self.chunk, "--timeout-s", str(self.timeout_s),
                "--job-id", "test"]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=_env(self.extra_env))
        lines: list[str] = []
        if node < len(self.lines):
            self.lines[node] = lines
        else:
            self.lines.append(lines)
        threading.Thread(target=lambda: [lines.append(x.rstrip("\n")) for x in p.stdout], daemon=True).start()
        return p

    def ranks(self, mode: str, *, out: Path | None = None, nodes: list[int] | None = None, wait: bool = True,
              timeout_s: float = 60.0, **opts: Any) -> RankRun:
        out = out or Path(tempfile.mkdtemp(prefix="out", dir=self.dir))
        out.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, str(HERE / "hfr_rank_prog.py"), "--socket", str(self.dir / "w{node}.sock"),
                "--nnodes", str(self.nnodes), "--k", str(self.k), "--mode", mode, "--out", str(out)]
        if nodes is not None:
            argv += ["--nodes", ",".join(map(str, nodes))]
        for key, v in opts.items():
            flag = "--" + key.replace("_", "-")
            if v is True:
                argv.append(flag)
            elif v not in (False, None):
                argv += [flag, str(v)]
        run = RankRun(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       env=_env(self.extra_env)), out)
        if wait:
            run.wait(timeout_s)
        return run

    def kill_worker(self, node: int) -> None:
        self.workers[node].send_signal(signal.SIGKILL)
        self.workers[node].wait(10)

    def stop(self) -> list[int]:
        codes = []
        for p in self.workers:
            if p.poll() is None:
                p.terminate()
        for p in self.workers:
            try:
                codes.append(p.wait(15))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait(5))
        shutil.rmtree(self.dir, ignore_errors=True)
        return codes


class RankRun:
    """The forked ranks of one program run; ``results()`` reads each rank's JSON outcome."""

    def __init__(self, proc: subprocess.Popen[str], out: Path) -> None:
        self.proc = proc
        self.out = out
        self.lines: list[str] = []
        self.pids: dict[int, int] = {}
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if line.startswith("rank ") and " pid=" in line:
                r, pid = line[5:].split(" pid=")
                self.pids[int(r)] = int(pid)

    def wait(self, timeout_s: float = 60.0) -> int:
        rc = self.proc.wait(timeout_s)
        self._t.join(5)
        return rc

    def results(self) -> dict[int, dict[str, Any]]:
        out = {}
        for p in self.out.glob("rank*.json"):
            d = json.loads(p.read_text())
            out[d["rank"]] = d
        return out

    def wait_line(self, prefix: str, count: int, timeout_s: float = 30.0) -> None:
        wait_until(lambda: sum(x.startswith(prefix) for x in self.lines) >= count, timeout_s=timeout_s,
                   what=f"{count} lines {prefix!r}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        for pid in self.pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def time_now() -> float:
    return time.monotonic()
