"""NatsServerProcess against the real binary: free ports, restarts, crashes, detach."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from fireflyer.bus import NatsServerProcess
from fireflyer.core.errors import FailedPrecondition, Unavailable
from fireflyer.testing.poll import wait_until


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            return s.recv(5) == b"INFO "
    except OSError:
        return False


def test_fixture_server_listens_on_the_port_read_back(nats_server: NatsServerProcess) -> None:
    assert nats_server.is_running()
    assert nats_server.port > 0
    assert nats_server.url == f"nats://127.0.0.1:{nats_server.port}"
    assert accepts(nats_server.port)
    assert (nats_server.store_dir / "jetstream").is_dir()


def test_two_servers_get_different_ports(tmp_path: Path) -> None:
    with NatsServerProcess(store_dir=tmp_path / "a") as a, NatsServerProcess(store_dir=tmp_path / "b") as b:
        assert a.port != b.port
        with pytest.raises(FailedPrecondition, match="already running"):
            a.start()


def test_restart_keeps_port_and_kill_is_a_crash(tmp_path: Path) -> None:
    srv = NatsServerProcess(store_dir=tmp_path / "n")
    srv.start()
    port, pid = srv.port, srv.pid
    srv.restart()
    assert srv.port == port and srv.pid != pid and accepts(port)
    srv.kill()
    assert not srv.is_running() and not accepts(port)
    srv.start()  # after a crash it comes back on the same port
    assert srv.port == port
    srv.stop()
    assert not srv.is_running()


def test_a_server_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    with NatsServerProcess(store_dir=tmp_path / "a") as a:
        clash = NatsServerProcess(store_dir=tmp_path / "b", port=a.port)
        with pytest.raises(Unavailable, match="log tail") as ei:
            clash.start(timeout_s=10)
        assert "address already in use" in str(ei.value)
        assert not clash.is_running()


def test_detached_server_outlives_its_handle_and_can_be_attached(tmp_path: Path) -> None:
    srv = NatsServerProcess(store_dir=tmp_path / "n", detach=True)
    srv.start()
    try:
        assert srv.pid is not None
        assert os.getsid(srv.pid) == srv.pid, "own session: a terminal's SIGINT does not reach it"
        again = NatsServerProcess.attach(pid=srv.pid, port=srv.port, store_dir=srv.store_dir)
        assert again.is_running() and again.url == srv.url
        again.stop()
        wait_until(lambda: not srv.is_running(), timeout_s=5, what="detached server stopped")
    finally:
        if srv.is_running() and srv.pid is not None:
            os.kill(srv.pid, signal.SIGKILL)
        srv.kill()
