"""find_cluster: one precedence (arguments, FF_* variables, the state dir's records) and one message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fireflyer.cluster.discovery import NO_CLUSTER_HELP, Cluster, find_cluster, state_dir_of
from fireflyer.cluster.records import ClusterRecord, NatsRecord, ProcessRecord, StatePaths, write_record
from fireflyer.core.errors import FailedPrecondition, NoClusterFound
from fireflyer.rpc.auth import TokenEntry, write_tokens_file


def _proc(name: str, address: str, i: int = 0, pid: int | None = None) -> ProcessRecord:
    return ProcessRecord(name=name, instance=f"{name}-{i}", module=f"services.{name}", pid=pid or os.getpid(),
                         start_ticks=None, address=address, log="/dev/null", started_at=0.0)


def fake_cluster(root: Path, *, procs: list[ProcessRecord] | None = None, user: bool = True) -> Path:
    """A state dir as `ff up` leaves it: cluster.json and tokens.json (admin + user)."""
    paths = StatePaths(root)
    paths.root.mkdir(parents=True, exist_ok=True)
    entries = [TokenEntry(token="fft_admin", user="admin", roles=["admin"])]
    if user:
        entries.append(TokenEntry(token="fft_user", user="alice", roles=["user"]))
    write_tokens_file(paths.tokens, entries)
    if procs is None:
        procs = [_proc("mgmtd", "127.0.0.1:1"), _proc("meta", "127.0.0.1:2"), _proc("meta", "127.0.0.1:3", 1),
                 _proc("coord", "127.0.0.1:4"), _proc("checkpoint", "127.0.0.1:5"), _proc("storage", "127.0.0.1:6")]
    write_record(paths, ClusterRecord(state_dir=str(paths.root), config="", started_at=0.0,
                                      tokens_file=str(paths.tokens), spans_file="", processes=procs,
                                      nats=NatsRecord(url="nats://127.0.0.1:7", managed=True)))
    return paths.root


def test_the_state_dir_gives_addresses_and_the_user_token(tmp_path: Path) -> None:
    root = fake_cluster(tmp_path / "c")
    c = find_cluster(root, env={}, need=("meta", "mgmtd", "ckpt", "coord", "nats", "token"))
    assert c == Cluster(mgmtd=("127.0.0.1:1",), meta=("127.0.0.1:2", "127.0.0.1:3"), coord=("127.0.0.1:4",),
                        ckpt=("127.0.0.1:5",), nats="nats://127.0.0.1:7", token="fft_user", state_dir=str(root))
    assert find_cluster(root, env={}, role="admin").token == "fft_admin"
    assert c.first("meta") == "127.0.0.1:2" and c.first("sched") is None
    assert c.env() == {"FF_MGMTD_ADDR": "127.0.0.1:1", "FF_META_ADDR": "127.0.0.1:2,127.0.0.1:3",
                       "FF_COORD_ADDR": "127.0.0.1:4", "FF_CKPT_ADDR": "127.0.0.1:5",
                       "FF_NATS_URL": "nats://127.0.0.1:7", "FF_TOKEN": "fft_user", "FF_STATE_DIR": str(root)}


def test_ff_state_dir_then_dot_ff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = fake_cluster(tmp_path / "a", procs=[_proc("meta", "10.0.0.1:1")])
    fake_cluster(tmp_path / ".ff", procs=[_proc("meta", "10.0.0.2:1")])
    monkeypatch.chdir(tmp_path)
    assert find_cluster(env={"FF_STATE_DIR": str(a)}).meta == ("10.0.0.1:1",)
    assert find_cluster(env={}).meta == ("10.0.0.2:1",)  # ./.ff
    # an explicit state dir beats FF_STATE_DIR
    assert find_cluster(tmp_path / ".ff", env={"FF_STATE_DIR": str(a)}).meta == ("10.0.0.2:1",)
    assert state_dir_of(None, {}) == tmp_path / ".ff"


def test_env_beats_the_state_dir_and_arguments_beat_env(tmp_path: Path) -> None:
    root = fake_cluster(tmp_path / "c")
    env = {"FF_STATE_DIR": str(root), "FF_META_ADDR": "env:1, env:2", "FF_CKPT_ADDR": "env:3", "FF_TOKEN": "envtok"}
    c = find_cluster(env=env)
    assert c.meta == ("env:1", "env:2") and c.ckpt == ("env:3",) and c.token == "envtok"
    assert c.mgmtd == ("127.0.0.1:1",)  # what the environment does not name still comes from the cluster
    c = find_cluster(env=env, meta="arg:1", ckpt=["arg:2", "arg:3"], token="argtok")
    assert c.meta == ("arg:1",) and c.ckpt == ("arg:2", "arg:3") and c.token == "argtok"
    assert find_cluster(env=env, token="").token == ""  # an explicit "no token"
    # an empty variable counts as unset
    assert find_cluster(env={**env, "FF_TOKEN": "", "FF_META_ADDR": ""}).token == "fft_user"


def test_everything_from_env_does_not_read_the_state_dir(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "cluster.json").write_text("{not json")
    env = {"FF_STATE_DIR": str(bad), **{f"FF_{s}_ADDR": "x:1" for s in ("MGMTD", "META", "COORD", "CKPT", "SCHED", "HEALTH")},
           "FF_NATS_URL": "nats://x:2", "FF_TOKEN": "t"}
    c = find_cluster(env=env, need=("meta", "token"))
    assert c.state_dir is None and c.token == "t"
    with pytest.raises(FailedPrecondition, match="unreadable"):
        find_cluster(env={"FF_STATE_DIR": str(bad)})


def test_no_cluster_is_one_message_saying_how_to_point_at_one(tmp_path: Path) -> None:
    with pytest.raises(NoClusterFound) as ei:
        find_cluster(tmp_path / "nothing", env={}, need=("ckpt",))
    e = ei.value
    assert isinstance(e, FailedPrecondition) and e.code == "FAILED_PRECONDITION"
    assert str(e).startswith("no Fire-Flyer cluster found") and NO_CLUSTER_HELP in str(e)
    assert "FF_CKPT_ADDR" in str(e) and str(tmp_path / "nothing") in str(e)
    assert e.missing == "ckpt" and e.state_dir == str(tmp_path / "nothing")
    # without need, nothing is raised: the caller gets what there is
    assert find_cluster(tmp_path / "nothing", env={}) == Cluster()


def test_a_cluster_without_the_service_or_the_role_says_so(tmp_path: Path) -> None:
    root = fake_cluster(tmp_path / "c", procs=[_proc("meta", "127.0.0.1:2")], user=False)
    with pytest.raises(NoClusterFound, match="runs no ckpt") as ei:
        find_cluster(root, env={}, need=("ckpt",))
    assert NO_CLUSTER_HELP in str(ei.value)
    with pytest.raises(NoClusterFound, match="no user token") as ei:
        find_cluster(root, env={}, need=("meta", "token"))
    assert "FF_TOKEN" in str(ei.value)
    with pytest.raises(ValueError, match="unknown need"):
        find_cluster(root, env={}, need=("metta",))


def test_live_only_skips_processes_that_are_gone(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    root = fake_cluster(tmp_path / "c", procs=[_proc("meta", "127.0.0.1:2"), _proc("mgmtd", "127.0.0.1:1",
                                                                                 pid=dead.pid)])
    assert find_cluster(root, env={}).mgmtd == ("127.0.0.1:1",)
    c = find_cluster(root, env={}, live_only=True)
    assert c.mgmtd == () and c.meta == ("127.0.0.1:2",)


def test_clients_fail_with_the_no_cluster_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FF_MGMTD_ADDR", "FF_META_ADDR", "FF_CKPT_ADDR", "FF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FF_STATE_DIR", str(tmp_path / "none"))
    from fireflyer.ckpt.client import CheckpointClient
    from fireflyer.ckpt.manager import CheckpointManager
    from fireflyer.fs import connect

    for make in (CheckpointClient, lambda: CheckpointManager("job"), connect):
        with pytest.raises(NoClusterFound, match="no Fire-Flyer cluster found"):
            make()


def test_cli_commands_share_the_options_and_the_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from fireflyer.cli.main import main

    for var in ("FF_MGMTD_ADDR", "FF_META_ADDR", "FF_CKPT_ADDR", "FF_COORD_ADDR", "FF_TOKEN", "FF_STATE_DIR"):
        monkeypatch.delenv(var, raising=False)
    none = str(tmp_path / "none")
    for argv in (["fs", "ls", "--state-dir", none, "/"], ["ckpt", "--state-dir", none, "jobs"],
                 ["coord", "--state-dir", none, "comms"], ["admin", "--state-dir", none, "nodes"]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert "no Fire-Flyer cluster found" in err and "--state-dir DIR" in err, (argv, err)
