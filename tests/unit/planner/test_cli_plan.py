"""``ff plan`` end to end through ``python -m fireflyer.cli.main``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _ff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fireflyer.cli.main", "plan", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})


def test_json_matches_the_released_model():
    r = _ff("--model", "80b", "--gpus", "1024", "--batch", "2048", "--topology", "perlmutter",
            "--no-memory", "--no-compute", "--json", "--top", "3")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    top = [(c["col"], c["row"], c["depth"], c["data"]) for c in out["configs"]]
    assert top == [(1, 1, 1024, 1), (1, 1, 512, 2), (1, 1, 256, 4)]
    assert out["configs"][0]["comm_s"] == pytest.approx(5.3104339599609375, rel=1e-12)
    assert out["valid"] == 230 and out["excluded"] == {"tensor degree below the model's minimum": 56}


def test_table_shows_sizes_times_memory_and_exclusions():
    r = _ff("--model", "20b", "--gpus", "256", "--batch", "512", "--topology", "perlmutter", "--top", "5")
    assert r.returncode == 0, r.stderr
    for word in ("col", "row", "depth", "data", "comm s", "step s", "mem GiB/GPU", "excluded",
                 "does not fit in GPU memory", "tensor degree below the model's minimum"):
        assert word in r.stdout
    ranks = [line.split()[0] for line in r.stdout.splitlines() if line.strip()[:1].isdigit() and "  " in line]
    assert ranks[:5] == ["1", "2", "3", "4", "5"]


def test_allreduce_model():
    r = _ff("allreduce", "--topology", "fireflyer2", "--nodes", "16")
    assert r.returncode == 0, r.stderr
    assert "13.3 GB/s theoretical" in r.stdout and "network binds" in r.stdout
    j = json.loads(_ff("allreduce", "--nodes", "16", "--json").stdout)
    assert j["hfreduce"]["binding"] == "network" and j["hfreduce"]["theoretical_GBps"] == pytest.approx(40 / 3)


@pytest.mark.parametrize(("args", "flag"), [
    (["--model", "80b", "--gpus", "1000", "--batch", "2048"], "--gpus"),
    (["--model", "80b", "--gpus", "32", "--batch", "2048"], "--gpus"),
    (["--model", "80b", "--gpus", "1024", "--batch", "100"], "--batch"),
    (["--model", "7b", "--gpus", "64", "--batch", "128"], "--model"),
    (["--model", "5b", "--gpus", "64", "--batch", "128", "--topology", "frontier"], "--topology"),
    (["allreduce", "--topology", "fireflyer2", "--nodes", "0"], "--nodes"),
])
def test_bad_input_exits_2_naming_the_argument(args, flag):
    r = _ff(*args)
    assert r.returncode == 2
    assert flag in r.stderr and r.stderr.startswith("ff plan: ")
