"""``ff launch`` end to end with the real HFReduce worker, and a torch.distributed program run unchanged."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ALLREDUCE_CHECK = textwrap.dedent("""
    import os, numpy as np
    from fireflyer import hfreduce
    comm = hfreduce.init()
    r, n = int(os.environ["FF_RANK"]), int(os.environ["FF_WORLD_SIZE"])
    x = comm.empty(1000, np.float32); x[:] = r + 1
    comm.allreduce(x)
    assert np.all(x == n * (n + 1) / 2), x[:4]
    y = np.full(10, float(r), np.float32); comm.allreduce(y)
    assert np.all(y == n * (n - 1) / 2), y
    comm.barrier(); comm.close()
    print("allreduce ok", r, n)
""")

TORCH_GLOO = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")  # env:// -- RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from ff launch
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    assert t.tolist() == [3.0] * 4, t
    print("gloo ok", dist.get_rank())
    dist.destroy_process_group()
""")


def ff(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fireflyer.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_launch_two_nodes_two_ranks_allreduce(tmp_path: Path) -> None:
    script = tmp_path / "check.py"
    script.write_text(ALLREDUCE_CHECK)
    p = ff("launch", "--nodes", "2", "--local-ranks", "2", "--timeout-s", "30", "--", sys.executable, str(script))
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(4):
        assert f"[rank {r}] allreduce ok {r} 4" in p.stdout


def test_launch_zones_and_chunk_size_reach_the_worker(tmp_path: Path) -> None:
    script = tmp_path / "check.py"
    script.write_text(ALLREDUCE_CHECK)
    p = ff("launch", "--nodes", "3", "--local-ranks", "1", "--zones", "A,A,B", "--chunk-size", "64K",
           "--", sys.executable, str(script))
    assert p.returncode == 0, p.stdout + p.stderr
    assert sum(f"allreduce ok {r} 3" in p.stdout for r in range(3)) == 3


def test_torch_distributed_program_runs_unchanged() -> None:
    pytest.importorskip("torch")
    p = ff("launch", "--nodes", "2", "--local-ranks", "1", "--", sys.executable, "-c", TORCH_GLOO, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[rank 0] gloo ok 0" in p.stdout and "[rank 1] gloo ok 1" in p.stdout


def test_failing_rank_code_propagates_through_the_real_worker(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import os, sys, time\n"
                      "from fireflyer import hfreduce\n"
                      "comm = hfreduce.init()\n"
                      "if os.environ['FF_RANK'] == '1': sys.exit(9)\n"
                      "time.sleep(60)\n")
    p = ff("launch", "--nodes", "2", "--local-ranks", "1", "--grace", "2", "--", sys.executable, str(script))
    assert p.returncode == 9, p.stdout + p.stderr
    assert "rank 1 exited with code 9" in p.stderr
