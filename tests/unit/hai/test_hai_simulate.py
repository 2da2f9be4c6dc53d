"""Simulate mode (``ff task run --simulate-suspend-after``): the flag goes up after S seconds, the
command acknowledges, saves, calls go_suspend and is stopped; without S it just runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from fireflyer.hai.simulate import simulate
from fireflyer.testing.cluster import FF, REPO_ROOT

SCRIPT = textwrap.dedent("""
    import sys, time
    from fireflyer import hai
    print("state", hai.get_whole_life_state(), flush=True)
    for step in range(400):
        time.sleep(0.02)
        if hai.suspend_requested():
            hai.set_whole_life_state(hai.get_whole_life_state() + 10)
            print("saving at", step, flush=True)
            hai.go_suspend()
    print("finished", flush=True)
""")


def test_simulate_raises_the_flag_and_stops_at_go_suspend(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    res = simulate([sys.executable, str(script)], suspend_after_s=0.5, whole_life_state=2, log=False)
    assert res.suspended and res.exit_code != 0
    assert res.flag_at_s is not None and res.flag_at_s >= 0.5
    assert res.go_suspend_at_s is not None and res.go_suspend_at_s >= res.flag_at_s
    assert res.whole_life_state == 12


def test_without_a_suspend_the_command_runs_to_its_end(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("range(400)", "range(5)"))
    res = simulate([sys.executable, str(script)], suspend_after_s=None, log=False)
    assert not res.suspended and res.exit_code == 0 and res.flag_at_s is None


def test_ff_task_run_cli(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    r = subprocess.run([*FF, "task", "run", "--simulate-suspend-after", "0.3", "--whole-life-state", "5", "--json",
                        "--", sys.executable, str(script)], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["suspended"] and doc["whole_life_state"] == 15
    assert "state 5" in r.stdout and "saving at" in r.stdout and "finished" not in r.stdout
    r = subprocess.run([*FF, "task", "run"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert r.returncode == 2 and "give the command after --" in r.stderr
