"""Smoke tests of ``ff bench fs``, ``fs-small`` and ``incast`` at tiny sizes: keys and positive
numbers, never timings (each bench starts its own throwaway cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fireflyer.bench import fs as bench_fs
from fireflyer.bench import fs_small as bench_fs_small
from fireflyer.bench import incast as bench_incast
from fireflyer.cli.main import BENCHES


def _run(main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_registered() -> None:
    assert BENCHES["fs"] == "fireflyer.bench.fs"
    assert BENCHES["fs-small"] == "fireflyer.bench.fs_small"
    assert BENCHES["incast"] == "fireflyer.bench.incast"


def test_fs_bench(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(bench_fs.main, ["--size", "3M", "--io", "1M", "--replicas", "1,3", "--no-fsync", "--dir",
                               str(tmp_path), "--json"], capsys)
    assert out["bench"] == "fs" and out["size_bytes"] == 3 << 20 and out["cpu_count"] >= 1
    assert set(out["runs"]) == {"1", "3"}
    assert out["runs"]["1"]["chains"] == 6 and out["runs"]["3"]["chains"] == 2
    for run in out["runs"].values():
        for key in ("write_MBps", "read_MBps", "write_ratio_to_raw_write", "read_ratio_to_read_anchor"):
            assert run[key] > 0
    for key in ("write_fsync_MBps", "pagecache_read_MBps", "loopback_MBps", "read_anchor_MBps"):
        assert out["anchor"][key] > 0
    assert set(out["goals"]) == {"write_1_replica", "read_1_replica", "read_3_replica"}
    assert all(isinstance(g["met"], bool) for g in out["goals"].values())
    assert "git_sha" in out


def test_fs_small_bench(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(bench_fs_small.main, ["--file-size", "1M", "--reads", "64", "--batch", "1,16", "--replicas", "1",
                                     "--dir", str(tmp_path), "--json"], capsys)
    assert out["bench"] == "fs-small" and out["batches"] == [1, 16]
    assert set(out["iops"]) == {"1", "16"} and all(v > 0 for v in out["iops"].values())
    assert out["anchor"]["iops"] > 0 and out["speedup_vs_unbatched"]["1"] == 1.0


def test_incast_bench(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(bench_incast.main, ["--servers", "3", "--io", "64K", "--batch", "12", "--batches", "3",
                                   "--rounds", "1", "--dir", str(tmp_path), "--json"], capsys)
    assert out["bench"] == "incast" and out["servers"] == 3 and out["chains"] == 3
    for mode in ("with_rts", "without_rts"):
        assert out[mode]["goodput_MBps"] > 0 and out[mode]["p99_ms"] >= out[mode]["p50_ms"] > 0
    assert out["ratios"]["goodput_rts_over_no_rts"] > 0
