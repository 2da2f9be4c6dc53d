"""The README's five-minute walk-through, run as it stands, so the front door cannot rot.

The block between ``<!-- walkthrough:begin -->`` and ``<!-- walkthrough:end -->`` is run as
one bash script (``set -e``) in a fresh directory that holds only ``.venv`` and ``docs``
(links to this checkout's), with no ``FF_*`` variable set: exactly what a new user pastes
from the repository root.  Then the output is checked for what the README says happens.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- walkthrough:begin -->", "<!-- walkthrough:end -->"


def walkthrough_script(readme: str) -> str:
    """The shell block of the README's walk-through (the one fenced block between the markers)."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1:
        raise AssertionError(f"README.md must hold exactly one {BEGIN} ... {END} section")
    section = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    if len(blocks) != 1:
        raise AssertionError(f"the walk-through section must hold one ```sh block, found {len(blocks)}")
    return blocks[0]


def test_the_walkthrough_section_is_one_shell_block() -> None:
    script = walkthrough_script((ROOT / "README.md").read_text())
    assert "ff up" in script and "ff down" in script
    with pytest.raises(AssertionError):
        walkthrough_script("no markers here")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    script = walkthrough_script((ROOT / "README.md").read_text())
    venv = Path(sys.prefix)
    (tmp_path / ".venv").symlink_to(venv, target_is_directory=True)
    (tmp_path / "docs").symlink_to(ROOT / "docs", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FF_", "VIRTUAL_ENV"))}
    try:
        res = subprocess.run(["bash", "-c", "set -eo pipefail\n" + script], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=840)
    finally:
        # a failed step must not leave the cluster running
        if (tmp_path / ".ff" / "cluster.json").exists():
            subprocess.run([str(venv / "bin" / "ff"), "down"], cwd=tmp_path, env=env, capture_output=True,
                           timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    who = re.search(r"home\s*:?\s*(/home/[A-Za-z0-9_.-]+)", out)
    assert who, f"ff whoami printed no home:\n{out[:3000]}"
    home = who.group(1)
    assert "hello, 3FS" in out  # ff fs cat of the file put into the home
    assert "hello.txt" in out
    # the first launch: rank 0 crashes at step 15, --max-restarts relaunches, the ranks resume at 10
    assert "failing on purpose at step 15" in out
    assert re.search(r"resumed job mlp from checkpoint \S+ at step 10", out), out[-6000:]
    assert "done: 4 ranks at step 30" in out
    # the second launch resumes from the first one's last checkpoint
    assert re.search(r"resumed job mlp from checkpoint \S+ at step 30", out), out[-6000:]
    assert "done: 4 ranks at step 40" in out
    assert "parameters differ" not in out
    assert not (tmp_path / ".ff" / "cluster.json").exists()  # ff down ran
    assert home.startswith("/home/")
