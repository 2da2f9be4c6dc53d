"""``ff demo`` (what ``make demo`` runs) on the default cluster file, end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_ff_demo_runs_the_default_cluster_end_to_end(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FF_")}
    res = subprocess.run([sys.executable, "-m", "fireflyer.cli.main", "demo", "--state-dir", str(tmp_path / "st")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "reply: 'hello, Fire-Flyer'" in out
    assert "loaded step 3 into a fresh model and optimizer: bit-identical" in out
    assert "spans from" in out and "did not cross processes" not in out
    assert not (tmp_path / "st" / "cluster.json").exists()  # ff down cleaned up
