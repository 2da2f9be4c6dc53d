"""A rank that ends without ``comm.close()``: a normal exit (or a dropped communicator) says
goodbye and the worker stays quiet; a killed rank or an uncaught exception is still the
``hfreduce.comm_failed`` warning a person should look at (issue 47, point 5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hfr_cluster import Cluster, _env

from fireflyer.testing.poll import wait_until

PROG = Path(__file__).resolve().parent / "hfr_exit_prog.py"


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster(1, 1, timeout_s=10.0, env={"FF_LOG_LEVEL": "debug"}).start()
    try:
        yield c
    finally:
        assert c.stop() == [0]


def _rank(c: Cluster, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(PROG), c.socket(0), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_env())


def _saw(c: Cluster, word: str) -> bool:
    return any(word in line for line in c.lines[0])


def test_normal_exit_without_close_is_quiet(cluster: Cluster) -> None:
    p = _rank(cluster, "exit")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and "allreduced" in out, out
    wait_until(lambda: _saw(cluster, "hfreduce.comm_closed"), timeout_s=10, what="the worker retires the comm")
    assert _saw(cluster, "hfreduce.rank_closed")
    assert not _saw(cluster, "comm_failed"), "\n".join(cluster.lines[0])
    assert not any(" warning " in x or " error " in x for x in cluster.lines[0]), "\n".join(cluster.lines[0])


def test_dropped_communicator_says_goodbye(cluster: Cluster) -> None:
    p = _rank(cluster, "drop")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and "reinit ok" in out, out
    wait_until(lambda: sum("hfreduce.comm_closed" in x for x in cluster.lines[0]) >= 2, timeout_s=10,
               what="both communicators retired")
    assert not _saw(cluster, "comm_failed"), "\n".join(cluster.lines[0])


def test_killed_rank_still_fails_the_communicator(cluster: Cluster) -> None:
    p = _rank(cluster, "hang")
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "allreduced"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    finally:
        p.kill()
    wait_until(lambda: _saw(cluster, "hfreduce.comm_failed"), timeout_s=10, what="comm_failed for a killed rank")
    assert not _saw(cluster, "hfreduce.comm_closed")


def test_uncaught_exception_is_not_a_clean_close(cluster: Cluster) -> None:
    p = _rank(cluster, "raise")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 1 and "the training script failed" in out, out
    wait_until(lambda: _saw(cluster, "hfreduce.comm_failed"), timeout_s=10, what="comm_failed for a failed rank")
    assert not _saw(cluster, "hfreduce.comm_closed")
