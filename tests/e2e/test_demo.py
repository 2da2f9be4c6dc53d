"""``ff demo`` (what ``make demo`` runs) on the default cluster file, end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _demo(tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FF_")}
    res = subprocess.run([sys.executable, "-m", "fireflyer.cli.main", "demo", "--state-dir", str(tmp_path / "st")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "reply: 'hello, Fire-Flyer'" in out
    assert "spans from" in out and "did not cross processes" not in out
    assert out.count("allreduce ok: 1048576 x float32, sum 10") == 4  # 2 nodes x 2 ranks, through coord
    assert "rendezvous through the coordination service" in out and "4 ranks on 2 nodes agree" in out
    assert "engine failed" not in out  # the workers' clean close is not reported as a fault
    assert not (tmp_path / "st" / "cluster.json").exists()  # ff down cleaned up
    return out


def test_ff_demo_runs_the_default_cluster_end_to_end_and_again_on_the_same_state(tmp_path: Path) -> None:
    out = _demo(tmp_path)
    assert "loaded step 3 into a fresh model and optimizer: bit-identical" in out
    # the state dir outlives ff down: a second demo restarts every service on new ports (clients must
    # not trust the old addresses) and continues the checkpoint job's steps
    out = _demo(tmp_path)
    assert "continuing at step 4" in out
    assert "loaded step 6 into a fresh model and optimizer: bit-identical" in out
