"""docs/examples/train_ddp.py under ff launch (trains, checkpoints, resumes where it stopped); ff bench ddp."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "train_ddp.py"


def launch(root: Path, *args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "fireflyer.cli.main", "launch", "--nodes", "2", "--local-ranks", "1",
                        "--timeout-s", "30", "--", sys.executable, str(EXAMPLE), "--root", str(root), *args],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return p.stdout


def digest(out: str) -> str:
    m = re.search(r"\[rank 0\] done: 2 ranks at step \d+, loss [0-9.]+, parameters identical \(sha256 (\w+)\)", out)
    assert m, out
    return m.group(1)


def test_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path: Path) -> None:
    first = launch(tmp_path / "a", "--steps", "4", "--save-every", "2", "--accumulate", "2")
    assert "[rank 0] step 4:" in first and "resumed" not in first
    again = launch(tmp_path / "a", "--steps", "6", "--save-every", "2", "--accumulate", "2")
    assert "[rank 0] resumed job train-ddp from checkpoint" in again and "at step 4" in again
    assert "[rank 0] step 2:" not in again  # it went on from step 5
    straight = launch(tmp_path / "b", "--steps", "6", "--save-every", "2", "--accumulate", "2")
    # model, optimizer state and the data stream all resume: bit-identical parameters
    assert digest(again) == digest(straight)


def test_suspend_flag_saves_every_rank_at_one_step_and_a_restart_resumes_there(tmp_path: Path) -> None:
    # HAI's simulate mode around a 2-node ff launch: the flag goes up after 6 s (wherever the ranks
    # are by then: mid-training usually, still starting on a loaded machine, which then stops at
    # step 1), every rank agrees on it through the DDP's HFReduce comm
    launch_cmd = [sys.executable, "-m", "fireflyer.cli.main", "launch", "--nodes", "2", "--local-ranks", "1",
                  "--timeout-s", "30", "--", sys.executable, str(EXAMPLE), "--root", str(tmp_path / "a"),
                  "--steps", "1000000", "--save-every", "1000000"]
    p = subprocess.run([sys.executable, "-m", "fireflyer.cli.main", "task", "run", "--simulate-suspend-after", "6",
                        "--", *launch_cmd], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert "ff task run: go_suspend()" in p.stderr, p.stderr[-4000:]
    m = re.search(r"\[rank 0\] suspend requested: every rank saved step (\d+); suspending", p.stdout)
    assert m, p.stdout[-4000:] + p.stderr[-4000:]
    step = int(m.group(1))
    assert f"[rank 0] step {step}: loss" in p.stdout  # the checkpoint was written at that step
    assert "done:" not in p.stdout  # stopped, not finished
    again = launch(tmp_path / "a", "--steps", str(step + 2), "--save-every", "1000000")
    assert "[rank 0] resumed job train-ddp from checkpoint" in again and f"at step {step}\n" in again
    assert f"[rank 0] step {step + 2}: loss" in again and f"[rank 0] step {step}: loss" not in again
    # the suspend checkpoint held model, optimizer and step: bit-identical to an uninterrupted run
    straight = launch(tmp_path / "straight", "--steps", str(step + 2), "--save-every", "1000000")
    assert digest(again) == digest(straight)


def test_ff_bench_ddp_json() -> None:
    p = subprocess.run([sys.executable, "-m", "fireflyer.cli.main", "bench", "ddp", "--nodes", "2", "--local-ranks",
                        "1", "--model", "transformer", "--steps", "2", "--warmup", "1", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["bench"] == "ddp" and doc["ranks"] == 2 and doc["buckets"] >= 2
    for v in ("haiscale", "torch_hfreduce", "torch_gloo"):
        assert doc[f"{v}_step_ms"] > 0
    assert doc["comm_alone_ms"] > 0 and 0.0 <= doc["hidden_share"] <= 1.0
