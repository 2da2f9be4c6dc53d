"""The committed fireflyer.api code matches proto/ (run `make proto` when this fails)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from fireflyer.api import build


def test_generated_code_is_up_to_date() -> None:
    problems = build.check()
    assert not problems, "generated code is stale; run `make proto` and commit:\n" + "\n".join(problems)


def test_check_command_exits_zero_when_fresh() -> None:
    done = subprocess.run([sys.executable, "-m", "fireflyer.api.build", "--check"], capture_output=True, text=True,
                          cwd=build.REPO_ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    proto, out = tmp_path / "proto", tmp_path / "libs"
    shutil.copytree(build.REPO_ROOT / "proto", proto)
    shutil.copytree(build.REPO_ROOT / "libs" / "fireflyer" / "api", out / "fireflyer" / "api",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return proto, out


def test_check_reports_stale_missing_and_extra(tmp_path: Path) -> None:
    proto, out = _copy(tmp_path)
    assert build.check(proto, out) == []
    echo = proto / "fireflyer" / "api" / "echo" / "v1" / "echo.proto"
    echo.write_text(echo.read_text().replace("string text = 1;\n  double", "string text = 1;\n  bool loud = 9;\n  double"))
    new = proto / "fireflyer" / "api" / "extra" / "v1" / "extra.proto"
    new.parent.mkdir(parents=True)
    new.write_text('syntax = "proto3";\npackage ff.extra.v1;\nmessage Thing { string id = 1; }\n')
    leftover = out / "fireflyer" / "api" / "old" / "v1" / "old_pb2.py"
    leftover.parent.mkdir(parents=True)
    leftover.write_text("# from a deleted proto\n")

    problems = build.check(proto, out)
    assert "stale: fireflyer/api/echo/v1/echo_pb2.py" in problems
    assert "missing: fireflyer/api/extra/v1/extra_pb2.py" in problems
    assert "missing: fireflyer/api/extra/__init__.py" in problems
    assert "extra: fireflyer/api/old/v1/old_pb2.py" in problems
    assert build.main(["--check", "--proto-dir", str(proto), "--out-dir", str(out)]) == 1

    changes = build.generate(proto, out)
    assert "deleted: fireflyer/api/old/v1/old_pb2.py" in changes
    assert build.check(proto, out) == []
    assert not (out / "fireflyer" / "api" / "old").exists()
    assert (out / "fireflyer" / "api" / "build.py").exists() and (out / "fireflyer" / "api" / "__init__.py").exists()
    assert build.generate(proto, out) == []  # deterministic: a second run changes nothing
