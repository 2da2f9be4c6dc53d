"""ff launch against a running cluster: the training env gets every live service's address."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fireflyer.cluster.procs import observe
from fireflyer.cluster.records import ClusterRecord, NatsRecord, ProcessRecord, StatePaths, write_record
from fireflyer.hfreduce.launch import discover_coord


def _proc(name: str, pid: int, address: str, i: int = 0) -> ProcessRecord:
    return ProcessRecord(name=name, instance=f"{name}-{i}", module=f"services.{name}", pid=pid,
                         start_ticks=getattr(observe(pid), "start_ticks", 1), address=address, log="/dev/null", started_at=0.0)


def test_discover_exports_every_live_service(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = os.getpid()
    paths = StatePaths(tmp_path)
    paths.root.mkdir(parents=True, exist_ok=True)
    write_record(paths, ClusterRecord(
        state_dir=str(tmp_path), config="", started_at=0.0, tokens_file=str(tmp_path / "tokens.json"),
        spans_file="", nats=NatsRecord(url="nats://127.0.0.1:1", managed=True),
        processes=[_proc("coord", me, "127.0.0.1:10"), _proc("meta", me, "127.0.0.1:11"),
                   _proc("meta", me, "127.0.0.1:12", 1), _proc("checkpoint", me, "127.0.0.1:13"),
                   _proc("mgmtd", dead.pid, "127.0.0.1:14")]))  # fmt: skip
    env = discover_coord({"FF_STATE_DIR": str(tmp_path), "FF_TOKEN": "t"})
    assert env["FF_COORD_ADDR"] == "127.0.0.1:10" and env["FF_CKPT_ADDR"] == "127.0.0.1:13"
    assert env["FF_META_ADDR"] == "127.0.0.1:11,127.0.0.1:12" and "FF_MGMTD_ADDR" not in env  # mgmtd is gone
    assert env["FF_NATS_URL"] == "nats://127.0.0.1:1" and "FF_TOKEN" not in env
    # what the caller already set wins
    assert "FF_CKPT_ADDR" not in discover_coord({"FF_STATE_DIR": str(tmp_path), "FF_CKPT_ADDR": "x:1"})
