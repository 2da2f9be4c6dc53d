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


def test_discover_cluster_hands_the_ranks_the_user_token_and_state_dir(tmp_path: Path) -> None:
    from fireflyer.hfreduce.launch import discover_cluster
    from fireflyer.rpc.auth import TokenEntry, write_tokens_file

    me = os.getpid()
    paths = StatePaths(tmp_path)
    write_tokens_file(paths.tokens, [TokenEntry(token="fft_a", user="admin", roles=["admin"]),
                                     TokenEntry(token="fft_u", user="u", roles=["user"])])
    write_record(paths, ClusterRecord(
        state_dir=str(tmp_path), config="", started_at=0.0, tokens_file=str(paths.tokens), spans_file="",
        nats=NatsRecord(url="nats://127.0.0.1:1", managed=True),
        processes=[_proc("checkpoint", me, "127.0.0.1:13"), _proc("meta", me, "127.0.0.1:11")]))
    env, note = discover_cluster({}, tmp_path)  # --state-dir, with nothing in the environment
    assert note is None
    assert env == {"FF_CKPT_ADDR": "127.0.0.1:13", "FF_META_ADDR": "127.0.0.1:11", "FF_NATS_URL": "nats://127.0.0.1:1",
                   "FF_TOKEN": "fft_u", "FF_STATE_DIR": str(tmp_path)}
    assert discover_coord({"FF_STATE_DIR": str(tmp_path)}) == {}  # no coord: no rendezvous through it


def test_no_cluster_is_said_in_one_line(tmp_path: Path) -> None:
    from fireflyer.hfreduce.launch import discover_cluster

    env, note = discover_cluster({"FF_STATE_DIR": str(tmp_path / "none")})
    assert env == {}
    assert note is not None and "\n" not in note
    assert note.startswith("ff launch: no Fire-Flyer cluster found") and "standalone" in note
    assert "--state-dir" in note and str(tmp_path / "none") in note
    # an address in the environment is a cluster: no note
    assert discover_cluster({"FF_STATE_DIR": str(tmp_path / "none"), "FF_CKPT_ADDR": "h:1"}) == ({}, None)


def test_a_bare_python_is_the_launching_interpreter() -> None:
    from fireflyer.hfreduce.launch import Launcher, resolve_interpreter
    from fireflyer.hfreduce.launch_plan import LaunchOptions

    assert resolve_interpreter(["python", "-c", "pass"]) == [sys.executable, "-c", "pass"]
    assert resolve_interpreter(["python3", "t.py"], executable="/venv/bin/python") == ["/venv/bin/python", "t.py"]
    for other in (["/usr/bin/python", "x"], ["python3.11", "x"], ["pythonx"], ["sh", "python"], []):
        assert resolve_interpreter(other) == other
    assert Launcher(LaunchOptions(nodes=1, local_ranks=1), ["python", "train.py"]).cmd == [sys.executable, "train.py"]
