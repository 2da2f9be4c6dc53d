"""State-dir files: cluster.json round trip, atomic writes, tokens, the lock; process helpers."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fireflyer.cluster import procs
from fireflyer.cluster.decisions import StopOutcome, StopTarget
from fireflyer.cluster.procs import alive, free_ports, observe, read_tail, spawn, stop_processes
from fireflyer.cluster.records import (
    ClusterRecord,
    NatsRecord,
    StatePaths,
    ensure_tokens,
    read_record,
    read_tokens,
    remove_record,
    state_lock,
    write_record,
)
from fireflyer.core.errors import FailedPrecondition, SettingsError


def test_record_round_trip_and_remove(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    assert read_record(paths) is None
    rec = ClusterRecord(state_dir=str(tmp_path), config="c", started_at=1.0,
                        nats=NatsRecord(url="nats://x:1", managed=False), processes=[],
                        tokens_file="t", spans_file="s")
    write_record(paths, rec)
    assert read_record(paths) == rec
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    remove_record(paths)
    remove_record(paths)  # idempotent
    assert read_record(paths) is None


def test_corrupt_record_says_what_to_do(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    paths.record.write_text("{not json")
    with pytest.raises(FailedPrecondition, match="cluster.json"):
        read_record(paths)


def test_tokens_written_0600_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    first = ensure_tokens(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    admin, user = first.for_role("admin"), first.for_role("user")
    assert admin and user and admin.user == "admin" and admin.token != user.token
    assert ensure_tokens(path) == first  # clients may hold them: not rotated by a second up
    assert read_tokens(path) == first


def test_invalid_tokens_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text('{"tokens": []}')
    assert ensure_tokens(path).for_role("admin") is not None
    path.write_text("garbage")
    with pytest.raises(SettingsError):
        read_tokens(path)


def test_lock_excludes_a_second_holder(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path / "state")
    with state_lock(paths, what="ff up"):
        # flock is per open file description: a second open in this process conflicts too
        with pytest.raises(FailedPrecondition, match="another ff up/down"), state_lock(paths, what="ff down"):
            pass
    with state_lock(paths, what="ff down"):
        pass


def test_observe_self_and_missing() -> None:
    me = observe(os.getpid())
    assert me is not None and not me.zombie
    assert alive(os.getpid(), me.start_ticks)
    assert not alive(os.getpid(), (me.start_ticks or 0) + 1)  # same pid, other start time: not ours
    assert not alive(None, None)


def test_stop_processes_term_then_kill(tmp_path: Path) -> None:
    polite = spawn([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                   env=os.environ, cwd=tmp_path, log_path=tmp_path / "polite.log")
    # ignores SIGTERM: must be killed after the timeout
    stubborn = spawn([sys.executable, "-c",
                      "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "print('ready', flush=True); time.sleep(60)"],
                     env=os.environ, cwd=tmp_path, log_path=tmp_path / "stubborn.log")
    from fireflyer.testing.poll import wait_until

    wait_until(lambda: read_tail(tmp_path / "stubborn.log") == ["ready"], timeout_s=10, what="handler installed")
    targets = [StopTarget(name, p.pid, observe(p.pid).start_ticks)  # type: ignore[union-attr]
               for name, p in (("polite", polite), ("stubborn", stubborn))]
    out = stop_processes(targets, timeout_s=0.5, children=[polite, stubborn])
    assert out == {"polite": StopOutcome.STOPPED, "stubborn": StopOutcome.KILLED}
    assert polite.wait(5) == -15 and stubborn.wait(5) == -9


def test_stop_never_signals_a_recycled_pid(tmp_path: Path) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        seen = observe(victim.pid)
        assert seen is not None and seen.start_ticks is not None
        # a record for this pid from an older process (other start time)
        out = stop_processes([StopTarget("old", victim.pid, seen.start_ticks - 1)], timeout_s=0.1)
        assert out == {"old": StopOutcome.STOPPED}  # "gone" as far as the record goes
        assert victim.poll() is None  # and never signalled
    finally:
        victim.kill()
        victim.wait()


def test_spawn_keeps_previous_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    for text in ("one", "two"):
        p = spawn([sys.executable, "-c", f"print({text!r})"], env=os.environ, cwd=tmp_path, log_path=log)
        assert p.wait(10) == 0
    assert read_tail(log) == ["two"] and read_tail(tmp_path / "x.log.1") == ["one"]
    assert read_tail(tmp_path / "missing.log") == []


def test_free_ports_distinct() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5 and all(p > 0 for p in ports)


def test_free_ports_come_from_below_the_ephemeral_range() -> None:
    """Outgoing connections take their local ports from the ephemeral range; a port picked there
    for a server that binds it a moment later can be handed to one of them meanwhile."""
    lo, _ = procs.ephemeral_port_range()
    if lo - procs.PORT_FLOOR < 64 * 8:
        pytest.fail(f"this machine's ephemeral range starts at {lo}: no room below it to test")
    for host in ("127.0.0.1", "0.0.0.0"):
        ports = free_ports(8, host)
        assert len(set(ports)) == 8 and all(procs.PORT_FLOOR <= p < lo for p in ports), ports


def test_free_ports_skip_a_busy_port_and_fall_back_to_the_kernels_pick(monkeypatch) -> None:
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        # the only candidate below the range is busy, and there is room for no more: the kernel picks
        monkeypatch.setattr(procs, "PORT_FLOOR", port)
        monkeypatch.setattr(procs, "ephemeral_port_range", lambda: (port + 64, 60999))
        monkeypatch.setattr(procs.random, "sample", lambda pop, k: [port])
        got = free_ports(1)
        assert got != [port] and got[0] > 0
        # no room below the range at all
        monkeypatch.setattr(procs, "ephemeral_port_range", lambda: (port + 1, 60999))
        assert free_ports(2)[0] != port
    finally:
        busy.close()


def test_ephemeral_port_range_defaults_without_proc(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(procs, "_PORT_RANGE_FILE", str(tmp_path / "missing"))
    assert procs.ephemeral_port_range() == (32768, 60999)
    (tmp_path / "r").write_text("40000\t50000\n")
    monkeypatch.setattr(procs, "_PORT_RANGE_FILE", str(tmp_path / "r"))
    assert procs.ephemeral_port_range() == (40000, 50000)
