"""Argument handling of ff up/status/down (the commands themselves run in tests/e2e)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fireflyer.cli import cluster_cmds


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ff")
    cluster_cmds.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_register_adds_three_commands() -> None:
    up = _parse("up", "--config", "c.toml", "--state-dir", "s")
    assert up.func is cluster_cmds.cmd_up and up.config == "c.toml" and up.state_dir == "s"
    st = _parse("status", "--json")
    assert st.func is cluster_cmds.cmd_status and st.json and st.state_dir is None
    dn = _parse("down", "--timeout", "2.5")
    assert dn.func is cluster_cmds.cmd_down and dn.timeout == 2.5


def test_state_dir_precedence() -> None:
    assert cluster_cmds.resolve_state_dir("x", {"FF_STATE_DIR": "y"}) == Path("x")
    assert cluster_cmds.resolve_state_dir(None, {"FF_STATE_DIR": "y"}) == Path("y")
    assert cluster_cmds.resolve_state_dir(None, {}) == Path(".ff")


def test_status_without_cluster(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert cluster_cmds.main(["status", "--state-dir", str(tmp_path)]) == 1
    assert "no cluster is running" in capsys.readouterr().out
    assert cluster_cmds.main(["down", "--state-dir", str(tmp_path)]) == 0
