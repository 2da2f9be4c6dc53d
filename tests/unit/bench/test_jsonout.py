"""``--json [PATH]``, one form on every ``ff bench`` verb (fireflyer.bench._jsonout)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path

import pytest

from fireflyer.bench import _jsonout
from fireflyer.bench._jsonout import STDOUT, add_json_option, emit
from fireflyer.cli.main import BENCHES
from fireflyer.cli.main import main as ff_main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ff bench x")
    p.add_argument("--size", default="1")
    add_json_option(p)
    return p


def test_no_value_and_dash_mean_stdout_and_absent_means_none(tmp_path: Path) -> None:
    p = _parser()
    assert p.parse_args([]).json is None
    assert p.parse_args(["--json"]).json == STDOUT
    assert p.parse_args(["--json", "-"]).json == STDOUT
    assert p.parse_args(["--json", "--size", "3"]).json == STDOUT  # an option after it is not its value
    target = tmp_path / "out.json"
    assert p.parse_args(["--json", str(target)]).json == str(target)


@pytest.mark.parametrize("bad", ["missing-dir/out.json", "."])
def test_a_path_that_cannot_be_written_is_refused_at_parse_time(
        bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["--json", str(tmp_path / bad)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--json" in err and ("does not exist" in err or "is a directory" in err)


def test_a_read_only_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.geteuid() == 0:
        # root passes every access check (CI runs as root): answer as the owner's mode bits would
        real = os.access

        def owner_access(path: object, mode: int, **kw: object) -> bool:
            if Path(str(path)) == ro:
                return not (mode & os.W_OK)
            return real(path, mode, **kw)

        monkeypatch.setattr(_jsonout.os, "access", owner_access)
    try:
        with pytest.raises(SystemExit):
            _parser().parse_args(["--json", str(ro / "out.json")])
    finally:
        ro.chmod(0o700)
    assert "permission denied" in capsys.readouterr().err


def test_emit_stdout_prints_one_line_and_skips_the_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    called: list[int] = []
    assert emit(STDOUT, {"a": 1, "b": [1.5]}, lambda: called.append(1)) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out) == {"a": 1, "b": [1.5]}
    assert not called


def test_emit_path_prints_the_human_output_and_writes_the_file(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "r.json"
    target.write_text("old")
    assert emit(str(target), {"a": 1}, lambda: print("human")) == 0
    assert capsys.readouterr().out == "human\n"
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind


def test_emit_none_prints_only_the_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    emit(None, {"a": 1}, lambda: print("human"))
    assert capsys.readouterr().out == "human\n"


def test_every_verb_takes_the_same_json_option(capsys: pytest.CaptureFixture[str]) -> None:
    """Each verb's --help shows ``--json [PATH]`` (the shared option, not a flag of its own)."""
    for verb, module in sorted(BENCHES.items()):
        main = importlib.import_module(module).main
        with pytest.raises(SystemExit):
            main(["--help"])
        out = capsys.readouterr().out
        assert "--json [PATH]" in out, verb


def test_ff_bench_kv_json_to_stdout_and_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ff_main(["bench", "kv", "--clients", "2", "--ops", "20", "--json"]) == 0
    line = capsys.readouterr().out
    doc = json.loads(line)
    assert doc["bench"] == "kv_small_txn" and doc["txns"] == 20 and line.count("\n") == 1

    target = tmp_path / "kv.json"
    assert ff_main(["bench", "kv", "--clients", "2", "--ops", "20", "--json", str(target)]) == 0
    assert json.loads(target.read_text())["txns"] == 20

    with pytest.raises(SystemExit) as e:
        ff_main(["bench", "kv", "--ops", "20", "--json", str(tmp_path / "nope" / "kv.json")])
    assert e.value.code == 2
    assert "does not exist" in capsys.readouterr().err
