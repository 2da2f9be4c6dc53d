"""``ff demo`` (what ``make demo`` runs) on the default cluster file, end to end: the whole story."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fireflyer.testing.cluster import REPO_ROOT

pytestmark = pytest.mark.timeout(420)


def _demo(tmp_path: Path, *args: str, timeout_s: float = 400) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FF_")}
    return subprocess.run([sys.executable, "-m", "fireflyer.cli.main", "demo", "--state-dir", str(tmp_path / "st"),
                           *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_ff_demo_tells_the_whole_story_on_the_default_cluster(tmp_path: Path) -> None:
    res = _demo(tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert "reply: 'hello, Fire-Flyer'" in out
    # 1. trains and checkpoints; 2. preempted: every rank saved one step; 3. resumed there
    assert "✓ it trains and saves a checkpoint" in out
    saved = re.search(r"stop reasons INTERRUPT; every rank saved step (\d+)", out)
    assert saved, out[-6000:]
    assert f"at step {saved.group(1)}" in out and "✓ the HIGH task runs on all three nodes and completes" in out
    # 4. the slow node is named by C4, drained, the task moves and the node comes back after validation
    named = re.search(r"incident inc-\d+: c4\.noncomm_slow on (node\d)", out)
    assert named, out[-6000:]
    victim = named.group(1)
    moved = re.search(r"run \d+ on (node\d), (node\d); restart after", out)
    assert moved and victim not in moved.groups(), out[-6000:]
    assert f"✓ {victim} passes validation and is back in service" in out
    # 5. it finishes with the same parameters on every rank; the summary; the dashboard; ff down
    assert "done: 2 ranks at step 120" in out and "parameters identical" in out
    for row in ("training", "allreduce", "checkpoints", "preemptions", "incidents"):
        assert re.search(rf"^ {row} +\S", out, re.M), row
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/", out)
    assert "spans from" in out and "did not cross processes" not in out
    assert not (tmp_path / "st" / "cluster.json").exists()  # ff down cleaned up


def test_ff_demo_fails_loudly_naming_the_step(tmp_path: Path) -> None:
    """A cluster without node agents: the training task is refused, the demo says which step and exits 1."""
    cfg = (REPO_ROOT / "deploy" / "local.toml").read_text()
    head, _, rest = cfg.partition('[[service]]\nname = "node"')
    config = tmp_path / "no-nodes.toml"
    config.write_text(head + "[[service]]" + rest.split("[[service]]", 1)[1])
    assert 'name = "node"' not in config.read_text()
    res = _demo(tmp_path, "--config", str(config), timeout_s=200)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-4000:]
    assert "the demo failed at step 'train'" in out, out[-4000:]
    assert not (tmp_path / "st" / "cluster.json").exists()
