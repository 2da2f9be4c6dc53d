"""The allreduce check through a real HFReduce worker: one node, two local ranks (threads of this
process, each with its own communicator)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fireflyer import hfreduce
from fireflyer.cluster.procs import free_ports
from fireflyer.health.checks import Baseline, Status
from fireflyer.health.checks.allreduce import check_allreduce
from fireflyer.testing.poll import wait_until


@pytest.fixture
def worker() -> Iterator[str]:
    d = Path(tempfile.mkdtemp(prefix="hfh", dir="/tmp"))  # a short path: Unix socket names are limited
    sock = str(d / "w0.sock")
    p = subprocess.Popen([sys.executable, "-m", "fireflyer.hfreduce.worker", "--node-rank", "0", "--nnodes", "1",
                          "--local-world-size", "2", "--socket", sock, "--peers", f"127.0.0.1:{free_ports(1)[0]}",
                          "--timeout-s", "20", "--chunk-size", "64k", "--job-id", "health"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: [lines.append(x) for x in p.stdout], daemon=True).start()
    try:
        wait_until(lambda: any(x.startswith("hfreduce worker ready") for x in lines) or p.poll() is not None,
                   timeout_s=30, what="HFReduce worker ready")
        assert p.poll() is None, "".join(lines)
        yield sock
    finally:
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
        shutil.rmtree(d, ignore_errors=True)


def _ranks(sock: str, inject: str) -> list:
    out: list = [None, None]

    def rank(r: int) -> None:
        comm = hfreduce.init(rank=r, world_size=2, local_rank=r, local_world_size=2, node_rank=0, nnodes=1,
                             socket=sock, name=f"health-{inject or 'clean'}")
        try:
            out[r] = check_allreduce(comm, Baseline(), mib=0.25, iters=2, timeout_s=20, inject=inject)
        finally:
            comm.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_allreduce_check_through_a_real_worker(worker: str) -> None:
    clean = _ranks(worker, "")
    assert [r.status for r in clean] == [Status.PASS, Status.PASS], [r.summary for r in clean]
    assert clean[0].evidence["world_size"] == 2 and clean[0].evidence["allreduce_busbw_gbps"] > 0
    bad = _ranks(worker, "wrong_data")
    assert [r.status for r in bad] == [Status.FAIL, Status.FAIL]
    assert {r.evidence["index"] for r in bad} == {16384}
