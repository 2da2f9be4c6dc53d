"""The managed NATS keeps its port for the life of the state dir, and a restarted one is recognised."""

from __future__ import annotations

import socket
from pathlib import Path

from fireflyer.cluster.decisions import choose_nats_port, is_nats_on_port, nats_status_row
from fireflyer.cluster.records import StatePaths, read_nats_port, write_nats_port
from fireflyer.cluster.supervisor import nats_port_for


def test_choose_keeps_the_recorded_port_while_it_is_free() -> None:
    assert choose_nats_port(configured=0, recorded=None, recorded_free=False) == 0  # first up: pick one
    assert choose_nats_port(configured=0, recorded=24222, recorded_free=True) == 24222
    assert choose_nats_port(configured=0, recorded=24222, recorded_free=False) == 0  # taken by someone else
    assert choose_nats_port(configured=4333, recorded=24222, recorded_free=True) == 4333  # the cluster file wins


def test_a_nats_server_is_recognised_by_its_port_flag() -> None:
    binary = "/venv/bin/nats-server"
    assert is_nats_on_port([binary, "-a", "127.0.0.1", "-p", "24222", "-js"], 24222)
    assert is_nats_on_port(["nats-server", "--port=24222"], 24222)
    assert is_nats_on_port(["nats-server", "-port", "24222"], 24222)
    assert not is_nats_on_port([binary, "-p", "24223"], 24222)
    assert not is_nats_on_port([binary, "-a", "24222"], 24222)  # a port number as another flag's value
    assert not is_nats_on_port(["python", "-m", "x", "-p", "24222"], 24222)
    assert not is_nats_on_port([], 24222)


def test_port_is_picked_once_and_kept_for_the_state_dir(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path / "state")
    first = nats_port_for(paths)
    assert read_nats_port(paths) == first and 0 < first < 65536
    assert nats_port_for(paths) == first  # every later `ff up` (and restart) uses it again
    assert nats_port_for(StatePaths(tmp_path / "state")) == first


def test_port_moves_only_when_something_else_holds_it(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path / "state")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        write_nats_port(paths, taken)
        moved = nats_port_for(paths)
    assert moved != taken
    assert read_nats_port(paths) == moved  # recorded: the new one is kept from now on


def test_configured_port_wins_and_an_unreadable_record_is_replaced(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path / "state")
    paths.root.mkdir(parents=True)
    paths.nats_port.write_text("not a port\n")
    assert read_nats_port(paths) is None
    picked = nats_port_for(paths)
    assert read_nats_port(paths) == picked
    assert nats_port_for(paths, configured=4333) == 4333


def test_a_crashed_managed_nats_row_says_how_to_restart_it() -> None:
    cmd = ["/venv/bin/nats-server", "-a", "127.0.0.1", "-p", "24222", "-P", "/s/nats.pid"]
    row = nats_status_row(url="nats://127.0.0.1:24222", managed=True, pid=7, log="/s/logs/nats.log", alive=False,
                          reachable=False, command=cmd)
    assert row.state == "crashed" and row.restart_command == cmd
    running = nats_status_row(url="nats://127.0.0.1:24222", managed=True, pid=8, log=None, alive=True,
                              reachable=True, command=cmd)
    assert running.healthy and running.restart_command == []
